"""The V2 inference body over HTTP <-> the core's neutral call and result (core/calls.py).

The body is the JSON inference request, followed by the inputs' binary data when Triton's
binary tensor data extension is in use (`header_length` is then the JSON's length); the
answer is JSON, with the binary outputs after it the same way.
"""

from collections.abc import Iterator
from typing import Any

from pydantic import ValidationError
from pydantic_core import SchemaValidator
from pydantic_core import core_schema as cs

from api_schemas.v2 import InferenceRequest, Parameters, RequestInput
from service.api.responses import dumps
from service.codecs.json_tensor import common_json
from service.codecs.limits import SMALL_BYTES
from service.codecs.v2_binary import BinaryReader, encode_binary, split_body
from service.codecs.v2_json import encode_v2_json
from service.codecs.wire import Chunks, encode_answer
from service.core.calls import AnswerForm, InferCall, InferInput, InferResult, RequestedOutput
from service.core.shared_memory import check_input_source
from service.errors import BadRequest, InvalidInput, located
from service.operators.common_request import COMMON_BODY_BYTES

SMALL_ANSWER_BYTES = SMALL_BYTES
"""Binary answers up to this size are joined into one body; larger ones are sent in parts."""

Answer = tuple[bytes | Chunks, int | None]
"""The answer's bytes, and the length of its JSON part when binary data follows it."""


def parse_request(body: bytes, header_length: int | None) -> InferCall:
    """The call a V2 body holds: refused (400) when the JSON header is malformed, when binary
    data sizes do not add up, or when a flag is not a boolean."""
    if header_length is None and len(body) <= COMMON_BODY_BYTES:
        common = common_call(body)
        if common is not None:  # the usual small JSON body: the same call, the short way
            return common
    header, binary = split_body(body, header_length)
    if header_length is not None and len(body) <= COMMON_BODY_BYTES:
        common = common_binary_call(header, binary)
        if common is not None:  # tritonclient.http's small call: the same, the short way
            return common
    try:
        request = InferenceRequest.model_validate_json(header)
    except ValidationError as exc:
        raise BadRequest(_validation_message(exc)) from None
    parameters = request.parameters or {}
    default = _flag(parameters, "binary_data_output", ("parameters",))
    outputs = None
    if request.outputs is not None:
        outputs = [  # the flags are checked before anything runs
            RequestedOutput(o.name, o.parameters or {},
                            _flag(o.parameters or {}, "binary_data", ("outputs", o.name), default))
            for o in request.outputs
        ]  # fmt: skip
    reader = BinaryReader(binary)
    inputs = [_input(item, reader) for item in request.inputs]
    reader.finish()
    call = InferCall(inputs, outputs, parameters, request.id)
    call.answer_form = _answer_form(call, default)
    return call


_REQUEST_FIELDS = frozenset(InferenceRequest.model_fields)


def common_call(body: bytes) -> InferCall | None:
    """The call of a common small JSON body, read with the JSON types of _COMMON_CALL instead of
    InferenceRequest: `{"inputs": [{"name", "shape", "datatype", "data"}, ...]}`, perhaps with
    an `id` and outputs named with no parameters (or an empty object), and fields the model
    ignores (the KServe SDK's `model_name`). For such a body the model takes every value as it
    is, so the call is the same; anything else (parameters, binary data, another JSON type
    anywhere) is None and goes through the model, the one judge of what is refused.
    tests/api/test_v2_common_call.py holds the two equal on generated bodies."""
    try:
        request = _COMMON_CALL.validate_json(body)
    except ValidationError:
        return None
    inputs = []
    for item in request["inputs"]:
        if item["data"] is None:
            return None  # no data: the model's words
        inputs.append(InferInput(item["name"], item["datatype"], item["shape"], {}, item["data"]))
    named = request.get("outputs")
    outputs = None if named is None else [RequestedOutput(o["name"], {}, False) for o in named]
    return InferCall(inputs, outputs, {}, request.get("id"), "v2_json")  # JSON answers


def _model_reads(value: Any) -> Any:
    """A field of a request that is never common: the model reads it (a call with
    `parameters`)."""
    raise ValueError("the model's to read")


