"""RandomUniformLike: random values drawn uniformly from [low, high), shaped like the input.

The output has the input's shape, and the element type `dtype` names (the input's when left out;
a string input needs it). With a `seed`, the values are the same on every replica and platform;
without one, each call draws fresh values. Version 22 adds bfloat16.
"""

from pydantic import ConfigDict, Field, field_validator

from api_schemas.requests import Attributes, Inputs, OpRequest
from api_schemas.tensors import DTYPE_NAMES, Tensor


class RandomUniformLikeInputs(Inputs):
    input: Tensor = Field(
        description="Gives the output's shape, and its type when `dtype` is unset."
    )


class RandomUniformLikeAttrsV1(Attributes):
    dtype: int | str | None = Field(
        default=None,
        description="Output element type, as an enum number (1 = float) or a dtype name; "
        "the input's type when left out.",
        examples=[1, "float16"],
    )
    high: float = Field(default=1.0, description="Upper bound (exclusive).")
    low: float = Field(default=0.0, description="Lower bound (inclusive).")
    seed: float | None = Field(
        default=None,
        description="Seed: the same seed gives the same values on every replica and platform; "
        "fresh values on each call when left out.",
    )

    @field_validator("dtype")
    @classmethod
    def _known_enum(cls, value: int | str | None) -> int | str | None:
        if isinstance(value, int) and not 1 <= value <= len(DTYPE_NAMES):
            raise ValueError(f"dtype enum {value} is not a TensorProto element type")
        return value


class RandomUniformLikeRequestV1(OpRequest):
    model_config = ConfigDict(json_schema_extra={"examples": [{
        "inputs": {"input": {"dtype": "float", "shape": [2, 2], "data": [0, 0, 0, 0]}},
        "attributes": {"low": -1.0, "high": 1.0, "seed": 7.0},
    }]})  # fmt: skip

    inputs: RandomUniformLikeInputs
    attributes: RandomUniformLikeAttrsV1 = Field(default_factory=RandomUniformLikeAttrsV1)
