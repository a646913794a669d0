"""ModelInferRequest <-> the core's neutral call and result (core/calls.py), as Triton's gRPC
door reads and writes them (src/grpc/infer_handler.cc; notes: triton-grpc.md §2).

An input's data is its shared memory region (named in its parameters), its typed `contents`,
or the next entry of `raw_input_contents`, in that order; a request mixes typed and raw data
in no input (Triton's rule), and sends no more raw contents than its inputs take (Triton's
gRPC door ignores extra ones; its HTTP door refuses extra binary data, in the words used
here). Typed contents become the binary tensor layout, so every input
reaches the core as raw bytes and is decoded there once (FP16, BF16 and the extension
datatypes have no typed field: raw only). Answers are always raw, one `raw_output_contents`
entry per output in order, an empty one for an output written to shared memory.
"""

import math
from collections.abc import Mapping
from typing import Any

from tritonclient.grpc import service_pb2 as pb

from service.codecs.v2_binary import SMALL_COPY_BYTES, encode_binary, pack_values
from service.codecs.v2_types import from_datatype
from service.core.calls import InferCall, InferInput, InferResult, OutputTensor, RequestedOutput
from service.errors import InvalidInput, located, shown_int, shown_shape
from service.grpc import wire
from service.kernels.context import KernelContext

TYPED_FIELDS = {
    "BOOL": "bool_contents", "INT8": "int_contents", "INT16": "int_contents",
    "INT32": "int_contents", "INT64": "int64_contents", "UINT8": "uint_contents",
    "UINT16": "uint_contents", "UINT32": "uint_contents", "UINT64": "uint64_contents",
    "FP32": "fp32_contents", "FP64": "fp64_contents", "BYTES": "bytes_contents",
}  # fmt: skip
"""The InferTensorContents field of each datatype that has one (grpc_service.proto)."""
_FIELD_TYPES = {"bool_contents": "BOOL", "int_contents": "INT32", "int64_contents": "INT64",
                "uint_contents": "UINT32", "uint64_contents": "UINT64", "fp32_contents": "FP32",
                "fp64_contents": "FP64", "bytes_contents": "BYTES"}  # fmt: skip
# Triton's request parameters and the oneof kinds it takes for each (infer_handler.cc)
_RESERVED = {"sequence_id": ("int64_param", "string_param"),
             "sequence_start": ("bool_param",), "sequence_end": ("bool_param",),
             "priority": ("int64_param", "uint64_param"), "timeout": ("int64_param",)}  # fmt: skip
_CUSTOM = ("int64_param", "bool_param", "string_param", "double_param")

Parameters = Mapping[str, pb.InferParameter]


def parameters_of(parameters: Parameters) -> dict[str, Any]:
    """InferParameter oneofs as plain values (bool, int, str, float)."""
    if not parameters:  # most tensors and requests: 0.07 us, the comprehension's setup 0.6
        return {}
    return {key: getattr(value, value.WhichOneof("parameter_choice") or "string_param")
            for key, value in parameters.items()}  # fmt: skip


def request_parameters(parameters: Parameters) -> dict[str, Any]:
    """The request's parameters, each of a kind Triton takes for it (its texts)."""
    for key, value in parameters.items():
        kind = value.WhichOneof("parameter_choice")
        kinds = _RESERVED.get(key, _CUSTOM)
        if kind not in kinds:
            names = " or ".join(kinds) if key in _RESERVED else (
                "int64_param, bool_param, or string_param")  # fmt: skip
            raise InvalidInput(f"invalid value type for '{key[:100]}' parameter, expected "
                               f"{names}.")  # fmt: skip
        if key == "priority" and value.int64_param < 0:
            raise InvalidInput("invalid value for 'priority', expected value >= 0.")
    return parameters_of(parameters)