_STR = cs.str_schema(strict=True)
_COMMON_CALL = SchemaValidator(cs.typed_dict_schema({
    "id": cs.typed_dict_field(cs.nullable_schema(_STR), required=False),
    "inputs": cs.typed_dict_field(cs.list_schema(cs.typed_dict_schema({
        "name": cs.typed_dict_field(_STR),
        "shape": cs.typed_dict_field(cs.list_schema(cs.int_schema(strict=True, ge=0),
                                                    strict=True)),
        "datatype": cs.typed_dict_field(_STR),
        "data": cs.typed_dict_field(cs.any_schema()),
    }, extra_behavior="forbid", strict=True), strict=True)),
    "outputs": cs.typed_dict_field(cs.nullable_schema(cs.list_schema(cs.typed_dict_schema({
        "name": cs.typed_dict_field(_STR),
        "parameters": cs.typed_dict_field(cs.typed_dict_schema({}, extra_behavior="forbid",
                                                               strict=True), required=False),
    }, extra_behavior="forbid", strict=True), strict=True)), required=False),
    "parameters": cs.typed_dict_field(cs.no_info_plain_validator_function(_model_reads),
                                      required=False),
}, extra_behavior="ignore", strict=True))  # fmt: skip
"""A common JSON body's types (common_call): pydantic_core's `validate_json` is the models' own
parser, with the checks in Rust (the whole call 4.9 against 5.2 us for the small Tile call when
they were Python over from_json's dict); NaN and Infinity literals are floats in `data`, which
the model takes as it is too. Other fields are ignored, as the model ignores them."""


def common_binary_call(header: bytes, binary: memoryview) -> InferCall | None:
    """The call of a small body in the binary form tritonclient.http sends, its JSON header
    read with common_json instead of InferenceRequest (12.4 against 5 us): every input
    `{"name", "shape", "datatype", "parameters": {"binary_data_size": n}}` with the sizes adding
    up to the binary part, perhaps `"parameters": {"binary_data_output": flag}`, an `id`, and
    outputs named with at most their `binary_data` flag. Anything else is None and goes through
    the model, the one judge of what is refused, as for common_call; tests/api/
    test_v2_common_call.py holds the two equal on generated bodies."""
    request = common_json(header)
    if type(request) is not dict or not request.keys() & _REQUEST_FIELDS <= _BINARY_FIELDS:
        return None
    rid, items, named = request.get("id"), request.get("inputs"), request.get("outputs")
    parameters = request.get("parameters", {})
    if (rid is not None and type(rid) is not str) or type(items) is not list:
        return None
    if type(parameters) is not dict or not parameters.keys() <= {"binary_data_output"}:
        return None
    default = parameters.get("binary_data_output", False)
    if type(default) is not bool:
        return None
    reader = BinaryReader(binary)
    inputs = []
    for item in items:
        if type(item) is not dict or item.keys() != _BINARY_INPUT_KEYS:
            return None
        name, shape, datatype, given = (item["name"], item["shape"], item["datatype"],
                                        item["parameters"])  # fmt: skip
        if type(name) is not str or type(datatype) is not str or type(shape) is not list:
            return None
        for dim in shape:  # a loop: all() over a generator costs nearly 4x as much here
            if type(dim) is not int or dim < 0:
                return None
        if type(given) is not dict or given.keys() != {"binary_data_size"}:
            return None
        size = given["binary_data_size"]
        if type(size) is not int or not 0 <= size <= len(binary) - reader.offset:
            return None
        inputs.append(InferInput(name, datatype, shape, given, raw=reader.take(size)))
    if reader.offset != len(binary):
        return None  # bytes no input claims: the model path's to refuse
    outputs = None
    if named is not None:
        outputs = _named_outputs(named, default)
        if outputs is None:
            return None
    call = InferCall(inputs, outputs, parameters, rid)
    call.answer_form = _answer_form(call, default)
    return call


_BINARY_FIELDS = frozenset({"id", "inputs", "outputs", "parameters"})
_BINARY_INPUT_KEYS = frozenset({"name", "shape", "datatype", "parameters"})


def _named_outputs(named: Any, default: bool) -> list[RequestedOutput] | None:
    """The outputs a common binary body names (common_binary_call): each `{"name"}`,
    perhaps with `"parameters": {"binary_data": flag}` (`default` where not given, as the
    model path's `_flag`); None for anything else (the model's to read)."""
    if type(named) is not list:
        return None
    outputs = []
    for output in named:
        if type(output) is not dict or not {"name"} <= output.keys() <= _OUTPUT_KEYS:
            return None
        flags = output.get("parameters", {})
        if type(output["name"]) is not str or type(flags) is not dict:
            return None
        binary_data = flags.get("binary_data", default)
        if not flags.keys() <= {"binary_data"} or type(binary_data) is not bool:
            return None
        outputs.append(RequestedOutput(output["name"], flags, binary_data))
    return outputs


_OUTPUT_KEYS = frozenset({"name", "parameters"})


