"""Request bodies shared by every operator version."""

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from api_schemas.tensors import Tensor

OutputFormat = Literal["json", "tensor_proto"]


class Inputs(BaseModel):
    """An operator version's inputs, by their formal ONNX names. Unknown names are refused."""

    model_config = ConfigDict(extra="forbid")


class Attributes(BaseModel):
    """An operator version's attributes, by their ONNX names. Unknown names are refused, and so
    are values of another JSON type (strict: `true` is not the integer 1, "2" is not 2)."""

    model_config = ConfigDict(extra="forbid", strict=True)


class NoAttributes(Attributes):
    """The version takes no attributes."""


class OpRequest(BaseModel):
    """Run one node: inputs, attributes and the form of the output tensors."""

    model_config = ConfigDict(extra="forbid")

    output_format: OutputFormat = Field(
        default="json", description="Form of the output tensors: json or tensor_proto."
    )


class AnyOpRequest(OpRequest):
    """The body of whichever version an opset resolves to; see that version's own route."""

    model_config = ConfigDict(json_schema_extra={"examples": [{
        "inputs": {"data": {"dtype": "float", "shape": [2, 3], "data": [1, 2, 3, 4, 5, 6]}},
        "attributes": {"start": 1},
    }]})  # fmt: skip

    inputs: dict[str, Tensor] = Field(default_factory=dict)
    attributes: dict[str, Any] = Field(default_factory=dict)
