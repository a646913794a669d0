"""numpy arrays -> JSON tensors: flat row-major data, canonical dtype names, non-finite floats
as "NaN"/"Infinity"/"-Infinity" strings and complex numbers as [re, im].

`data` is left as a numpy array wherever orjson can write it natively (OPT_SERIALIZE_NUMPY),
which is many times faster than Python lists; only arrays with non-finite values or strings
become lists.
"""

from typing import Any

import numpy as np

from service.codecs.dtypes import element_type_of


def encode_json(array: np.ndarray) -> dict[str, Any]:
    """The JSON form of an array; `data` is flat and may hold a numpy array for orjson."""
    et = element_type_of(array)
    # orjson serializes only C-contiguous arrays, and reshape(-1) keeps a reversed view
    # (a[::-1]) as it is; ascontiguousarray copies only when it must.
    flat = np.ascontiguousarray(array).reshape(-1)
    return {"dtype": et.name, "shape": list(array.shape), "data": _ENCODE[et.kind](flat)}


def _encode_floats(flat: np.ndarray) -> Any:
    if flat.dtype not in (np.float16, np.float32, np.float64):
        flat = flat.astype(np.float32)  # bfloat16, float8, float4: exact in float32
    finite = np.isfinite(flat)
    if finite.all():
        return flat
    out = flat.astype(object)
    out[np.isnan(flat)] = "NaN"
    out[np.isposinf(flat)] = "Infinity"
    out[np.isneginf(flat)] = "-Infinity"
    return out.tolist()


def _encode_ints(flat: np.ndarray) -> Any:
    if flat.dtype.kind not in "iub":  # int4, uint4, int2, uint2
        flat = flat.astype(np.int8)
    return flat


def _encode_complex(flat: np.ndarray) -> Any:
    pairs = flat.view(np.float32 if flat.dtype == np.complex64 else np.float64).reshape(-1, 2)
    return _encode_floats(pairs)


_ENCODE = {
    "b": lambda flat: flat,
    "i": _encode_ints,
    "f": _encode_floats,
    "c": _encode_complex,
    "O": lambda flat: flat.tolist(),
}
