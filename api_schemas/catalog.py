"""The operator catalog: what `GET /v1/ops` and `GET /v1/ops/{op_type}/{version}` return."""

from typing import Any

from pydantic import BaseModel, Field


class OperatorSummary(BaseModel):
    """One operator and the schema versions served."""

    op_type: str = Field(examples=["Tile"])
    domain: str = Field(default="", description="'' is the default ONNX domain (ai.onnx)")
    versions: list[int] = Field(examples=[[1, 6, 13]])
    newest: int = Field(examples=[13])


class Catalog(BaseModel):
    operators: list[OperatorSummary]


class FormalParameter(BaseModel):
    """An input or output: its formal name, type parameter and allowed element types."""

    name: str
    type_param: str = Field(description="e.g. T, or a fixed tensor(int64)")
    types: list[str] = Field(description="Allowed element types (canonical dtype names)")
    optional: bool = False


class AttributeInfo(BaseModel):
    name: str
    type: str = Field(description="ONNX attribute type: INT, FLOAT, STRING, TENSOR, ...")
    required: bool
    default: Any = None
    description: str = ""


class TypeConstraint(BaseModel):
    type_param: str
    types: list[str]


class OperatorVersion(BaseModel):
    """One schema version: formal inputs, outputs, attributes and type constraints."""

    op_type: str
    domain: str = ""
    version: int = Field(description="since_version of the schema")
    inputs: list[FormalParameter]
    outputs: list[FormalParameter]
    attributes: list[AttributeInfo]
    type_constraints: list[TypeConstraint]
    description: str = ""
