"""V2 JSON tensors (`{"name", "shape", "datatype", "data"}`) <-> numpy arrays.

The element rules are the v1 JSON tensor's (codecs/json_tensor.py: `decode_values`): BYTES are UTF-8 strings,
non-finite floats the strings "NaN"/"Infinity"/"-Infinity", complex elements [re, im] pairs,
integers out of range refused. Only the names differ.
"""

from typing import Any

import numpy as np

from service.codecs.json_encode import encode_json
from service.codecs.json_tensor import decode_values
from service.codecs.limits import Limits
from service.codecs.v2_types import datatype_of_onnx_name, from_datatype


def decode_v2_json(datatype: str, shape: list[int], data: Any, limits: Limits) -> np.ndarray:
    """The array of a V2 JSON tensor; `data` flat or nested to match `shape`."""
    return decode_values(from_datatype(datatype), shape, data, limits)


def encode_v2_json(name: str, array: np.ndarray) -> dict[str, Any]:
    """The V2 JSON output of an array; `data` is flat and may be a numpy array for orjson."""
    encoded = encode_json(array)
    return {"name": name, "datatype": datatype_of_onnx_name(encoded["dtype"]),
            "shape": encoded["shape"], "data": encoded["data"]}  # fmt: skip
