"""Either tensor form of the contract <-> numpy arrays."""

from typing import Any

import numpy as np

from api_schemas.requests import OutputFormat
from api_schemas.tensors import JsonTensor, ProtoTensor
from service.codecs.json_encode import encode_json
from service.codecs.json_tensor import decode_json
from service.codecs.limits import Limits
from service.codecs.tensor_proto import decode_tensor_proto, encode_tensor_proto
from service.errors import located


def decode_tensor(wire: JsonTensor | ProtoTensor, limits: Limits) -> np.ndarray:
    """The array of a tensor in either form."""
    if isinstance(wire, ProtoTensor):
        with located("tensor_proto"):
            return decode_tensor_proto(wire.tensor_proto, limits)
    return decode_json(wire, limits)


def encode_tensor(array: np.ndarray, output_format: OutputFormat) -> dict[str, Any]:
    """The wire form of an array: JSON (data may be a numpy array for orjson) or base64 proto."""
    if output_format == "tensor_proto":
        return {"tensor_proto": encode_tensor_proto(array)}
    return encode_json(array)
