"""Size bounds the codecs enforce before they allocate."""

from dataclasses import dataclass

from service.errors import InvalidInput, PayloadTooLarge


@dataclass(frozen=True)
class Limits:
    """The decoding bounds of one request, taken from the settings."""

    max_elements: int = 64 * 1024 * 1024
    max_string_bytes: int = 16 * 1024 * 1024
    max_rank: int = 64

    def check_shape(self, shape: tuple[int, ...] | list[int]) -> int:
        """Element count of `shape`, refused if any dim is negative or the count is too large."""
        if len(shape) > self.max_rank:
            raise InvalidInput(f"rank {len(shape)} exceeds the limit of {self.max_rank}")
        count = 1
        for dim in shape:
            if dim < 0:
                raise InvalidInput(f"negative dimension {dim} in shape {list(shape)}")
            count *= dim  # Python ints: no overflow before the comparison below
        if count > self.max_elements:
            raise PayloadTooLarge(
                f"shape {list(shape)} holds {count} elements, over the limit of {self.max_elements}"
            )
        return count
