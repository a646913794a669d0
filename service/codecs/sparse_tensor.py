"""Sparse tensors (JSON parts or base64 SparseTensorProto) -> values, indices and dims."""

from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

import numpy as np
import pybase64
from google.protobuf.message import DecodeError
from onnx import SparseTensorProto

from api_schemas.tensors import SparseJsonTensor, SparseProtoTensor
from service.codecs.limits import Limits
from service.codecs.tensor_proto import tensor_to_array
from service.codecs.wire import decode_tensor
from service.errors import InvalidInput, ServiceError, at

T = TypeVar("T")


@dataclass(frozen=True)
class SparseArray:
    """COO sparse tensor: `values` [NNZ], `indices` [NNZ] linear or [NNZ, rank]."""

    values: np.ndarray
    indices: np.ndarray
    dims: tuple[int, ...]


def decode_sparse(wire: SparseJsonTensor | SparseProtoTensor, limits: Limits) -> SparseArray:
    """Decode either sparse form; the dense size is checked later, by the kernel's budget."""
    if isinstance(wire, SparseProtoTensor):
        return _from_proto(wire.sparse_tensor_proto, limits)
    values = at_loc(lambda: decode_tensor(wire.values, limits), "values")
    indices = at_loc(lambda: decode_tensor(wire.indices, limits), "indices")
    return SparseArray(values, indices, tuple(wire.dims))


def _from_proto(payload: str, limits: Limits) -> SparseArray:
    try:
        proto = SparseTensorProto()
        proto.ParseFromString(pybase64.b64decode(payload, validate=True))
    except (ValueError, DecodeError, RuntimeError) as exc:
        raise InvalidInput(f"not base64 of a serialized onnx.SparseTensorProto: {exc}",
                           loc=("sparse_tensor_proto",)) from None  # fmt: skip
    values = at_loc(lambda: tensor_to_array(proto.values, limits), "values")
    indices = at_loc(lambda: tensor_to_array(proto.indices, limits), "indices")
    return SparseArray(values, indices, tuple(proto.dims))


def at_loc(decode: Callable[[], T], field: str) -> T:
    try:
        return decode()
    except ServiceError as exc:
        raise at(exc, field) from exc
