"""Tile: repeat the input along each axis. Version 1 is Caffe2's (tiles, axis); 6 and 13 take
`repeats`. The output is written in one pass: a broadcast view of the input copied once."""

import numpy as np

from api_schemas.operators.tile import NoAttributes, TileRequestV1, TileRequestV6
from service.errors import InvalidInput
from service.kernels.context import KernelContext
from service.operators.registry import kernel


def tile(array: np.ndarray, repeats: list[int], ctx: KernelContext) -> np.ndarray:
    """np.tile's result, written once into a fresh array after the size is checked."""
    out_shape = tuple(d * r for d, r in zip(array.shape, repeats, strict=True))
    ctx.reserve(out_shape, array.dtype)
    out = np.empty(out_shape, dtype=array.dtype)
    if out.size:
        # out viewed as (r0, d0, r1, d1, ...) is the input broadcast along every r axis.
        interleaved = tuple(x for pair in zip(repeats, array.shape, strict=True) for x in pair)
        spread = tuple(x for d in array.shape for x in (1, d))
        np.copyto(out.reshape(interleaved), np.broadcast_to(array.reshape(spread), interleaved))
    return out


@kernel("Tile", since=6, attributes=NoAttributes, request=TileRequestV6)
def tile_v6(input: np.ndarray, repeats: np.ndarray, *, ctx: KernelContext) -> tuple[np.ndarray]:
    if repeats.ndim != 1 or repeats.size != input.ndim:
        raise InvalidInput(
            f"repeats must be 1-D with one value per input axis ({input.ndim}), "
            f"got shape {list(repeats.shape)}",
            loc=("inputs", "repeats"),
        )
    counts = repeats.tolist()
    if any(r < 0 for r in counts):
        raise InvalidInput(f"repeats must not be negative, got {counts}", loc=("inputs", "repeats"))
    return (tile(input, counts, ctx),)


@kernel("Tile", since=1, attributes=NoAttributes, request=TileRequestV1,
        extra_input_types={"tiles": ("int64",), "axis": ("int64",)})  # fmt: skip
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
    return (tile(input, repeats, ctx),)


def _scalar_int(array: np.ndarray, name: str) -> int:
    if array.size != 1:
        raise InvalidInput(f"{name} must be a scalar, got shape {list(array.shape)}",
                           loc=("inputs", name))  # fmt: skip
    value = array.reshape(()).item()
    if not float(value).is_integer():
        raise InvalidInput(f"{name} must be a whole number, got {value}", loc=("inputs", name))
    return int(value)
