"""The wire models (api_schemas.operators) of each behaviour-changing operator version.

Keyed like the kernels, by (op_type, since_version), and resolved the same way: a schema
version is served with the models of the highest entry at or below it. The kernels stay free
of pydantic; tests/operators/test_schemas.py proves these models agree with onnx.defs.
"""

from pydantic import BaseModel

from api_schemas.operators import constant, constant_of_shape, random_uniform_like, shape, tile
from api_schemas.requests import NoAttributes

Models = tuple[type[BaseModel], type[BaseModel]]  # (attributes, request)

WIRE_MODELS: dict[tuple[str, int], Models] = {
    ("Constant", 1): (constant.ConstantAttrsV1, constant.ConstantRequestV1),
    ("Constant", 11): (constant.ConstantAttrsV11, constant.ConstantRequestV11),
    ("Constant", 12): (constant.ConstantAttrsV12, constant.ConstantRequestV12),
    ("ConstantOfShape", 9): (
        constant_of_shape.ConstantOfShapeAttrsV9, constant_of_shape.ConstantOfShapeRequestV9,
    ),
    ("RandomUniformLike", 1): (
        random_uniform_like.RandomUniformLikeAttrsV1,
        random_uniform_like.RandomUniformLikeRequestV1,
    ),
    ("Shape", 1): (NoAttributes, shape.ShapeRequestV1),
    ("Shape", 15): (shape.ShapeAttrsV15, shape.ShapeRequestV15),
    ("Tile", 1): (NoAttributes, tile.TileRequestV1),
    ("Tile", 6): (NoAttributes, tile.TileRequestV6),
}  # fmt: skip


def wire_models(op_type: str, version: int) -> Models:
    """The models of the highest entry for `op_type` at or below `version`."""
    starts = [since for (name, since) in WIRE_MODELS if name == op_type and since <= version]
    if not starts:
        raise LookupError(f"no wire models for {op_type} at version {version}")
    return WIRE_MODELS[(op_type, max(starts))]