class GrpcWire:
    """One ModelInferRequest's parse and encode, for the data plane."""

    __slots__ = ("request", "size")

    def __init__(self, request: pb.ModelInferRequest, size: int) -> None:
        self.request, self.size = request, size

    def parse(self, ctx: KernelContext) -> InferCall:
        """The neutral call; the bytes it takes out of the message are claimed first (on a
        thread): as much as the whole message, as taking a raw content copies it and its
        length is known only then."""
        request = self.request
        if ctx.claims is not None:
            ctx.claims.claim(self.size)
        raw = request.raw_input_contents
        inputs, taken = [], 0
        for item in request.inputs:
            with located("inputs", item.name):
                parameters = parameters_of(item.parameters)
                if "shared_memory_region" in parameters:
                    if item.HasField("contents"):
                        raise InvalidInput(f"unexpected 'content' provided when using shared "
                                           f"memory for input tensor '{item.name}' for model "
                                           f"'{request.model_name}'")  # fmt: skip
                    data = None
                elif item.HasField("contents"):
                    if raw:
                        raise InvalidInput(f"contents field must not be specified when using "
                                           f"raw_input_contents for '{item.name}' for model "
                                           f"'{request.model_name}'")  # fmt: skip
                    data = typed_data(item, request.model_name)
                elif taken < len(raw):
                    data, taken = raw[taken], taken + 1
                else:
                    raise InvalidInput(f"unable to find data for input tensor '{item.name}' for "
                                       f"model '{request.model_name}' in request.")  # fmt: skip
                # shape[:] is the list, 2.5x faster than list(shape) on a repeated field
                inputs.append(InferInput(item.name, item.datatype, item.shape[:], parameters,
                                         raw=data))  # fmt: skip
        if taken < len(raw):  # Triton's HTTP door's words for extra binary data
            raise InvalidInput(f"unexpected additional input data for model "
                               f"'{request.model_name}': {len(raw)} raw_input_contents for "
                               f"{taken} inputs that take raw contents")  # fmt: skip
        outputs = [RequestedOutput(o.name, parameters_of(o.parameters), True)
                   for o in request.outputs]  # fmt: skip
        return InferCall(inputs, outputs or None, request_parameters(request.parameters),
                         request.id or None, "v2_binary")  # fmt: skip

    def encode(self, call: InferCall, result: InferResult, ctx: KernelContext) -> bytes:
        """The serialized ModelInferResponse (made here, on a kernel thread when large)."""
        answer = infer_response_of(result.model_name, result.model_version, result.id or "",
                                   result.outputs)  # fmt: skip
        if ctx.claims is not None:
            ctx.claims.claim(len(answer))
        return answer


def infer_response_of(model_name: str, model_version: str, id: str,
                      outputs: list[OutputTensor]) -> bytes:  # fmt: skip
    """The serialized ModelInferResponse of a result: every output's bytes raw, in order (an
    empty entry for one written to shared memory)."""
    head = pb.ModelInferResponse(model_name=model_name, model_version=model_version, id=id)
    blobs = []
    for output in outputs:
        head.outputs.add(name=output.name, datatype=output.datatype, shape=output.shape)
        blobs.append(b"" if output.array is None else encode_binary(output.array))
    # a small answer costs less made whole by protobuf; a large one is copied once, not twice
    if sum(map(len, blobs)) <= SMALL_COPY_BYTES and all(type(b) is bytes for b in blobs):
        head.raw_output_contents.extend(blobs)
        return head.SerializeToString()
    return wire.infer_response(head.SerializeToString(), blobs)


def typed_data(item: pb.ModelInferRequest.InferInputTensor, model: str) -> bytes:
    """An input's typed contents in the binary tensor layout, once their field and count are
    those of its datatype and shape."""
    fields = item.contents.ListFields()
    if len(fields) > 1:
        raise InvalidInput(f"unexpected explicit tensor data for input tensor '{item.name}' for "
                           f"model '{model}', binary data was already supplied.")  # fmt: skip
    expected = TYPED_FIELDS.get(item.datatype)
    if expected is None:
        from_datatype(item.datatype)  # an unknown name is refused as such
        raise InvalidInput(f"datatype {item.datatype} has no typed contents field: send input "
                           f"'{item.name}' as raw_input_contents")  # fmt: skip
    values = fields[0][1] if fields else ()
    if fields and fields[0][0].name != expected:
        raise InvalidInput(f"unexpected explicit tensor data for input tensor '{item.name}' for "
                           f"model '{model}' of type '{_FIELD_TYPES[fields[0][0].name]}', "
                           f"expected datatype '{item.datatype}'")  # fmt: skip
    count = math.prod(item.shape)
    if all(dim >= 0 for dim in item.shape) and len(values) != count:
        raise InvalidInput(f"input '{item.name}' has {len(values)} elements in its contents, "
                           f"but shape {shown_shape(list(item.shape))} holds {shown_int(count)}")  # fmt: skip
    return pack_values(from_datatype(item.datatype), values)
