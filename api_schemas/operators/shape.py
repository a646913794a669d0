"""Shape: the dimensions of the input tensor, as a 1-D int64 tensor.

From version 15, `start` and `end` pick a slice of the dimensions the way Python slices do:
negative values count from the back, both ends are clamped to [0, rank], and start >= end
gives an empty result. A scalar input has the empty shape. Versions 13, 19, 21, 23, 24 and 25
only widen the input's element types.
"""

from typing import Any

from pydantic import ConfigDict, Field

from api_schemas.requests import Attributes, Inputs, NoAttributes, OpRequest
from api_schemas.tensors import Tensor

_DATA: dict[str, Any] = {"dtype": "float", "shape": [2, 3, 4], "data": list(range(24))}


class ShapeInputs(Inputs):
    data: Tensor = Field(description="An input tensor of any rank.")


class ShapeRequestV1(OpRequest):
    model_config = ConfigDict(json_schema_extra={"examples": [{"inputs": {"data": _DATA}}]})

    inputs: ShapeInputs
    attributes: NoAttributes = Field(default_factory=NoAttributes)


class ShapeAttrsV15(Attributes):
    start: int = Field(default=0, ge=-(2**63), le=2**63 - 1,
                       description="First axis to include; negative counts from the back; clamped.")  # fmt: skip
    end: int | None = Field(default=None, ge=-(2**63), le=2**63 - 1,
                            description="Axis to stop before; all axes when left out; clamped.")  # fmt: skip


class ShapeRequestV15(OpRequest):
    model_config = ConfigDict(
        json_schema_extra={"examples": [{"inputs": {"data": _DATA}, "attributes": {"start": 1}}]}
    )

    inputs: ShapeInputs
    attributes: ShapeAttrsV15 = Field(default_factory=ShapeAttrsV15)
