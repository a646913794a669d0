"""ConstantOfShape: a tensor of the shape given by the input, filled with `value`."""

import numpy as np

from service.errors import InvalidInput
from service.kernels.context import KernelContext
from service.kernels.registrations import kernel

_DEFAULT = np.zeros(1, dtype=np.float32)  # the spec's default: float 0


@kernel("ConstantOfShape", since=9)
def constant_of_shape_v9(
    input: np.ndarray, *, ctx: KernelContext, value: np.ndarray | None = None
) -> tuple[np.ndarray]:
    if input.ndim != 1:
        raise InvalidInput(f"input must be a 1-D shape, got rank {input.ndim}",
                           loc=("inputs", "input"))  # fmt: skip
    dims = tuple(input.tolist())
    if any(d < 0 for d in dims):
        raise InvalidInput(f"shape {list(dims)} has a negative dimension", loc=("inputs", "input"))
    fill = _DEFAULT if value is None else value
    if fill.size != 1:
        raise InvalidInput(f"value must hold one element, got shape {list(fill.shape)}",
                           loc=("attributes", "value"))  # fmt: skip
    ctx.check_output_type(fill.dtype, ("attributes", "value"))  # before anything is allocated
    ctx.reserve(dims, fill.dtype, loc=("inputs", "input"))
    scalar = fill.reshape(())
    if fill.dtype != object and not fill.reshape(1).view(np.uint8).any():
        return (np.zeros(dims, dtype=fill.dtype),)  # all-zero bits: calloc'd, lazily zeroed pages
    out = np.empty(dims, dtype=fill.dtype)
    out.fill(scalar[()])
    return (out,)
