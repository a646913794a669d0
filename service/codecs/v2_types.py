"""V2 datatype names <-> ONNX element types (a name layer over codecs/dtypes.py).

The protocol names BOOL .. FP64 and BYTES, Triton adds BF16; neither names the float8,
float4, 4-bit, 2-bit or complex types, so those get extension names of ours (docs/v2.md).
"""

from api_schemas.v2 import EXTENSION_DATATYPES, V2_DATATYPES
from service.codecs.dtypes import ElementType, element_type
from service.errors import InvalidInput

_ONNX_NAMES = {
    "BOOL": "bool", "UINT8": "uint8", "UINT16": "uint16", "UINT32": "uint32",
    "UINT64": "uint64", "INT8": "int8", "INT16": "int16", "INT32": "int32", "INT64": "int64",
    "FP16": "float16", "FP32": "float", "FP64": "double", "BYTES": "string",
    "BF16": "bfloat16", "FP8_E4M3FN": "float8e4m3fn", "FP8_E4M3FNUZ": "float8e4m3fnuz",
    "FP8_E5M2": "float8e5m2", "FP8_E5M2FNUZ": "float8e5m2fnuz", "FP8_E8M0": "float8e8m0",
    "FP4_E2M1": "float4e2m1", "INT4": "int4", "UINT4": "uint4", "INT2": "int2", "UINT2": "uint2",
    "COMPLEX64": "complex64", "COMPLEX128": "complex128",
}  # fmt: skip

_BY_DATATYPE: dict[str, ElementType] = {v2: element_type(onnx) for v2, onnx in _ONNX_NAMES.items()}
_BY_ENUM: dict[int, str] = {et.enum: v2 for v2, et in _BY_DATATYPE.items()}
_BY_ONNX_NAME: dict[str, str] = {et.name: v2 for v2, et in _BY_DATATYPE.items()}
assert set(_BY_DATATYPE) == {*V2_DATATYPES, *EXTENSION_DATATYPES}


def from_datatype(datatype: str) -> ElementType:
    """The element type of a V2 datatype name (exact, upper case, as the protocol writes it)."""
    found = _BY_DATATYPE.get(datatype)
    if found is None:
        shown = repr(datatype[:40])
        raise InvalidInput(f"unknown datatype {shown}; expected one of {', '.join(_BY_DATATYPE)}")
    return found


def datatype_of(et: ElementType) -> str:
    """The V2 datatype name of an element type."""
    return _BY_ENUM[et.enum]


def datatype_of_onnx_name(name: str) -> str:
    """The V2 datatype name of a canonical ONNX type name (`float` -> `FP32`)."""
    return _BY_ONNX_NAME[name]
