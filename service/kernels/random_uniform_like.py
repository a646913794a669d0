"""RandomUniformLike: values drawn uniformly from [low, high), shaped like the input.

Seeding rule: a seed's float32 bit pattern seeds numpy's SeedSequence -> PCG64, and each
element is (raw 64-bit draw >> 11) * 2**-53, mapped to low + (high - low) * u in double
precision, then rounded to the output type. A value that rounds to `high` or above becomes
the largest value of the type below `high`; one that rounds below `low` becomes the smallest
value of the type at or above `low`. PCG64, SeedSequence and this mapping are fixed
algorithms, so a seed gives the same bits on every replica, platform and numpy version.
Without a seed each call draws fresh entropy from the OS.
"""

import numpy as np

from service.codecs.dtypes import ElementType, element_type, element_type_of
from service.errors import InvalidInput, located
from service.kernels.context import KernelContext
from service.kernels.registrations import kernel

# The output types of every version together; run() then holds each version to its own list.
_FLOATS = ("float16", "bfloat16", "float", "double")
# Draws are made in blocks, so the 8-byte intermediates stay small next to a narrow output;
# PCG64 draws are sequential, so blocks give the same stream as one call.
_BLOCK = 1 << 16


@kernel("RandomUniformLike", since=1)
def random_uniform_like_v1(
    input: np.ndarray,
    *,
    ctx: KernelContext,
    dtype: int | str | None = None,
    high: float = 1.0,
    low: float = 0.0,
    seed: float | None = None,
) -> tuple[np.ndarray]:
    out_type = _output_type(input, dtype)
    chosen_by = ("attributes", "dtype") if dtype is not None else ("inputs", "input")
    ctx.check_output_type(out_type.np_dtype, chosen_by)  # e.g. bfloat16 only from version 22
    low, high = float(np.float32(low)), float(np.float32(high))  # FLOAT attributes are float32
    if not (np.isfinite(low) and np.isfinite(high) and low < high):
        raise InvalidInput(f"low ({low}) and high ({high}) must be finite with low < high",
                           loc=("attributes", "low"))  # fmt: skip
    lowest, highest = _bounds(low, high, out_type)
    ctx.reserve(input.shape, out_type.np_dtype, loc=("inputs", "input"))
    out = np.empty(input.size, dtype=out_type.np_dtype)
    generator = _generator(seed)
    unit = np.empty(min(out.size, _BLOCK))
    for start in range(0, out.size, _BLOCK):
        block = out[start : start + _BLOCK]
        u = _unit(generator, unit[: block.size])
        u *= high - low
        u += low
        # Clipping in double to bounds the type holds exactly, then rounding, equals rounding
        # then clipping (rounding is monotonic), and is cheaper than float16 arithmetic.
        np.clip(u, lowest, highest, out=u)
        block[...] = u
    return (out.reshape(input.shape),)


def _generator(seed: float | None) -> np.random.PCG64:
    entropy = None if seed is None else int(np.float32(seed).view(np.uint32))
    return np.random.PCG64(np.random.SeedSequence(entropy))


def _unit(generator: np.random.PCG64, out: np.ndarray) -> np.ndarray:
    """Fill `out` with the next draws mapped to [0, 1)."""
    # random_raw is the bit generator's own stream, stable across numpy versions (unlike
    # Generator methods). After >> 11 a draw fits int64, whose conversion to double is fast.
    raw = generator.random_raw(out.size)
    raw >>= np.uint64(11)
    out[...] = raw.view(np.int64)
    out *= 2.0**-53
    return out


def _output_type(input: np.ndarray, dtype: int | str | None) -> ElementType:
    if dtype is None:
        if element_type_of(input).is_string:
            raise InvalidInput("a string input needs the dtype attribute",
                               loc=("attributes", "dtype"))  # fmt: skip
        out_type = element_type_of(input)
    else:
        with located("attributes", "dtype"):
            out_type = element_type(dtype)
    if out_type.name not in _FLOATS:
        raise InvalidInput(
            f"the output is real numbers: dtype must be one of {', '.join(_FLOATS)}, "
            f"not {out_type.name}" + (" (the input's type)" if dtype is None else ""),
            loc=("attributes", "dtype"),
        )
    return out_type


def _bounds(low: float, high: float, out_type: ElementType) -> tuple[float, float]:
    """The smallest value of the type >= low and the largest < high."""
    with np.errstate(over="ignore"):  # a bound beyond the type's range rounds to infinity
        lowest = np.array(low, dtype=out_type.np_dtype)
        highest = np.array(high, dtype=out_type.np_dtype)
    if float(lowest) < low:
        lowest = np.nextafter(lowest, np.array(np.inf, dtype=lowest.dtype))
    if float(highest) >= high:
        highest = np.nextafter(highest, np.array(-np.inf, dtype=highest.dtype))
    if lowest > highest:
        raise InvalidInput(f"no {out_type.name} value lies in [low, high) = [{low}, {high})",
                           loc=("attributes", "low"))  # fmt: skip
    return float(lowest), float(highest)
