"""Size bounds the codecs enforce before they allocate."""

from dataclasses import dataclass
from typing import TYPE_CHECKING

from service.errors import InvalidInput, PayloadTooLarge, shown_int, shown_shape

if TYPE_CHECKING:
    from service.settings import Settings

SMALL_BYTES = 1024 * 1024
"""What the event loop handles whole: an output up to this size is made inline (core/offload),
encoded at once rather than streamed (codecs/wire) and answered in one piece (V2 binary data);
past it, work moves to a kernel thread and answers go out in chunks. One figure, so the three
agree on what "small" is."""


@dataclass(frozen=True)
class Limits:
    """The decoding bounds of one request, taken from the settings."""

    max_elements: int = 64 * 1024 * 1024
    max_string_bytes: int = 16 * 1024 * 1024
    max_rank: int = 64
    max_json_items: int = 1 << 20  # items a JSON body may hold (json_body_memory)

    @classmethod
    def of(cls, settings: "Settings") -> "Limits":
        """The limits the settings set (OPSERVE_MAX_ELEMENTS and the like)."""
        return cls(settings.max_elements, settings.max_string_bytes, settings.max_json_depth,
                   settings.max_json_items)  # fmt: skip

    def check_shape(self, shape: tuple[int, ...] | list[int]) -> int:
        """Element count of `shape`, refused if any dim is negative or the count is too large.

        The zero dimensions of an empty shape count as 1 here: numpy sizes an empty array
        by its other dimensions too, and refuses (2**62, 2**62, 0) as too big.
        """
        if len(shape) > self.max_rank:
            raise InvalidInput(f"rank {len(shape)} exceeds the limit of {self.max_rank}")
        count = span = 1
        for dim in shape:  # Python ints: no overflow before the comparison below
            if dim < 0:  # checked here, not by any() first: that doubled the cost
                raise InvalidInput(f"negative dimension in shape {shown_shape(shape)}")
            count *= dim
            span *= dim or 1
        if span > self.max_elements:
            held = f"{shown_int(span)} elements" + ("" if count == span else " (zeros as 1)")
            raise PayloadTooLarge(
                f"shape {shown_shape(shape)} holds {held}, over the limit of {self.max_elements}"
            )
        return count
