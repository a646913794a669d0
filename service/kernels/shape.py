"""Shape: the dimensions of the input as int64; from version 15 a [start, end) slice of them."""

import numpy as np

from service.kernels.context import KernelContext
from service.kernels.registrations import kernel


@kernel("Shape", since=1)
def shape_v1(data: np.ndarray, *, ctx: KernelContext) -> tuple[np.ndarray]:
    return (np.array(data.shape, dtype=np.int64),)


@kernel("Shape", since=15)
def shape_v15(
    data: np.ndarray, *, ctx: KernelContext, start: int = 0, end: int | None = None
) -> tuple[np.ndarray]:
    # Python slicing is exactly ONNX's rule: negative axes count from the back, then both
    # ends are clamped to [0, rank], and start >= end gives an empty result.
    return (np.array(data.shape[start:end], dtype=np.int64),)
