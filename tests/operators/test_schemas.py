"""Our attribute, input and request models, type constraints and registry against onnx.defs."""

import inspect
import types
import typing
from typing import Any

import numpy as np
import onnx.defs
import pytest
from onnx import helper
from pydantic import BaseModel, ValidationError

from api_schemas.tensors import JsonTensor, ProtoTensor, SparseJsonTensor, SparseProtoTensor
from service.codecs.dtypes import ELEMENT_TYPES, ElementType
from service.errors import InvalidInput, NotFound
from service.operators.registry import OpVersion, operators, resolve
from service.operators.run import check_inputs, check_outputs

# The contract's table of served versions, typed in from the contract (not from onnx.defs),
# so that onnx adding or dropping a version shows up here.
CONTRACT = {
    "Constant": [1, 9, 11, 12, 13, 19, 21, 23, 24, 25],
    "ConstantOfShape": [9, 20, 21, 23, 24, 25],
    "RandomUniformLike": [1, 22],
    "Tile": [1, 6, 13],
    "Shape": [1, 13, 15, 19, 21, 23, 24, 25],
}
VERSIONS = [(op, v) for op, versions in CONTRACT.items() for v in versions]
IDS = [f"{op}-{v}" for op, v in VERSIONS]
OPSETS = range(1, max(26, onnx.defs.onnx_opset_version()) + 1)

_A = onnx.defs.OpSchema.AttrType
# Each ONNX attribute type as the set of Python types the model field accepts (None aside).
EXPECTED_TYPE: dict[Any, frozenset[Any]] = {
    _A.INT: frozenset({int}),
    _A.FLOAT: frozenset({float}),
    _A.STRING: frozenset({str}),
    _A.INTS: frozenset({("list", frozenset({int}))}),
    _A.FLOATS: frozenset({("list", frozenset({float}))}),
    _A.STRINGS: frozenset({("list", frozenset({str}))}),
    _A.TENSOR: frozenset({JsonTensor, ProtoTensor}),
    _A.SPARSE_TENSOR: frozenset({SparseJsonTensor, SparseProtoTensor}),
}
# Where the contract widens an attribute's type on purpose.
WIDENED = {("RandomUniformLike", "dtype"): frozenset({int, str})}  # enum number or dtype name
# Tile-1's tiles and axis may also be int64 (contract: "of the input's type or int64").
EXTRA_INPUT_TYPES = {("Tile", 1): {"tiles": {"tensor(int64)"}, "axis": {"tensor(int64)"}}}


def _types(annotation: Any) -> frozenset[Any]:
    """An annotation as the set of leaf types it accepts: Annotated and None stripped."""
    if typing.get_origin(annotation) is typing.Annotated:
        return _types(typing.get_args(annotation)[0])
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return frozenset().union(*(_types(arg) for arg in typing.get_args(annotation)))
    if typing.get_origin(annotation) is list:
        return frozenset({("list", _types(typing.get_args(annotation)[0]))})
    return frozenset() if annotation is type(None) else frozenset({annotation})


def _schema(op: str, version: int) -> onnx.defs.OpSchema:
    return onnx.defs.get_schema(op, version, "")


def _model(request: type[BaseModel], field: str) -> type[BaseModel]:
    model = request.model_fields[field].annotation
    assert isinstance(model, type) and issubclass(model, BaseModel)
    return model


def test_served_versions_are_the_contracts_and_onnx_defs() -> None:
    served = {op_type: [v.since_version for v in vs] for _, op_type, vs in operators()}
    assert served == CONTRACT
    for op_type, versions in CONTRACT.items():
        in_onnx = sorted(
            s.since_version
            for s in onnx.defs.get_all_schemas_with_history()
            if s.name == op_type and s.domain == ""
        )
        assert versions == in_onnx, op_type


@pytest.mark.parametrize(("op_type", "version"), VERSIONS, ids=IDS)
def test_attribute_model_matches_schema(op_type: str, version: int) -> None:
    schema, op = _schema(op_type, version), resolve(op_type, version)
    fields = op.attributes.model_fields
    assert sorted(fields) == sorted(schema.attributes)
    for name, attr in schema.attributes.items():
        field = fields[name]
        assert field.is_required() == attr.required, name
        if attr.default_value.name:  # the schema states a default: ours must equal it
            assert field.default == helper.get_attribute_value(attr.default_value), name
        elif not attr.required:  # optional without a default: left out means absent
            assert field.default is None, name
        expected = WIDENED.get((op_type, name), EXPECTED_TYPE[attr.type])
        assert _types(field.annotation) == expected, name


@pytest.mark.parametrize(("op_type", "version"), VERSIONS, ids=IDS)
def test_inputs_outputs_match_schema(op_type: str, version: int) -> None:
    schema, op = _schema(op_type, version), resolve(op_type, version)
    formal_inputs = [p.name for p in schema.inputs]
    inputs = _model(op.request, "inputs").model_fields
    assert list(inputs) == formal_inputs
    single = onnx.defs.OpSchema.FormalParameterOption.Single
    for param in schema.inputs:
        assert inputs[param.name].is_required() == (param.option == single), param.name
    # The kernel takes the formal inputs positionally, in the schema's order.
    positional = [
        p.name
        for p in inspect.signature(op.kernel).parameters.values()
        if p.kind is p.POSITIONAL_OR_KEYWORD
    ]
    assert positional == formal_inputs
    assert op.inputs == formal_inputs
    assert op.outputs == [p.name for p in schema.outputs]
    # The request may leave `attributes` out exactly when no attributes are a valid set
    # (not for Constant, whose schema asks for exactly one of its attributes).
    try:
        op.attributes.model_validate({})
        empty_is_valid = True
    except ValidationError:
        empty_is_valid = False
    assert empty_is_valid == (op_type != "Constant")
    assert op.request.model_fields["attributes"].is_required() == (not empty_is_valid)


