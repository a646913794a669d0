"""The common small v1 operator body, read without the version's request model.

Most calls send `{"inputs": {name: {"dtype", "shape", "data"}, ...}}`, perhaps with
`"output_format"` or an empty `"attributes"`. For such a body the request model would accept
every value unchanged and add only defaults, so the parse alone (json_tensor.common_json, the
models' own parser) gives the same request, at a fraction of pydantic's cost per call. Anything
else (another key, a value of another JSON type, attributes given, a body over
COMMON_BODY_BYTES, JSON the parser refuses) is not common: `invoke`
then validates it with the request model, the single source of truth for what is accepted and
for every refusal's words. tests/operators/test_common_request.py holds the two paths to the
same answers and refusals on generated bodies.
"""

from dataclasses import dataclass
from typing import Any, NamedTuple

from pydantic import BaseModel, ValidationError

from api_schemas.requests import OutputFormat
from service.codecs.json_tensor import common_json
from service.codecs.limits import Limits
from service.operators.attributes import kernel_attributes
from service.operators.registry import OpVersion

COMMON_BODY_BYTES = 16 * 1024
"""Bodies up to this size may be common: larger ones are rare and pay pydantic's cost gladly."""

_TOP = frozenset({"inputs", "attributes", "output_format"})
_TENSOR = frozenset({"dtype", "shape", "data"})
_FORMATS = ("json", "tensor_proto")  # api_schemas.requests.OutputFormat


@dataclass(frozen=True)
class CommonForm:
    """What a version's request model asks of a common body."""

    inputs: tuple[str, ...]  # every input, in the model's order (the order decoding reports in)
    required: frozenset[str]
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
    request = common_json(body)  # None (as `null`) goes to the model below
    if type(request) is not dict or not request.keys() <= _TOP:
        return None
    output_format = request.get("output_format", "json")
    if type(output_format) is not str or output_format not in _FORMATS:
        return None
    if request.get("attributes", {}) != {}:  # only an empty object equals {}
        return None
    tensors = request.get("inputs")
    if type(tensors) is not dict or not form.required <= tensors.keys() <= set(form.inputs):
        return None
    for tensor in tensors.values():
        if not _common_tensor(tensor):
            return None
    ordered = {name: tensors[name] for name in form.inputs if name in tensors}
    return CommonRequest(
        ordered,
        form.attributes,
        output_format,  # type: ignore[arg-type]
        form.kernel_attributes,
    )


def _common_tensor(tensor: Any) -> bool:
    """A JSON tensor (api_schemas.tensors.JsonTensor) the model would take as it is."""
    if type(tensor) is not dict or "dtype" not in tensor or "data" not in tensor:
        return False
    if not tensor.keys() <= _TENSOR or type(tensor["dtype"]) not in (str, int):
        return False
    shape = tensor.get("shape")
    if shape is None:
        return True
    if type(shape) is not list:
        return False
    for dim in shape:  # noqa: SIM110 (a loop: all() over a generator costs nearly 4x as much)
        if type(dim) is not int or dim < 0:
            return False
    return True


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
    fields = inputs_model.model_fields
    required = frozenset(name for name, field in fields.items() if field.is_required())
    plain = not any(isinstance(value, BaseModel) for value in defaults.__dict__.values())
    attributes = kernel_attributes(defaults, Limits()) if plain else None  # limits unused then
    return CommonForm(tuple(fields), required, defaults, attributes)
