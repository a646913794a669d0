"""ConstantOfShape: a tensor of the given shape filled with one value. Versions 9..25."""

from pydantic import ConfigDict, Field

from api_schemas.requests import Attributes, Inputs, OpRequest
from api_schemas.tensors import Tensor


class ConstantOfShapeInputs(Inputs):
    input: Tensor = Field(description="int64 [rank]: the output's shape; [] gives a scalar.")


class ConstantOfShapeAttrsV9(Attributes):
    value: Tensor | None = Field(
        default=None,
        description="A one-element tensor: the fill value and output type (float 0 if left out).",
    )


class ConstantOfShapeRequestV9(OpRequest):
    model_config = ConfigDict(json_schema_extra={"examples": [{
        "inputs": {"input": {"dtype": "int64", "shape": [2], "data": [2, 3]}},
        "attributes": {"value": {"dtype": "int32", "shape": [1], "data": [7]}},
    }]})  # fmt: skip

    inputs: ConstantOfShapeInputs
    attributes: ConstantOfShapeAttrsV9 = Field(default_factory=ConstantOfShapeAttrsV9)
