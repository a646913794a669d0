"""V2 request parameters (and tensor-valued attributes sent as inputs) -> kernel attributes.

V2 parameters are scalars (bool, int64, double, string). INT, FLOAT and STRING attributes
travel as they are; INTS, FLOATS and STRINGS as a string holding a JSON array ("[1, 2]"); a
TENSOR attribute as an extra input named after it. Both are then held to the version's own
attribute model, as a REST call is.
"""

from collections.abc import Mapping
from typing import Any

import numpy as np
import orjson
from pydantic import ValidationError

from api_schemas.tensors import ProtoTensor
from api_schemas.v2 import Parameter
from service.errors import InvalidInput
from service.operators.registry import OpVersion

_LISTS = {"INTS", "FLOATS", "STRINGS"}
_PLACEHOLDER = ProtoTensor(tensor_proto="")  # the model only needs to see a tensor is there


def attribute_type(op: OpVersion, name: str) -> str:
    """The schema type of an attribute ("INT", "TENSOR", ...)."""
    return str(op.schema.attributes[name].type).rsplit(".", 1)[-1]


def tensor_attributes(op: OpVersion) -> frozenset[str]:
    """The attributes that travel as inputs."""
    return frozenset(n for n in op.schema.attributes if attribute_type(op, n) == "TENSOR")


def kernel_attributes(
    op: OpVersion, parameters: Mapping[str, Parameter], tensors: Mapping[str, np.ndarray]
) -> dict[str, Any]:
    """Every attribute of `op` as a kernel keyword (defaults included)."""
    if not parameters and not tensors:  # the usual call: the defaults, validated once
        found = _DEFAULTS.get(op.name)
        if found is None:
            found = _DEFAULTS[op.name] = _kernel_attributes(op, {}, {})
        return dict(found)
    return _kernel_attributes(op, parameters, tensors)


_DEFAULTS: dict[str, dict[str, Any]] = {}
"""The default attributes of each version (by name: bounded by the served versions)."""


def _kernel_attributes(
    op: OpVersion, parameters: Mapping[str, Parameter], tensors: Mapping[str, np.ndarray]
) -> dict[str, Any]:
    fields: dict[str, Any] = {name: _value(op, name, value) for name, value in parameters.items()}
    fields.update((name, _PLACEHOLDER) for name in tensors)
    try:
        model = op.attributes.model_validate(fields)
    except ValidationError as exc:
        error = exc.errors()[0]
        where = [part for part in error["loc"] if part not in ("json", "proto")]
        root = "inputs" if where and where[0] in tensor_attributes(op) else "parameters"
        message = str(error.get("ctx", {}).get("error", error["msg"]))
        raise InvalidInput(message, loc=(root, *where)) from exc
    return {name: tensors.get(name, getattr(model, name)) for name in type(model).model_fields}


def _value(op: OpVersion, name: str, value: Parameter) -> Any:
    loc = ("parameters", name)
    if name not in op.schema.attributes:
        known = ", ".join(sorted(op.schema.attributes)) or "none"
        raise InvalidInput(f"no attribute {name[:100]!r}; the attributes are: {known}", loc=loc)
    kind = attribute_type(op, name)
    if kind == "TENSOR":
        raise InvalidInput(f"attribute {name!r} is a tensor: send it as an input named {name!r}",
                           loc=loc)  # fmt: skip
    if kind not in {"INT", "FLOAT", "STRING", *_LISTS}:
        raise InvalidInput(f"attribute {name!r} ({kind}) cannot travel over V2; use /v1/ops",
                           loc=loc)  # fmt: skip
    if kind in _LISTS:
        if not isinstance(value, str):
            raise InvalidInput(f"{kind} attribute {name!r} goes as a string holding a JSON "
                               f'array, e.g. "[1, 2]"', loc=loc)  # fmt: skip
        try:
            value = orjson.loads(value)
        except orjson.JSONDecodeError as exc:
            raise InvalidInput(f"{kind} attribute {name!r} is not a JSON array: {exc}",
                               loc=loc) from None  # fmt: skip
        if not isinstance(value, list):
            raise InvalidInput(f"{kind} attribute {name!r} must be a JSON array", loc=loc)
    return value
