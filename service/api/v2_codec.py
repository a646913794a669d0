"""One V2 inference, from body bytes to response bytes; knows nothing of HTTP.

The body is the JSON inference request, followed by the inputs' binary data when the
binary tensor data extension is in use (`header_length` is then the JSON's length).
"""

from collections.abc import Iterator
from typing import Any

import numpy as np
from pydantic import ValidationError

from api_schemas.v2 import InferenceRequest, Parameters, RequestInput, RequestOutput
from service.api.responses import dumps
from service.codecs.dtypes import element_type_of
from service.codecs.limits import Limits
from service.codecs.v2_binary import BinaryReader, decode_binary, encode_binary, split_body
from service.codecs.v2_json import decode_v2_json, encode_v2_json
from service.codecs.v2_types import datatype_of_onnx_name, from_datatype
from service.codecs.wire import Chunks
from service.core.model import V2Model
from service.errors import BadRequest, InvalidInput, ServiceError, located
from service.kernels.context import KernelContext

SMALL_ANSWER_BYTES = 1024 * 1024
"""Binary answers up to this size are joined into one body; larger ones are sent in parts."""


def infer(
    model: V2Model, body: bytes, header_length: int | None, limits: Limits, ctx: KernelContext
) -> tuple[bytes | Chunks, int | None]:
    """The response body, and the length of its JSON part when binary data follows it.
    A refusal names the model version (`Tile-13: inputs.repeats: ...`), as on v1."""
    try:
        return _infer(model, body, header_length, limits, ctx)
    except ServiceError as exc:
        exc.operator = exc.operator or model.label
        raise


def _infer(
    model: V2Model, body: bytes, header_length: int | None, limits: Limits, ctx: KernelContext
) -> tuple[bytes | Chunks, int | None]:
    header, binary = split_body(body, header_length)
    try:
        request = InferenceRequest.model_validate_json(header)
    except ValidationError as exc:
        raise BadRequest(_validation_message(exc)) from None
    parameters = request.parameters or {}
    _refuse_classification(parameters, request.outputs or [])
    binary_outputs = _binary_outputs(request)  # checked before anything runs
    reader = BinaryReader(binary)
    inputs: dict[str, np.ndarray] = {}
    for item in request.inputs:
        with located("inputs", item.name):
            if item.name in inputs:
                raise InvalidInput(f"input {item.name!r} is given twice")
            inputs[item.name] = _decode_input(item, reader, limits)
    reader.finish()
    wanted = [o.name for o in request.outputs] if request.outputs else None
    outputs = model.infer(inputs, parameters, wanted, ctx.for_format(_answer_form(binary_outputs)))
    return _encode(model, request.id, outputs, binary_outputs)


def _answer_form(binary_outputs: tuple[bool, dict[str, bool]]) -> str:
    """How the kernel context bounds and claims the encoded answer: as binary data when every
    output goes so, else as JSON text built whole (the larger of the two)."""
    default, asked = binary_outputs  # with outputs named, only those are answered
    return "v2_binary" if (all(asked.values()) if asked else default) else "v2_json"


def _decode_input(item: RequestInput, reader: BinaryReader, limits: Limits) -> np.ndarray:
    size = (item.parameters or {}).get("binary_data_size")
    if size is None:
        if item.data is None:
            raise InvalidInput("the input has neither data nor parameters.binary_data_size")
        return decode_v2_json(item.datatype, item.shape, item.data, limits)
    if isinstance(size, bool) or not isinstance(size, int) or size < 0:
        raise InvalidInput("parameters.binary_data_size must be a non-negative integer")
    if item.data is not None:
        raise InvalidInput("the input has both data and parameters.binary_data_size")
    et = from_datatype(item.datatype)
    return decode_binary(et, item.shape, reader.take(size), limits)


def _refuse_classification(parameters: Parameters, outputs: list[RequestOutput]) -> None:
    asked = "classification" in parameters or any(
        "classification" in (o.parameters or {}) for o in outputs
    )
    if asked:
        raise BadRequest("the classification extension is not supported: outputs are tensors")


def _binary_outputs(request: InferenceRequest) -> tuple[bool, dict[str, bool]]:
    """Whether outputs go as binary data: by default, and for each output named."""
    default = _flag(request.parameters, "binary_data_output", ("parameters",))
    asked = {o.name: _flag(o.parameters, "binary_data", ("outputs", o.name), default)
             for o in request.outputs or []}  # fmt: skip
    return default, asked


def _encode(
    model: V2Model, request_id: str | None, outputs: dict[str, np.ndarray],
    binary_outputs: tuple[bool, dict[str, bool]],
) -> tuple[bytes | Chunks, int | None]:  # fmt: skip
    default, asked = binary_outputs
    entries: list[dict[str, Any]] = []
    blobs: list[bytes | memoryview] = []
    for name, array in outputs.items():
        if asked.get(name, default):
            blob = encode_binary(array)
            blobs.append(blob)
            entries.append({"name": name, "shape": list(array.shape),
                            "datatype": datatype_of_onnx_name(element_type_of(array).name),
                            "parameters": {"binary_data_size": len(blob)}})  # fmt: skip
        else:
            entries.append(encode_v2_json(name, array))
    response: dict[str, Any] = {"model_name": model.name, "model_version": str(model.version)}
    if request_id is not None:
        response["id"] = request_id
    response["outputs"] = entries
    head = dumps(response)
    if not blobs:
        return head, None
    length = len(head) + sum(len(blob) for blob in blobs)
    if length <= SMALL_ANSWER_BYTES:  # sent at once from the event loop, like any small answer
        return b"".join([head, *blobs]), len(head)
    # the parts as they are, not joined: a joined copy would double a large output's memory
    return Chunks(_parts(head, blobs), length), len(head)


def _parts(head: bytes, blobs: list[bytes | memoryview]) -> Iterator[bytes | memoryview]:
    """The answer's bytes: its JSON head, then each blob as it is (a view of the output's
    memory where it can be: no copy). send_large slices them for flow control."""
    yield head
    yield from blobs


def _flag(
    parameters: Parameters | None, name: str, loc: tuple[str, ...], default: bool = False
) -> bool:
    value = (parameters or {}).get(name, default)
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