def _input(item: RequestInput, reader: BinaryReader) -> InferInput:
    """The input with its JSON data, its bytes from the binary part, or neither (its shared
    memory region, read by the core): exactly one of the three (Triton's rule)."""
    parameters = item.parameters or {}
    size = parameters.get("binary_data_size")
    with located("inputs", item.name):
        if (size is None) == (item.data is None) or "shared_memory_region" in parameters:
            check_input_source(item.data is not None, parameters)  # not the one plain source
        if size is None:
            return InferInput(item.name, item.datatype, item.shape, parameters, item.data)
        if isinstance(size, bool) or not isinstance(size, int) or size < 0:
            raise InvalidInput("parameters.binary_data_size must be a non-negative integer")
        return InferInput(item.name, item.datatype, item.shape, parameters, raw=reader.take(size))


def _answer_form(call: InferCall, default: bool) -> AnswerForm:
    """How the answer is bounded and claimed: as binary data when every output goes so, else
    as JSON text built whole (the larger of the two)."""
    # with outputs named, only those are answered
    named = call.outputs and all(o.binary for o in call.outputs)
    return "v2_binary" if (named if call.outputs else default) else "v2_json"


def encode_result(call: InferCall, result: InferResult, stream: bool = False) -> Answer:
    """The answer to `call`: each output as JSON data, or as binary data after the JSON where
    it asked (or, when outputs were not named, where `binary_data_output` asked). With
    `stream` (off the event loop) and no binary data, large JSON outputs are encoded as they
    are sent (binary data needs the JSON's length first)."""
    default = call.answer_form == "v2_binary" and not call.outputs
    asked = {o.name: o.binary for o in call.outputs or []}
    entries: list[dict[str, Any]] = []
    blobs: list[bytes | memoryview] = []
    stream = stream and not any(asked.get(o.name, default) for o in result.outputs
                                if o.array is not None)  # fmt: skip
    for output in result.outputs:
        array = output.array
        if array is None:  # written to shared memory: Triton answers its name, type and shape
            entries.append({"name": output.name, "datatype": output.datatype,
                            "shape": output.shape})  # fmt: skip
        elif asked.get(output.name, default):
            blob = encode_binary(array)
            blobs.append(blob)
            entries.append({"name": output.name, "shape": output.shape,
                            "datatype": output.datatype,
                            "parameters": {"binary_data_size": len(blob)}})  # fmt: skip
        else:
            entries.append(encode_v2_json(output.name, array, stream))
    response = answer_of(result.model_name, result.model_version, result.id, entries)
    if not blobs:  # JSON only: its tensors hold Streamed values only when streaming
        return (encode_answer(response, dumps, entries) if stream else dumps(response)), None
    head = dumps(response)
    length = len(head) + sum(len(blob) for blob in blobs)
    if length <= SMALL_ANSWER_BYTES:  # sent at once from the event loop, like any small answer
        return b"".join([head, *blobs]), len(head)
    # the parts as they are, not joined: a joined copy would double a large output's memory
    return Chunks(_parts(head, blobs), length), len(head)


def answer_headers(json_length: int | None) -> list[tuple[bytes, bytes]]:
    """The headers of an answer whose JSON part is `json_length` bytes long when binary data
    follows it (None: JSON only)."""
    if json_length is None:
        return [(b"content-type", b"application/json")]
    return [(b"content-type", b"application/octet-stream"),
            (b"inference-header-content-length", str(json_length).encode())]  # fmt: skip


def answer_of(model_name: str, model_version: str, request_id: str | None,
              outputs: list[dict[str, Any]]) -> dict[str, Any]:  # fmt: skip
    """A V2 inference answer, its keys in Triton's order (the id only when one was sent)."""
    response: dict[str, Any] = {"model_name": model_name, "model_version": model_version}
    if request_id is not None:
        response["id"] = request_id
    response["outputs"] = outputs
    return response


def _parts(head: bytes, blobs: list[bytes | memoryview]) -> Iterator[bytes | memoryview]:
    """The answer's bytes: its JSON head, then each blob as it is (a view of the output's
    memory where it can be: no copy). send_large slices them for flow control."""
    yield head
    yield from blobs


def _flag(parameters: Parameters, name: str, loc: tuple[str, ...], default: bool = False) -> bool:
    value = parameters.get(name, default)
    if not isinstance(value, bool):
        raise InvalidInput(f"{name} must be true or false, not {value!r:.40}", loc=loc)
    return value


def _validation_message(exc: ValidationError) -> str:
    """pydantic's errors as `<field path>: <what>`, joined; the JSON error said plainly."""
    parts = []
    for error in exc.errors()[:5]:
        where = ".".join(str(p) for p in error["loc"])
        what = error["msg"]
        if error["type"] == "json_invalid":
            what = f"the inference header is not valid JSON: {error.get('ctx', {}).get('error')}"
        parts.append(f"{where}: {what}" if where else what)
    return "; ".join(parts)
