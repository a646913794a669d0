"""KServe V2 / Open Inference Protocol bodies, with Triton's binary tensor data extension.

Field names and shapes follow the protocol (and what `tritonclient.http` sends and reads);
the few additions (`datatypes`, `optional`, `attributes` in model metadata) are extension
fields a V2 client ignores. See docs/v2.md.
"""

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictFloat, StrictInt, StrictStr

Parameter = StrictBool | StrictInt | StrictFloat | StrictStr
"""A V2 parameter value: bool, int64, double or string (lists travel as JSON-array strings)."""

Parameters = dict[str, Parameter]

V2_DATATYPES: tuple[str, ...] = (
    "BOOL", "UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64",
    "FP16", "FP32", "FP64", "BYTES", "BF16",
)  # fmt: skip
"""The datatypes the protocol (and Triton, for BF16) names."""

EXTENSION_DATATYPES: tuple[str, ...] = (
    "FP8_E4M3FN", "FP8_E4M3FNUZ", "FP8_E5M2", "FP8_E5M2FNUZ", "FP8_E8M0", "FP4_E2M1",
    "INT4", "UINT4", "INT2", "UINT2", "COMPLEX64", "COMPLEX128",
)  # fmt: skip
"""Our names for the ONNX element types V2 and Triton have no name for."""

Shape = list[Annotated[StrictInt, Field(ge=0)]]


class RequestInput(BaseModel):
    """One input tensor: `data` in JSON, or `parameters.binary_data_size` bytes after the header."""

    model_config = ConfigDict(extra="forbid")

    name: StrictStr = Field(examples=["input"])
    shape: Shape = Field(examples=[[2, 3]])
    datatype: StrictStr = Field(examples=["FP32"])
    parameters: Parameters | None = None
    data: Any = Field(default=None, description="Row-major elements, flat or nested; absent "
                      "when the tensor travels as binary data", examples=[[1, 2, 3, 4, 5, 6]])  # fmt: skip


class RequestOutput(BaseModel):
    """An output to return; `parameters.binary_data` asks for it as binary data."""

    model_config = ConfigDict(extra="forbid")

    name: StrictStr = Field(examples=["output"])
    parameters: Parameters | None = None


class InferenceRequest(BaseModel):
    """`POST /v2/models/{name}[/versions/{v}]/infer`: the JSON part of the body. Fields it does
    not know are ignored, as Triton and KServe's server do (the KServe SDK sends `model_name`)."""

    model_config = ConfigDict(extra="ignore", json_schema_extra={"examples": [{
        "id": "42",
        "inputs": [
            {"name": "input", "shape": [2, 3], "datatype": "FP32", "data": [1, 2, 3, 4, 5, 6]},
            {"name": "repeats", "shape": [2], "datatype": "INT64", "data": [2, 2]},
        ],
        "outputs": [{"name": "output"}],
    }]})  # fmt: skip

    id: StrictStr | None = None
    parameters: Parameters | None = Field(
        default=None,
        description="Operator attributes by name, and `binary_data_output` (the extension).",
    )
    inputs: list[RequestInput]
    outputs: list[RequestOutput] | None = None


class ResponseOutput(BaseModel):
    """One output tensor: `data` in JSON, or `parameters.binary_data_size` bytes after it."""

    name: str
    shape: list[int]
    datatype: str
    parameters: Parameters | None = None
    data: Any = None


class InferenceResponse(BaseModel):
    """The JSON part of an infer answer."""

    model_config = ConfigDict(json_schema_extra={"examples": [{
        "id": "42", "model_name": "Tile", "model_version": "13",
        "outputs": [{"name": "output", "shape": [4, 6], "datatype": "FP32",
                     "data": [1, 2, 3, 1, 2, 3, 4, 5, 6, 4, 5, 6] * 2}],
    }]})  # fmt: skip

    model_name: str
    model_version: str | None = None
    id: str | None = None
    parameters: Parameters | None = None
    outputs: list[ResponseOutput]


class TensorMetadata(BaseModel):
    """A model input or output: name, datatype and shape (-1 for a dimension of any size)."""

    name: str
    datatype: str = Field(description="The preferred datatype (FP32 or INT64 where allowed)")
    shape: list[int] = Field(description="[-1] when the rank is not fixed either")
    datatypes: list[str] | None = Field(
        default=None, description="Extension: every datatype the tensor may have"
    )
    optional: bool | None = Field(default=None, description="Extension: may be left out")


class AttributeMetadata(BaseModel):
    """Extension: an operator attribute, and how it travels (`parameter` or `input`)."""

    name: str
    type: str = Field(examples=["INT", "INTS", "TENSOR"])
    required: bool
    travels_as: str = Field(examples=["parameter", "input"])


class ModelMetadata(BaseModel):
    """`GET /v2/models/{name}[/versions/{v}]`."""

    model_config = ConfigDict(json_schema_extra={"examples": [{
        "name": "Tile", "versions": ["1", "6", "13"], "platform": "onnx_operator",
        "inputs": [{"name": "input", "datatype": "FP32", "shape": [-1]},
                   {"name": "repeats", "datatype": "INT64", "shape": [-1]}],
        "outputs": [{"name": "output", "datatype": "FP32", "shape": [-1]}],
    }]})  # fmt: skip

    name: str
    versions: list[str]
    platform: str
    inputs: list[TensorMetadata]
    outputs: list[TensorMetadata]
    attributes: list[AttributeMetadata] | None = None


class ServerMetadata(BaseModel):
    """`GET /v2`."""

    name: str = Field(examples=["opserve"])
    version: str = Field(examples=["0.1.0"])
    extensions: list[str] = Field(examples=[["binary_tensor_data"]])


class ServerLive(BaseModel):
    """`GET /v2/health/live`: 200 with `live: true` (KServe's body; Triton's status)."""

    live: bool


class ServerReady(BaseModel):
    """`GET /v2/health/ready`: 200 with `ready: true`, 400 with `ready: false` and an `error`."""

    ready: bool
    error: str | None = None


class ModelReady(BaseModel):
    """`GET /v2/models/{name}[/versions/{v}]/ready`: 200 ready, 400 not (with an `error`)."""

    name: str
    ready: bool
    error: str | None = None


class V2Error(BaseModel):
    """Every V2 refusal."""

    model_config = ConfigDict(json_schema_extra={"examples": [
        {"error": "Tile-13: inputs.repeats: repeats must not be negative, got [-1, 2]"}
    ]})  # fmt: skip

    error: str