@pytest.mark.parametrize(("op_type", "version"), VERSIONS, ids=IDS)
def test_type_constraints_match_schema(op_type: str, version: int) -> None:
    schema, op = _schema(op_type, version), resolve(op_type, version)
    constraints = {c.type_param_str: set(c.allowed_type_strs) for c in schema.type_constraints}
    for param in [*schema.inputs, *schema.outputs]:
        assert set(op.allowed_types(param)) == constraints.get(param.type_str, {param.type_str})
    extra = EXTRA_INPUT_TYPES.get((op_type, version), {})
    assert {k: set(v) for k, v in op.extra_input_types.items()} == extra


@pytest.mark.parametrize(("op_type", "version"), VERSIONS, ids=IDS)
def test_run_enforces_type_constraints(op_type: str, version: int) -> None:
    """Every element type is accepted exactly where the schema allows it, inputs and outputs."""
    op = resolve(op_type, version)
    for param in op.schema.inputs:
        allowed = op.allowed_types(param) | op.extra_input_types.get(param.name, frozenset())
        for et in ELEMENT_TYPES:
            inputs = _inputs_with(op, param, et)
            if et.type_str in allowed:
                check_inputs(op, inputs)
            else:
                with pytest.raises(InvalidInput, match=f"cannot be {et.name} "):
                    check_inputs(op, inputs)
    for param in op.schema.outputs:
        for et in ELEMENT_TYPES:
            if et.type_str in op.allowed_types(param):
                check_outputs(op, (_array(et),))
            else:
                with pytest.raises(InvalidInput, match=f"{param.name!r} cannot be {et.name} "):
                    check_outputs(op, (_array(et),))


def _array(et: ElementType) -> np.ndarray:
    return np.array(["a"], dtype=object) if et.is_string else np.zeros(1, dtype=et.np_dtype)


def _inputs_with(op: OpVersion, tested: Any, et: ElementType) -> dict[str, np.ndarray]:
    """`et` for the tested input and the inputs bound to its type parameter; every other
    input an allowed type (an extra type where it has one, which binds nothing)."""
    inputs = {}
    binds = et.type_str not in op.extra_input_types.get(tested.name, ())
    for param in op.schema.inputs:
        extra = op.extra_input_types.get(param.name)
        shares = binds and param.type_str == tested.type_str and not extra
        if param.name == tested.name or shares:
            inputs[param.name] = _array(et)
            continue
        first = sorted(extra or op.allowed_types(param))[0][len("tensor(") : -1]
        inputs[param.name] = _array(next(t for t in ELEMENT_TYPES if t.name == first))
    return inputs


@pytest.mark.parametrize("opset", [onnx.defs.onnx_opset_version() + 1, 99, 2**31])
@pytest.mark.parametrize("op_type", CONTRACT)
def test_an_opset_past_onnx_newest_is_not_found(op_type: str, opset: int) -> None:
    newest = onnx.defs.onnx_opset_version()
    with pytest.raises(NotFound, match=f"{op_type} has no version at opset {opset}: the newest "
                                       f"opset onnx .* defines is {newest}$"):  # fmt: skip
        resolve(op_type, opset)


@pytest.mark.parametrize("op_type", CONTRACT)
def test_registry_resolves_every_opset(op_type: str) -> None:
    versions = CONTRACT[op_type]
    for opset in OPSETS:
        in_force = [v for v in versions if v <= opset]
        if not in_force:
            with pytest.raises(NotFound, match=f"{op_type} has no version at opset {opset}"):
                resolve(op_type, opset)
            continue
        op = resolve(op_type, opset)
        assert op.since_version == max(in_force), opset
        assert op.schema.since_version == op.since_version
        assert op.schema is not None and op.op_type == op_type
    assert resolve(op_type).since_version == versions[-1]


def test_unknown_operator_is_not_found() -> None:
    with pytest.raises(NotFound, match="unknown operator Tiles"):
        resolve("Tiles", 13)


@pytest.mark.parametrize(
    ("asked", "suggested"),
    [("tile", "Tile"), ("TILE", "Tile"), ("constantofshape", "ConstantOfShape"),
     ("Tilee", "Tile"), ("RandomUniform", "RandomUniformLike"), ("Nope", None)],
)  # fmt: skip
def test_unknown_operator_suggests_the_close_match(asked: str, suggested: str | None) -> None:
    with pytest.raises(NotFound) as info:
        resolve(asked, 13)
    words = str(info.value)
    assert words.endswith("the operators are Constant, ConstantOfShape, RandomUniformLike, "
                          "Shape, Tile")  # fmt: skip
    assert (f"(did you mean {suggested}?)" in words) if suggested else "did you mean" not in words
