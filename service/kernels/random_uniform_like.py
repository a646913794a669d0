"""RandomUniformLike: values drawn uniformly from [low, high), shaped like the input.

Seeding rule: a seed's float32 bit pattern seeds numpy's SeedSequence -> PCG64, and each
element is (raw 64-bit draw >> 11) * 2**-53, mapped to low + (high - low) * u in double
precision, then rounded to the output type. PCG64, SeedSequence and this mapping are fixed
algorithms, so a seed gives the same bits on every replica, platform and numpy version.
Without a seed each call draws fresh entropy from the OS.
"""

import numpy as np

from api_schemas.operators.random_uniform_like import (
    RandomUniformLikeAttrsV1,
    RandomUniformLikeRequestV1,
)
from service.codecs.dtypes import element_type, element_type_of
from service.errors import InvalidInput
from service.kernels.context import KernelContext
from service.operators.registry import kernel


@kernel("RandomUniformLike", since=1, attributes=RandomUniformLikeAttrsV1,
        request=RandomUniformLikeRequestV1)  # fmt: skip
def random_uniform_like_v1(
    input: np.ndarray,
    *,
    ctx: KernelContext,
    dtype: int | str | None = None,
    high: float = 1.0,
    low: float = 0.0,
    seed: float | None = None,
) -> tuple[np.ndarray]:
    if dtype is None and element_type_of(input).is_string:
        raise InvalidInput("a string input needs the dtype attribute", loc=("attributes", "dtype"))
    out_type = element_type(dtype) if dtype is not None else element_type_of(input)
    low, high = float(np.float32(low)), float(np.float32(high))  # FLOAT attributes are float32
    if not low < high:
        raise InvalidInput(f"low ({low}) must be less than high ({high})",
                           loc=("attributes", "low"))  # fmt: skip
    ctx.reserve(input.shape, out_type.np_dtype)
    u = uniform_unit(input.size, seed)
    values = (low + (high - low) * u).astype(out_type.np_dtype)
    # Rounding to a narrow type can land on `high` itself; keep the interval half-open.
    below_high = _largest_below(high, out_type.np_dtype)
    np.minimum(values, below_high, out=values, where=values >= high)
    return (values.reshape(input.shape),)


def uniform_unit(count: int, seed: float | None) -> np.ndarray:
    """`count` doubles in [0, 1): the seeding rule of this module."""
    entropy = None if seed is None else int(np.float32(seed).view(np.uint32))
    generator = np.random.PCG64(np.random.SeedSequence(entropy))
    raw = generator.random_raw(count)
    return (raw >> np.uint64(11)).astype(np.float64) * 2.0**-53


def _largest_below(high: float, dtype: np.dtype) -> np.ndarray:
    value = np.array(high, dtype=dtype)
    if float(value) < high:
        return value
    step = np.array(-1 if high > 0 else 1, dtype=np.int64)
    bits = value.view(f"u{value.itemsize}").astype(np.int64) + step
    if high == 0:  # just below zero is the smallest negative subnormal
        bits = np.array(1, dtype=np.int64) | (1 << (8 * value.itemsize - 1))
    return bits.astype(f"u{value.itemsize}").view(dtype)
