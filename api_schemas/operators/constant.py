"""Constant: a node with no inputs whose one output is the tensor held in its attribute.

Versions 1 and 9 take the tensor as `value`. Version 11 adds `sparse_value` (COO values and
indices, output dense with zeros elsewhere), and version 12 adds plain scalars and lists:
`value_float(s)` (float32), `value_int(s)` (int64) and `value_string(s)`. Exactly one attribute
must be given. Later versions (13 .. 25) only widen the element types.
"""

from typing import Annotated, Any, Self

from pydantic import ConfigDict, Field, model_validator

from api_schemas.requests import Attributes, Inputs, OpRequest
from api_schemas.tensors import SparseTensor, Tensor

Int64 = Annotated[int, Field(ge=-(2**63), le=2**63 - 1)]


class ConstantInputs(Inputs):
    """Constant takes no inputs."""


class ConstantAttrsV1(Attributes):
    value: Tensor = Field(description="The tensor to output.")


class _ExactlyOne(Attributes):
    @model_validator(mode="after")
    def _exactly_one(self) -> Self:
        given = [name for name in type(self).model_fields if getattr(self, name) is not None]
        if len(given) != 1:
            names = ", ".join(type(self).model_fields)
            raise ValueError(f"exactly one of {names} must be given, not {len(given)}")
        return self


class ConstantAttrsV11(_ExactlyOne):
    value: Tensor | None = Field(default=None, description="The tensor to output.")
    sparse_value: SparseTensor | None = Field(
        default=None, description="A sparse tensor, output dense (zeros elsewhere)."
    )


class ConstantAttrsV12(ConstantAttrsV11):
    value_float: float | None = Field(default=None, description="A float scalar.")
    value_floats: list[float] | None = Field(default=None, description="A 1-D float tensor.")
    value_int: Int64 | None = Field(default=None, description="An int64 scalar.")
    value_ints: list[Int64] | None = Field(default=None, description="A 1-D int64 tensor.")
    value_string: str | None = Field(default=None, description="A string scalar.")
    value_strings: list[str] | None = Field(default=None, description="A 1-D string tensor.")


_VALUE: dict[str, Any] = {"dtype": "float", "shape": [2, 2], "data": [1, 2, 3, 4]}


class ConstantRequestV1(OpRequest):
    model_config = ConfigDict(json_schema_extra={"examples": [{"attributes": {"value": _VALUE}}]})

    inputs: ConstantInputs = Field(default_factory=ConstantInputs)
    attributes: ConstantAttrsV1


class ConstantRequestV11(OpRequest):
    model_config = ConfigDict(json_schema_extra={"examples": [{"attributes": {"value": _VALUE}}]})

    inputs: ConstantInputs = Field(default_factory=ConstantInputs)
    attributes: ConstantAttrsV11


class ConstantRequestV12(OpRequest):
    model_config = ConfigDict(
        json_schema_extra={"examples": [{"attributes": {"value_ints": [1, 2, 3]}}]}
    )

    inputs: ConstantInputs = Field(default_factory=ConstantInputs)
    attributes: ConstantAttrsV12
