"""Response bodies."""

from pydantic import BaseModel, Field

from api_schemas.tensors import Tensor


class OpResponse(BaseModel):
    """The outputs of one node run, and which schema version ran."""

    op_type: str = Field(examples=["Tile"])
    version: int = Field(description="since_version of the schema that ran", examples=[13])
    outputs: dict[str, Tensor]


class ErrorItem(BaseModel):
    """One reason a request was refused."""

    loc: list[str | int] = Field(description="Path of the field at fault")
    msg: str


class ErrorResponse(BaseModel):
    """Every 4xx answer: `detail` says, in words, what is wrong and where."""

    detail: str = Field(
        examples=["inputs.repeats: Tile-13: repeats has 1 values, input has rank 2"]
    )
    errors: list[ErrorItem] | None = Field(
        default=None, description="Each schema violation, when there are several"
    )
