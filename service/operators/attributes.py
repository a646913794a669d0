"""Attribute models from the wire -> the keyword arguments a kernel takes."""

from typing import Any

from pydantic import BaseModel

from api_schemas.tensors import JsonTensor, ProtoTensor, SparseJsonTensor, SparseProtoTensor
from service.codecs.limits import Limits
from service.codecs.sparse_tensor import decode_sparse
from service.codecs.wire import decode_tensor
from service.errors import located


def kernel_attributes(attributes: BaseModel, limits: Limits) -> dict[str, Any]:
    """Every attribute of the model (defaults included), tensors decoded to arrays."""
    kwargs: dict[str, Any] = {}
    for name in type(attributes).model_fields:
        value = getattr(attributes, name)
        with located("attributes", name):
            if isinstance(value, JsonTensor | ProtoTensor):
                value = decode_tensor(value, limits)
            elif isinstance(value, SparseJsonTensor | SparseProtoTensor):
                value = decode_sparse(value, limits)
        kwargs[name] = value
    return kwargs
