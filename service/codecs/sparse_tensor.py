"""Sparse tensors (JSON parts or base64 SparseTensorProto) -> values, indices and dims."""

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
from service.errors import InvalidInput, located

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
    with located("values"):
        values = decode_tensor(wire.values, limits)
    with located("indices"):
        indices = decode_tensor(wire.indices, limits)
    return SparseArray(values, indices, tuple(wire.dims))


def _from_proto(payload: str, limits: Limits) -> SparseArray:
    try:
        proto = SparseTensorProto()
        proto.ParseFromString(pybase64.b64decode(payload, validate=True))
    except (ValueError, DecodeError, RuntimeError) as exc:
        raise InvalidInput(f"not base64 of a serialized onnx.SparseTensorProto: {exc}",
                           loc=("sparse_tensor_proto",)) from None  # fmt: skip
    with located("values"):
        values = tensor_to_array(proto.values, limits)
    with located("indices"):
        indices = tensor_to_array(proto.indices, limits)
    return SparseArray(values, indices, tuple(proto.dims))
