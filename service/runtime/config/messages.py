"""Triton's model configuration messages and the one table between its DataType and ONNX.

The messages are tritonclient's generated `model_config_pb2` (never copied by hand); every
other module imports them from here. The table is a name layer over codecs/v2_types.py: a
config's TYPE_X is the V2 datatype X, except TYPE_STRING, which V2 calls BYTES. ONNX element
types that Triton's DataType does not name (float8, float4, int4, int2, complex) have no entry.
"""

from typing import Any

from tritonclient.grpc import model_config_pb2 as pb

from api_schemas.v2 import V2_DATATYPES
from service.codecs.dtypes import ElementType
from service.codecs.v2_types import from_datatype

ModelConfig: Any = pb.ModelConfig
DataType: Any = pb.DataType
Control: Any = pb.ModelSequenceBatching.Control
InstanceGroup: Any = pb.ModelInstanceGroup
ModelInput: Any = pb.ModelInput

TYPE_INVALID = 0
_PROTOCOL = {d: ("TYPE_STRING" if d == "BYTES" else f"TYPE_{d}") for d in V2_DATATYPES}
_BY_TYPE: dict[int, ElementType] = {
    DataType.Value(type_name): from_datatype(d) for d, type_name in _PROTOCOL.items()
}
_BY_ELEMENT: dict[int, int] = {et.enum: data_type for data_type, et in _BY_TYPE.items()}
_PROTOCOL_BY_TYPE: dict[int, str] = {DataType.Value(t): d for d, t in _PROTOCOL.items()}


def element_of(data_type: int) -> ElementType | None:
    """The ONNX element type of a config DataType; None for TYPE_INVALID."""
    return _BY_TYPE.get(data_type)


def config_type_named(datatype: str) -> int:
    """The config DataType of a V2 datatype name (BYTES is TYPE_STRING)."""
    return int(DataType.Value(_PROTOCOL[datatype]))


def config_type_of(elem_type: int) -> int:
    """The config DataType of an ONNX element type enum; TYPE_INVALID when Triton has no name."""
    return _BY_ELEMENT.get(elem_type, TYPE_INVALID)


def type_name(data_type: int) -> str:
    """`TYPE_FP32`, as configs and Triton's load errors write it; the number for a value
    the enum does not name (proto3 enums are open: text format takes `data_type: 99`)."""
    try:
        return str(DataType.Name(data_type))
    except ValueError:
        return str(data_type)


def protocol_name(data_type: int) -> str:
    """The V2 datatype name (`FP32`, `BYTES`), or Triton's `<invalid>`."""
    return _PROTOCOL_BY_TYPE.get(data_type, "<invalid>")


def shown(name: str) -> str:
    """A name for a message, cut at 100 characters: names can come from a client."""
    return name if len(name) <= 100 else name[:100] + "..."


def dims_text(dims: Any) -> str:
    """Triton's ShapeToString: `[-1,16]`, no spaces."""
    return "[" + ",".join(str(int(d)) for d in dims) + "]"
