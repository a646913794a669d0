"""What a kernel may know of its caller: the output budget."""

from dataclasses import dataclass

import numpy as np

from service.errors import InvalidInput, PayloadTooLarge

MAX_RANK = 64  # numpy's NPY_MAXDIMS: np.empty refuses more axes with a bare ValueError


class RunOffLoop(Exception):
    """Raised by `KernelContext.reserve` when an inline run would produce a large output.

    The caller runs the same (pure) kernel again on a worker thread, so large outputs
    never stall the event loop, while small requests skip the thread hop.
    """


@dataclass(frozen=True)
class KernelContext:
    """Per-call limits: the output byte budget, and how much may be produced inline."""

    max_output_bytes: int
    inline_bytes: int | None = None  # None: already off the event loop

    def reserve(
        self, shape: tuple[int, ...], dtype: np.dtype, what: str = "output", loc: tuple = ()
    ) -> None:
        """Refuse (413) an output over budget, or (422) of a rank numpy cannot hold, before
        it is allocated."""
        if len(shape) > MAX_RANK:
            raise InvalidInput(
                f"{what} would have rank {len(shape)}, over the limit of {MAX_RANK}", loc=loc
            )
        count = 1
        for dim in shape:
            count *= int(dim)
        dtype = np.dtype(dtype)
        nbytes = count * dtype.itemsize  # 8 for object (string) arrays: the pointers
        if nbytes > self.max_output_bytes:
            raise PayloadTooLarge(
                f"{what} of shape {list(shape)} and {dtype.name} would take "
                f"{nbytes} bytes, over the limit of {self.max_output_bytes}",
                loc=loc,
            )
        if self.inline_bytes is not None and nbytes > self.inline_bytes:
            raise RunOffLoop
