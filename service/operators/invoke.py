"""One REST operator call, from request bytes to response object; knows nothing of HTTP."""

from typing import Any

from pydantic import BaseModel

from service.codecs.json_tensor import decode_values
from service.codecs.limits import Limits
from service.codecs.wire import decode_tensor, encode_tensor
from service.errors import ServiceError, located
from service.kernels.context import KernelContext
from service.operators.attributes import kernel_attributes
from service.operators.common_request import common_request
from service.operators.registry import OpVersion
from service.operators.run import run


def invoke(
    op: OpVersion, body: bytes, limits: Limits, ctx: KernelContext, stream: bool = False
) -> dict[str, Any]:
    """Validate the body against the version's request model, run it, encode the outputs
    (with `stream`, large ones as Streamed values: see wire.encode_answer)."""
    common = common_request(op, body)
    if common is not None:  # the usual small body: the same request, read the short way
        inputs = _decode_common(common.tensors, limits)
        attributes = (dict(common.kernel_attributes) if common.kernel_attributes is not None
                      else kernel_attributes(common.attributes, limits))  # fmt: skip
        output_format = common.output_format
    else:
        request = op.request.model_validate_json(body)
        inputs = _decode_inputs(request.inputs, limits)  # type: ignore[attr-defined]
        attributes = kernel_attributes(request.attributes, limits)  # type: ignore[attr-defined]
        output_format = request.output_format  # type: ignore[attr-defined]
    outputs = run(op, inputs, attributes, ctx.for_format(output_format))
    return {
        "op_type": op.op_type,
        "version": op.since_version,
        "outputs": {
            name: encode_tensor(array, output_format, stream) for name, array in outputs.items()
        },
    }


def _decode_common(tensors: dict[str, dict[str, Any]], limits: Limits) -> dict[str, Any]:
    """As _decode_inputs, for a common body's raw JSON tensors (in the model's order)."""
    decoded = {}
    for name, wire in tensors.items():
        try:  # as `located`, without a context manager per tensor
            decoded[name] = decode_values(wire["dtype"], wire.get("shape"), wire["data"], limits)
        except ServiceError as exc:
            exc.loc = ("inputs", name, *exc.loc)
            raise
    return decoded


def _decode_inputs(inputs: BaseModel, limits: Limits) -> dict[str, Any]:
    decoded = {}
    for name, wire in inputs.__dict__.items():  # the model's fields, without a class lookup
        if wire is None:
            continue
        with located("inputs", name):
            decoded[name] = decode_tensor(wire, limits)
    return decoded
