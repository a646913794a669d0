"""Response bodies."""

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from api_schemas.tensors import Tensor

_TILED: list[Any] = [1, 2, 3, 1, 2, 3, 4, 5, 6, 4, 5, 6] * 2


class OpResponse(BaseModel):
    """The outputs of one node run, and which schema version ran."""

    model_config = ConfigDict(json_schema_extra={"examples": [{
        "op_type": "Tile", "version": 13,
        "outputs": {"output": {"dtype": "float", "shape": [4, 6], "data": _TILED}},
    }]})  # fmt: skip

    op_type: str = Field(examples=["Tile"])
    version: int = Field(description="since_version of the schema that ran", examples=[13])
    outputs: dict[str, Tensor] = Field(description="Each output by its formal ONNX name")


class ErrorItem(BaseModel):
    """One reason a request was refused."""

    loc: list[str | int] = Field(description="Path of the field at fault",
                                 examples=[["inputs", "repeats"]])  # fmt: skip
    msg: str = Field(examples=["repeats must not be negative, got [-1, 2]"])


class ErrorResponse(BaseModel):
    """Every 4xx answer: `detail` says, in words, what is wrong and where:
    `<operator version>: <field path>: <what>`."""

    model_config = ConfigDict(json_schema_extra={"examples": [{
        "detail": "Tile-13: inputs.repeats: repeats must not be negative, got [-1, 2]",
        "errors": [{"loc": ["inputs", "repeats"],
                    "msg": "repeats must not be negative, got [-1, 2]"}],
    }]})  # fmt: skip

    detail: str = Field(
        examples=["Tile-13: inputs.repeats: repeats must not be negative, got [-1, 2]"]
    )
    errors: list[ErrorItem] | None = Field(
        default=None, description="Each violation with its field path (null when there is none)"
    )
