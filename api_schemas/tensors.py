"""The two tensor forms of the contract and the canonical element type names."""

from collections.abc import Callable
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Discriminator, Field, StrictInt, StrictStr, Tag

# The canonical names are the `tensor(...)` names of ONNX, i.e. the lower-cased
# TensorProto.DataType enum names, in enum order (1..26). The server maps them onto
# onnx's own dtype table; tests/test_dtypes.py proves the two agree.
DTYPE_NAMES: tuple[str, ...] = (
    "float", "uint8", "int8", "uint16", "int16", "int32", "int64", "string", "bool",
    "float16", "double", "uint32", "uint64", "complex64", "complex128", "bfloat16",
    "float8e4m3fn", "float8e4m3fnuz", "float8e5m2", "float8e5m2fnuz", "uint4", "int4",
    "float4e2m1", "float8e8m0", "uint2", "int2",
)  # fmt: skip

DType = Annotated[
    StrictStr | StrictInt,
    Field(
        description=(
            "Element type: a canonical ONNX name (" + ", ".join(DTYPE_NAMES) + "), a numpy "
            "name (float32, float64, ...), a TensorProto enum name (FLOAT, INT64, ...) or "
            "its enum number. Responses always carry the canonical name."
        ),
        examples=["float", "int64"],
    ),
]


class JsonTensor(BaseModel):
    """A tensor written out in JSON: element type, shape and row-major data."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={"examples": [{"dtype": "float", "shape": [2, 3],
                                         "data": [1, 2, 3, 4, 5, 6]}]},
    )  # fmt: skip

    dtype: DType
    shape: list[Annotated[StrictInt, Field(ge=0)]] | None = Field(
        default=None,
        description="Dimensions; [] is a scalar. When left out, the nesting of `data` gives it.",
        examples=[[2, 3]],
    )
    data: Any = Field(
        description=(
            'Row-major elements, flat or nested to match `shape`. Non-finite floats are "NaN", '
            '"Infinity" and "-Infinity"; complex elements are [re, im]; strings are UTF-8 text.'
        ),
        examples=[[1, 2, 3, 4, 5, 6]],
    )


class ProtoTensor(BaseModel):
    """A tensor as a base64-encoded serialized onnx.TensorProto (external data refused)."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={"examples": [{"tensor_proto": "CAIIAhABShAAAIA/AAAAQAAAQEAAAIBA"}]},
    )

    tensor_proto: str = Field(description="base64 of a serialized onnx.TensorProto")


def _form_by_key(key: str, proto: type[BaseModel]) -> Callable[[Any], str]:
    """A discriminator: the proto form when `key` is present (in a dict or as the model)."""

    def form(value: Any) -> str:
        if isinstance(value, dict):
            return "proto" if key in value else "json"
        return "proto" if isinstance(value, proto) else "json"

    return form


Tensor = Annotated[
    Annotated[JsonTensor, Tag("json")] | Annotated[ProtoTensor, Tag("proto")],
    Discriminator(_form_by_key("tensor_proto", ProtoTensor)),
]
"""A tensor in either form; a body with `tensor_proto` is the proto form."""


class SparseJsonTensor(BaseModel):
    """A sparse tensor: `values` [NNZ], `indices` [NNZ] (linear) or [NNZ, rank], dense `dims`."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={"examples": [{
            "values": {"dtype": "float", "shape": [2], "data": [1.5, -2]},
            "indices": {"dtype": "int64", "shape": [2], "data": [1, 4]},
            "dims": [2, 3],
        }]},
    )  # fmt: skip

    values: Tensor
    indices: Tensor
    dims: list[Annotated[StrictInt, Field(ge=0)]]  # as strict as JsonTensor.shape


class SparseProtoTensor(BaseModel):
    """A sparse tensor as base64 of a serialized onnx.SparseTensorProto."""

    model_config = ConfigDict(extra="forbid")

    sparse_tensor_proto: str = Field(description="base64 of a serialized onnx.SparseTensorProto")


SparseTensor = Annotated[
    Annotated[SparseJsonTensor, Tag("json")] | Annotated[SparseProtoTensor, Tag("proto")],
    Discriminator(_form_by_key("sparse_tensor_proto", SparseProtoTensor)),
]
"""A sparse tensor in either form."""
