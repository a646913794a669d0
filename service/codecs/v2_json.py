"""V2 JSON tensors (`{"name", "shape", "datatype", "data"}`) <-> numpy arrays.

The element rules are the v1 JSON tensor's (codecs/json_tensor.py: `decode_values`): BYTES are UTF-8 strings,
non-finite floats the strings "NaN"/"Infinity"/"-Infinity", complex elements [re, im] pairs,
integers out of range refused. Only the names differ.
"""

from typing import Any

import numpy as np

from service.codecs.dtypes import element_type_of
from service.codecs.json_encode import check_texts, json_data, json_data_chunks
from service.codecs.json_tensor import decode_values
from service.codecs.limits import Limits
from service.codecs.v2_types import datatype_of_onnx_name, from_datatype
from service.codecs.wire import Streamed, streams


def decode_v2_json(datatype: str, shape: list[int], data: Any, limits: Limits) -> np.ndarray:
    """The array of a V2 JSON tensor; `data` flat or nested to match `shape`."""
    return decode_values(from_datatype(datatype), shape, data, limits)


def encode_v2_json(name: str, array: np.ndarray, stream: bool = False) -> dict[str, Any]:
    """The V2 JSON output of an array; `data` is flat and may be a numpy array for orjson.
    With `stream`, a large array's data is a Streamed value (its text made chunk by chunk as
    it is sent: no encoding holds the GIL for long)."""
    et = element_type_of(array)
    if stream and streams(et, array.nbytes, "v2_json"):
        if et.kind == "O":
            check_texts(array)  # a refusal once the answer has started could not be sent
        data: Any = Streamed(json_data_chunks(array, et))
    else:
        data = json_data(array, et)
    return {"name": name, "datatype": datatype_of_onnx_name(et.name),
            "shape": list(array.shape), "data": data}  # fmt: skip
