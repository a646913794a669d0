"""Tile: a tensor repeated along its axes, as numpy's `np.tile` does.

Versions 6 and 13 take `repeats`, an int64 tensor with one count per input axis (0 gives an
empty axis). Version 1 is Caffe2's Tile: the whole input repeated `tiles` times along `axis`,
both scalars of the input's type or int64. Version 13 adds bfloat16.
"""

from typing import Any

from pydantic import ConfigDict, Field

from api_schemas.requests import Inputs, NoAttributes, OpRequest
from api_schemas.tensors import Tensor

_INPUT: dict[str, Any] = {"dtype": "float", "shape": [2, 3], "data": [1, 2, 3, 4, 5, 6]}


class TileInputsV1(Inputs):
    input: Tensor = Field(description="The tensor to tile.")
    tiles: Tensor = Field(description="How many times to repeat along `axis`: a scalar.")
    axis: Tensor = Field(description="The axis to repeat along: a scalar.")


class TileRequestV1(OpRequest):
    model_config = ConfigDict(json_schema_extra={"examples": [{"inputs": {
        "input": _INPUT,
        "tiles": {"dtype": "int64", "shape": [], "data": 2},
        "axis": {"dtype": "int64", "shape": [], "data": 1},
    }}]})  # fmt: skip

    inputs: TileInputsV1
    attributes: NoAttributes = Field(default_factory=NoAttributes)


class TileInputsV6(Inputs):
    input: Tensor = Field(description="The tensor to tile.")
    repeats: Tensor = Field(description="int64 [rank]: the copies along each axis.")


class TileRequestV6(OpRequest):
    model_config = ConfigDict(json_schema_extra={"examples": [{"inputs": {
        "input": _INPUT,
        "repeats": {"dtype": "int64", "shape": [2], "data": [2, 2]},
    }}]})  # fmt: skip

    inputs: TileInputsV6
    attributes: NoAttributes = Field(default_factory=NoAttributes)
