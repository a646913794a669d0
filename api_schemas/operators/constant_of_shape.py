"""ConstantOfShape: a tensor of the shape the input gives, every element set to one value.

The input is a 1-D int64 tensor of dimensions (`[]` gives a scalar, a 0 an empty tensor);
the attribute `value` is a one-element tensor whose value and element type the output takes,
float32 zero when left out. Versions 9 .. 25 differ only in the element types `value` may have.
"""

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
