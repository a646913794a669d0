"""A node's AttributeProtos -> the keyword arguments of its kernel, held to the same attribute
model as a REST call, so a graph node and a REST request are checked alike."""

from collections.abc import Iterable
from typing import Any

from onnx import AttributeProto
from pydantic import ValidationError

from api_schemas.tensors import ProtoTensor, SparseProtoTensor
from service.codecs.limits import Limits
from service.codecs.sparse_tensor import SparseArray
from service.codecs.tensor_proto import tensor_to_array
from service.errors import InvalidInput, ServiceError, located
from service.operators.registry import OpVersion

_TYPE_NAME = AttributeProto.AttributeType.Name
# Stand-ins for tensors while the model validates the rest: the model only needs to see that a
# tensor is there; the tensors themselves are decoded straight from the protos.
_PLACEHOLDER = {
    AttributeProto.TENSOR: ProtoTensor(tensor_proto=""),
    AttributeProto.SPARSE_TENSOR: SparseProtoTensor(sparse_tensor_proto=""),
}


def node_attributes(
    op: OpVersion, attributes: Iterable[AttributeProto], limits: Limits | None = None
) -> dict[str, Any]:
    """Every attribute of `op` as a kernel keyword (defaults included), tensors as arrays.
    A refusal carries the version in its `operator`."""
    try:
        return _node_attributes(op, attributes, limits or Limits())
    except ServiceError as exc:
        exc.operator = op.name
        raise


def _node_attributes(
    op: OpVersion, attributes: Iterable[AttributeProto], limits: Limits
) -> dict[str, Any]:
    decoded: dict[str, Any] = {}
    fields: dict[str, Any] = {}
    for attr in attributes:
        loc = ("attributes", attr.name)
        _check(op, attr, fields, loc)
        with located(*loc):
            value = _value(attr, limits)
        if attr.type in _PLACEHOLDER:
            decoded[attr.name] = value
            value = _PLACEHOLDER[attr.type]
        fields[attr.name] = value
    try:
        model = op.attributes.model_validate(fields)
    except ValidationError as exc:
        error = exc.errors()[0]
        where = tuple(part for part in error["loc"] if part not in ("json", "proto"))
        raise InvalidInput(f"{error['msg']}", loc=("attributes", *where)) from exc
    return {name: decoded.get(name, getattr(model, name)) for name in type(model).model_fields}


def _check(op: OpVersion, attr: AttributeProto, seen: dict[str, Any], loc: tuple) -> None:
    expected = op.schema.attributes.get(attr.name)
    if expected is None:
        raise InvalidInput(f"no attribute {attr.name!r}; the attributes are "
                           f"{sorted(op.schema.attributes)}", loc=loc)  # fmt: skip
    if attr.name in seen:
        raise InvalidInput(f"attribute {attr.name!r} is given twice", loc=loc)
    if attr.ref_attr_name:
        raise InvalidInput(f"attribute {attr.name!r} refers to a function attribute "
                           f"({attr.ref_attr_name!r}), which a single node cannot resolve", loc=loc)  # fmt: skip
    wanted = str(expected.type).rsplit(".", 1)[-1]  # "AttrType.INT": AttributeProto's names
    if _TYPE_NAME(attr.type) != wanted:
        raise InvalidInput(f"attribute {attr.name!r} must be {wanted}, "
                           f"not {_TYPE_NAME(attr.type)}", loc=loc)  # fmt: skip


def _value(attr: AttributeProto, limits: Limits) -> Any:
    kind = attr.type
    if kind == AttributeProto.TENSOR:
        return tensor_to_array(attr.t, limits)
    if kind == AttributeProto.SPARSE_TENSOR:
        sparse = attr.sparse_tensor
        with located("values"):
            values = tensor_to_array(sparse.values, limits)
        with located("indices"):
            indices = tensor_to_array(sparse.indices, limits)
        return SparseArray(values, indices, tuple(sparse.dims))
    simple = {
        AttributeProto.INT: lambda: attr.i,
        AttributeProto.FLOAT: lambda: attr.f,
        AttributeProto.STRING: lambda: _text(attr.s),
        AttributeProto.INTS: lambda: list(attr.ints),
        AttributeProto.FLOATS: lambda: list(attr.floats),
        AttributeProto.STRINGS: lambda: [_text(s) for s in attr.strings],
    }
    if kind not in simple:
        raise InvalidInput(f"attributes of type {_TYPE_NAME(kind)} are not supported")
    return simple[kind]()


def _text(raw: bytes) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise InvalidInput("a STRING attribute is not valid UTF-8") from None
