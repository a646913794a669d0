"""V2 JSON tensors (`{"name", "shape", "datatype", "data"}`) <-> numpy arrays.

The element rules are the v1 JSON tensor's (codecs/json_tensor.py): BYTES are UTF-8 strings,
non-finite floats the strings "NaN"/"Infinity"/"-Infinity", complex elements [re, im] pairs,
integers out of range refused. Only the names differ.
"""

from typing import Any

import numpy as np

from api_schemas.tensors import JsonTensor
from service.codecs.json_encode import encode_json
from service.codecs.json_tensor import decode_json
from service.codecs.limits import Limits
from service.codecs.v2_types import datatype_of_onnx_name, from_datatype


def decode_v2_json(datatype: str, shape: list[int], data: Any, limits: Limits) -> np.ndarray:
    """The array of a V2 JSON tensor; `data` flat or nested to match `shape`."""
    et = from_datatype(datatype)
    # Already validated by the V2 request model: construct skips a second validation.
    tensor = JsonTensor.model_construct(dtype=et.name, shape=shape, data=data)
    return decode_json(tensor, limits)


def encode_v2_json(name: str, array: np.ndarray) -> dict[str, Any]:
    """The V2 JSON output of an array; `data` is flat and may be a numpy array for orjson."""
    encoded = encode_json(array)
    return {"name": name, "datatype": datatype_of_onnx_name(encoded["dtype"]),
            "shape": encoded["shape"], "data": encoded["data"]}  # fmt: skip
