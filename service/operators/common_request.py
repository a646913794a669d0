"""The common small v1 operator body, read without the version's request model.

Most calls send `{"inputs": {name: {"dtype", "shape", "data"}, ...}}`, perhaps with
`"output_format"` or an empty `"attributes"`. For such a body the request model would accept
every value unchanged and add only defaults, so reading its JSON types alone gives the same
request, at a fraction of the model's cost per call. Anything else (another key, a value of
another JSON type, attributes given, a body over COMMON_BODY_BYTES, JSON the parser refuses) is
not common: `invoke` then validates it with the request model, the single source of truth for
what is accepted and for every refusal's words.

The reading is a pydantic_core schema of JSON types per version (`_reading`), run by
`validate_json`: the models' own parser (integers past 64 bits stay ints, NaN and Infinity
literals are floats in `data`, which the models take as it is too), with the checks in Rust:
4.2 against 5.7 us for the small Tile call when the same checks were Python over `from_json`'s
dict (the best of interleaved runs). tests/operators/test_common_request.py holds the two paths
to the same answers and refusals on generated bodies.
"""

from dataclasses import dataclass
from typing import Any, NamedTuple

from pydantic import BaseModel, ValidationError
from pydantic_core import SchemaValidator
from pydantic_core import core_schema as cs

from api_schemas.requests import OutputFormat
from service.codecs.limits import Limits
from service.operators.attributes import kernel_attributes
from service.operators.registry import OpVersion

COMMON_BODY_BYTES = 16 * 1024
"""Bodies up to this size may be common: larger ones are rare and pay pydantic's cost gladly."""

_FORMATS = ["json", "tensor_proto"]  # api_schemas.requests.OutputFormat


@dataclass(frozen=True)
class CommonForm:
    """What a version's request model asks of a common body."""

    reading: SchemaValidator  # a common body's JSON types (its inputs in the model's order)
    attributes: BaseModel  # the attributes' defaults (a common body gives none)
    kernel_attributes: dict[str, Any] | None  # as the kernel takes them (None: no tensor-free
    # defaults, decoded per call under the request's limits)


class CommonRequest(NamedTuple):
    """A common body's parts: raw JSON tensors by input name, and the defaults (a tuple: made
    on every small call, where a frozen dataclass took 1 us)."""

    tensors: dict[str, dict[str, Any]]
    attributes: BaseModel
    output_format: OutputFormat
    kernel_attributes: dict[str, Any] | None


_FORMS: dict[str, CommonForm | None] = {}  # by OpVersion.name: bounded by the served versions


def common_request(op: OpVersion, body: bytes) -> CommonRequest | None:
    """The parts of `body` when it is common for `op`, else None (take the request model)."""
    if len(body) > COMMON_BODY_BYTES:
        return None
    form = _FORMS[op.name] if op.name in _FORMS else _FORMS.setdefault(op.name, _form(op))
    if form is None:
        return None
    try:
        request = form.reading.validate_json(body)
    except ValidationError:
        return None
    return CommonRequest(
        request["inputs"],  # its keys in the model's order, as _reading lists them
        form.attributes,
        request.get("output_format", "json"),
        form.kernel_attributes,
    )


_TENSOR = cs.typed_dict_schema({
    "dtype": cs.typed_dict_field(cs.union_schema([cs.str_schema(strict=True),
                                                  cs.int_schema(strict=True)])),
    "shape": cs.typed_dict_field(cs.nullable_schema(cs.list_schema(
        cs.int_schema(strict=True, ge=0), strict=True)), required=False),
    "data": cs.typed_dict_field(cs.any_schema()),
}, extra_behavior="forbid", strict=True)  # fmt: skip
"""A JSON tensor (api_schemas.tensors.JsonTensor) the model would take as it is: an integer or
string dtype, no shape or a list of non-negative integers (no floats, no booleans), any data."""


def _reading(inputs: dict[str, bool]) -> SchemaValidator:
    """The JSON types of a common body for a version with `inputs` (name: required), in order:
    every key known, attributes an empty object at most."""
    tensors = cs.typed_dict_schema(
        {name: cs.typed_dict_field(_TENSOR, required=required) for name, required in inputs.items()},
        extra_behavior="forbid", strict=True)  # fmt: skip
    return SchemaValidator(cs.typed_dict_schema({
        "inputs": cs.typed_dict_field(tensors),
        "attributes": cs.typed_dict_field(cs.typed_dict_schema({}, extra_behavior="forbid",
                                                               strict=True), required=False),
        "output_format": cs.typed_dict_field(cs.literal_schema(_FORMATS), required=False),
    }, extra_behavior="forbid", strict=True))  # fmt: skip


def _form(op: OpVersion) -> CommonForm | None:
    """What a common body must hold for `op`; None when the version has no common form: its
    models check more than each field's type (validators), or its attributes have no
    defaults."""
    inputs_model = op.request.model_fields["inputs"].annotation
    if not isinstance(inputs_model, type) or not issubclass(inputs_model, BaseModel):
        return None  # inputs as a plain dict (no per-version fields): the model decides
    for model in (op.request, inputs_model):
        decorators = model.__pydantic_decorators__
        if decorators.model_validators or decorators.field_validators:
            return None
    try:
        defaults = op.attributes()
    except ValidationError:  # a required attribute, or a validator over them (Constant)
        return None
    inputs = {name: field.is_required() for name, field in inputs_model.model_fields.items()}
    plain = not any(isinstance(value, BaseModel) for value in defaults.__dict__.values())
    attributes = kernel_attributes(defaults, Limits()) if plain else None  # limits unused then
    return CommonForm(_reading(inputs), defaults, attributes)
