"""Tile: repeat the input along each axis. Version 1 is Caffe2's (tiles, axis); 6 and 13 take
`repeats`. Every output byte is written once; see `tile` for how."""

import math

import numpy as np

from service.codecs.dtypes import string_bytes
from service.errors import InvalidInput
from service.kernels.context import KernelContext
from service.kernels.registrations import kernel

# Blocks at least this wide are copied well by one broadcast copy; narrower ones go through
# np.repeat, whose C loop copies small blocks several times faster (bench/bench_kernels.py).
_WIDE_BLOCK_BYTES = 4096
# Outputs up to this size are cheaper through one broadcast assignment (1.7 us for a 2x3 input
# tiled [2, 2], np.tile 2.3 us) than through planning the one-pass copy (8.7 us).
_SMALL_OUTPUT_BYTES = 16384


def tile(array: np.ndarray, repeats: list[int], ctx: KernelContext, loc: tuple) -> np.ndarray:
    """np.tile's result, computed after the output size is checked against the budget."""
    # the output's shape, and the (r0, d0, r1, d1, ...) and (1, d0, 1, d1, ...) shapes of a
    # broadcast copy, in one loop (three comprehensions cost a small call 1 us more)
    out_shape: list[int] = []
    interleaved: list[int] = []
    spread: list[int] = []
    for d, r in zip(array.shape, repeats, strict=True):
        out_shape.append(d * r)
        interleaved += (r, d)
        spread += (1, d)
    # Strings: the output repeats the input's text, which its pointers do not count.
    text = sum(string_bytes(s) for s in array.flat) if array.dtype.kind == "O" else 0
    ctx.reserve(out_shape, array.dtype, loc=loc,
                payload_bytes=text * math.prod(repeats) if text else 0)  # fmt: skip
    count = math.prod(out_shape)
    if count == 0:
        return np.empty(out_shape, array.dtype)
    if count * array.itemsize <= _SMALL_OUTPUT_BYTES:
        # np.tile's result in one broadcast assignment: out[r0, d0, r1, d1, ...] = a[d0, d1, ...]
        out = np.empty(interleaved, array.dtype)
        out[...] = array.reshape(spread)
        return out.reshape(out_shape)
    repeated = [axis for axis, r in enumerate(repeats) if r != 1]
    if not repeated:
        return array.copy()
    # Axes after the innermost repeated one are copied whole: merge them into one block.
    k = repeated[-1]
    dims = [*array.shape[:k], math.prod(array.shape[k:])]
    reps = [*repeats[:k], repeats[k]]
    source = array.reshape(dims)
    outer = math.prod(reps[:-1])
    if outer == 1:  # one repeated axis: each block repeated in place
        return _repeat_blocks(source, reps[-1]).reshape(out_shape)
    if dims[-1] * array.itemsize >= _WIDE_BLOCK_BYTES:
        if reps[0] > 1:
            return _copies_of_first(source, reps).reshape(out_shape)
        return _broadcast(source, reps).reshape(out_shape)
    # Narrow blocks, several repeated axes: two passes, the smaller intermediate first (at most
    # half the output, as both `outer` and the last repeat are >= 2 here).
    if reps[-1] >= outer:
        staged = _broadcast(source, [*reps[:-1], 1])
        return _repeat_blocks(staged, reps[-1]).reshape(out_shape)
    staged = _repeat_blocks(source, reps[-1])
    return _broadcast(staged, [*reps[:-1], 1]).reshape(out_shape)


def _repeat_blocks(array: np.ndarray, count: int) -> np.ndarray:
    """Each last-axis row of `array` repeated `count` times along that axis."""
    rows = array.reshape(-1, array.shape[-1])
    return np.repeat(rows, count, axis=0).reshape(*array.shape[:-1], count * array.shape[-1])


def _copies_of_first(array: np.ndarray, repeats: list[int]) -> np.ndarray:
    """np.tile with axis 0 repeated: the first copy along axis 0 by one broadcast copy, the
    others as whole contiguous blocks, doubling each time (memcpy speed: ~25% faster than one
    broadcast copy of everything for 64 MiB, bench/bench_kernels.py)."""
    out = np.empty([d * r for d, r in zip(array.shape, repeats, strict=True)], array.dtype)
    _broadcast(array, [1, *repeats[1:]], out=out[: array.shape[0]])
    blocks = out.reshape(repeats[0], -1)
    done = 1
    while done < repeats[0]:
        step = min(done, repeats[0] - done)
        blocks[done : done + step] = blocks[:step]
        done += step
    return out


def _broadcast(array: np.ndarray, repeats: list[int], out: np.ndarray | None = None) -> np.ndarray:
    """np.tile in one pass: the output viewed as (r0, d0, r1, d1, ...) is the input broadcast."""
    if out is None:
        out = np.empty([d * r for d, r in zip(array.shape, repeats, strict=True)], array.dtype)
    interleaved = tuple(x for pair in zip(repeats, array.shape, strict=True) for x in pair)
    spread = tuple(x for d in array.shape for x in (1, d))
    np.copyto(out.reshape(interleaved), np.broadcast_to(array.reshape(spread), interleaved))
    return out


@kernel("Tile", since=6)
def tile_v6(input: np.ndarray, repeats: np.ndarray, *, ctx: KernelContext) -> tuple[np.ndarray]:
    if repeats.ndim != 1 or repeats.size != input.ndim:
        raise InvalidInput(
            f"repeats must be 1-D with one value per input axis ({input.ndim}), "
            f"got shape {list(repeats.shape)}",
            loc=("inputs", "repeats"),
        )
    counts = repeats.tolist()
    if counts and min(counts) < 0:
        raise InvalidInput(f"repeats must not be negative, got {counts}", loc=("inputs", "repeats"))
    return (tile(input, counts, ctx, ("inputs", "repeats")),)


@kernel("Tile", since=1, extra_input_types={"tiles": ("int64",), "axis": ("int64",)})
def tile_v1(
    input: np.ndarray, tiles: np.ndarray, axis: np.ndarray, *, ctx: KernelContext
) -> tuple[np.ndarray]:
    count = _scalar_int(tiles, "tiles")
    dim = _scalar_int(axis, "axis")
    if count < 0:
        raise InvalidInput(f"tiles must not be negative, got {count}", loc=("inputs", "tiles"))
    if not -input.ndim <= dim < input.ndim:
        raise InvalidInput(f"axis {dim} is out of range for rank {input.ndim}",
                           loc=("inputs", "axis"))  # fmt: skip
    repeats = [1] * input.ndim
    repeats[dim] = count
    return (tile(input, repeats, ctx, ("inputs", "tiles")),)


def _scalar_int(array: np.ndarray, name: str) -> int:
    if array.size != 1:
        raise InvalidInput(f"{name} must be a scalar, got shape {list(array.shape)}",
                           loc=("inputs", name))  # fmt: skip
    value = array.reshape(()).item()
    if not float(value).is_integer():
        raise InvalidInput(f"{name} must be a whole number, got {value}", loc=("inputs", name))
    return int(value)
