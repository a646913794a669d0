"""Protocol buffers written by hand where protobuf would copy a large tensor: an answer is its
small head (name, version, outputs' names and shapes) serialized by protobuf, followed by each
output's bytes as a field of its own. Protobuf parses concatenated messages as one message
(repeated fields append, maps merge), so the bytes are exactly those of the whole message;
field numbers come from the generated descriptors, never typed in."""

from collections.abc import Iterable

from google.protobuf.message import Message
from tritonclient.grpc import service_pb2 as pb

from service.codecs.tensor_proto import varint

_LENGTH_DELIMITED = 2


def _tag(message: type[Message], field: str) -> bytes:
    number = message.DESCRIPTOR.fields_by_name[field].number
    return varint(number << 3 | _LENGTH_DELIMITED)


RAW_OUTPUT = _tag(pb.ModelInferResponse, "raw_output_contents")
STREAMED = _tag(pb.ModelStreamInferResponse, "infer_response")
FINAL = pb.ModelInferResponse(
    parameters={"triton_final_response": pb.InferParameter(bool_param=True)}
).SerializeToString()
"""What Triton adds to every answer on a stream: the request's last (and only) answer."""


def infer_response(head: bytes, blobs: Iterable[bytes | memoryview]) -> bytes:
    """A ModelInferResponse: its serialized head, then one raw_output_contents per blob."""
    parts: list[bytes | memoryview] = [head]
    for blob in blobs:
        parts += (RAW_OUTPUT, varint(len(blob)), blob)
    return b"".join(parts)


def streamed(response: bytes) -> bytes:
    """A ModelStreamInferResponse carrying the serialized ModelInferResponse `response`."""
    inner = response + FINAL
    return b"".join((STREAMED, varint(len(inner)), inner))


def serialize(message: Message | bytes) -> bytes:
    """A response serializer that passes answers serialized already (off the event loop)."""
    return message if isinstance(message, bytes) else message.SerializeToString()
