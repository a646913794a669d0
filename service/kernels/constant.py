"""Constant: output the tensor its one attribute holds. From version 11 the value may be
sparse; from 12 also a float, int or string (or a list of them)."""

from typing import Any

import numpy as np

from service.codecs.dtypes import string_bytes
from service.codecs.sparse_tensor import SparseArray
from service.errors import InvalidInput
from service.kernels.context import KernelContext
from service.kernels.registrations import kernel


@kernel("Constant", since=1)  # 11 and 12 add attributes, not behaviour: wire_models.py
def constant(
    *,
    ctx: KernelContext,
    value: np.ndarray | None = None,
    sparse_value: SparseArray | None = None,
    value_float: float | None = None,
    value_floats: list[float] | None = None,
    value_int: int | None = None,
    value_ints: list[int] | None = None,
    value_string: str | None = None,
    value_strings: list[str] | None = None,
) -> tuple[np.ndarray]:
    """The attribute models let exactly one of these through."""
    if value is not None:
        ctx.check_output_type(value.dtype, ("attributes", "value"))
        return (value,)
    if sparse_value is not None:
        ctx.check_output_type(sparse_value.values.dtype, ("attributes", "sparse_value"))
        return (densify(sparse_value, ctx),)
    if value_float is not None or value_floats is not None:
        floats = value_float if value_floats is None else value_floats
        return (_from_list(floats, np.float32, "value_float", ctx),)
    if value_int is not None or value_ints is not None:
        ints = value_int if value_ints is None else value_ints
        return (_from_list(ints, np.int64, "value_int", ctx),)
    strings = value_string if value_strings is None else value_strings
    return (_from_list(strings, np.dtype(object), "value_string", ctx),)


def _from_list(value: Any, dtype: Any, name: str, ctx: KernelContext) -> np.ndarray:
    """A scalar, or a 1-D tensor of a list, within the output budget (strings by their UTF-8)."""
    is_list = isinstance(value, list)
    items = value if is_list else [value]
    strings = sum(string_bytes(s) for s in items) if np.dtype(dtype).kind == "O" else 0
    loc = ("attributes", name + "s" if is_list else name)
    ctx.reserve((len(items),) if is_list else (), dtype, loc=loc, payload_bytes=strings)
    with np.errstate(over="ignore"):  # a FLOAT attribute past float32's range is infinity
        return np.array(value, dtype=dtype)


def densify(sparse: SparseArray, ctx: KernelContext) -> np.ndarray:
    """The dense tensor of a COO sparse tensor; bad or duplicate indices are refused."""
    loc = ("attributes", "sparse_value")
    values, dims = sparse.values, sparse.dims
    if values.ndim != 1:
        raise InvalidInput(f"values must be 1-D [NNZ], got shape {list(values.shape)}", loc=loc)
    # The budget first: once the dense size is bounded, index arithmetic cannot overflow.
    ctx.reserve(dims, values.dtype, "sparse_value's dense tensor", loc)
    linear = _linear_indices(sparse.indices, values.size, dims, loc)
    count = int(np.prod(dims, dtype=object))
    if linear.size and (linear.min() < 0 or linear.max() >= count):
        raise InvalidInput(f"an index is outside the dense shape {list(dims)}", loc=loc)
    if np.unique(linear).size != linear.size:
        raise InvalidInput("indices repeat a position", loc=loc)
    dense = np.zeros(count, dtype=values.dtype)
    if values.dtype == object:
        dense[:] = ""
    dense[linear] = values
    return dense.reshape(dims)


def _linear_indices(indices: np.ndarray, nnz: int, dims: tuple[int, ...], loc: tuple) -> np.ndarray:
    if indices.dtype != np.int64:
        raise InvalidInput(f"indices must be int64, got {indices.dtype.name}", loc=loc)
    if indices.shape == (nnz,):
        return indices
    if indices.shape == (nnz, len(dims)):
        if nnz and ((indices < 0).any() or (indices >= np.array(dims)).any()):
            raise InvalidInput(f"an index is outside the dense shape {list(dims)}", loc=loc)
        if not nnz or not dims:  # nothing to convert, or a scalar's only position 0
            return np.zeros(nnz, dtype=np.int64)
        return np.ravel_multi_index(indices.T, dims)
    raise InvalidInput(
        f"indices must be [NNZ] or [NNZ, rank] = [{nnz}] or [{nnz}, {len(dims)}], "
        f"got {list(indices.shape)}",
        loc=loc,
    )
