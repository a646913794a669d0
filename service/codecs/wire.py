"""Either tensor form of the contract <-> numpy arrays, and what an answer costs to encode."""

from collections.abc import Iterator
from typing import Any, Literal

import numpy as np
import orjson

from api_schemas.requests import OutputFormat
from api_schemas.tensors import JsonTensor, ProtoTensor
from service.codecs.dtypes import ElementType, element_type_of
from service.codecs.json_encode import (
    CHUNK_ELEMENTS,
    check_texts,
    json_data,
    json_data_chunks,
    json_element_bytes,
)
from service.codecs.json_tensor import decode_json
from service.codecs.limits import SMALL_BYTES, Limits
from service.codecs.tensor_proto import (
    CHUNK_BYTES,
    decode_tensor_proto,
    encode_tensor_proto,
    tensor_proto_answer_bytes,
    tensor_proto_chunks,
    tensor_proto_chunks_length,
)
from service.errors import located

STREAM_BYTES = SMALL_BYTES
"""Outputs of at least this many bytes (not strings) are encoded chunk by chunk as they are
sent, when they run off the event loop: the answer is then never held whole."""

_ANSWER_OVERHEAD = 512  # op_type, version, the output's name, dtype and shape


class Streamed:
    """A value of the answer whose JSON text comes later, in chunks (see answer_chunks)."""

    __slots__ = ("chunks", "length")

    def __init__(self, chunks: Iterator[bytes], length: int | None = None) -> None:
        self.chunks = chunks
        self.length = length  # of all the chunks together, when known before they are made


def decode_tensor(wire: JsonTensor | ProtoTensor, limits: Limits) -> np.ndarray:
    """The array of a tensor in either form."""
    if isinstance(wire, ProtoTensor):
        with located("tensor_proto"):
            return decode_tensor_proto(wire.tensor_proto, limits)
    return decode_json(wire, limits)


def encode_tensor(
    array: np.ndarray, output_format: OutputFormat, stream: bool = False
) -> dict[str, Any]:
    """The wire form of an array: JSON (data may be a numpy array or Fragment for orjson) or
    base64 proto. With `stream`, a large array's data is a Streamed value instead."""
    et = element_type_of(array)
    streamed = stream and streams(et, array.nbytes, output_format)
    if output_format == "tensor_proto":
        if streamed:
            chunks = tensor_proto_chunks(array)
            return {"tensor_proto": Streamed(chunks, tensor_proto_chunks_length(array))}
        return {"tensor_proto": encode_tensor_proto(array)}
    if streamed and et.kind == "O":
        check_texts(array)  # a refusal once the answer has started could not be sent
    data = Streamed(json_data_chunks(array, et)) if streamed else json_data(array, et)
    return {"dtype": et.name, "shape": list(array.shape), "data": data}


def streams(et: ElementType, nbytes: int, output_format: str = "json") -> bool:
    """Whether an output is streamed (when off the event loop). Strings (`nbytes`: their
    pointers) stream as JSON only: their text is made a chunk of elements at a time, so no
    orjson call holds the GIL for long."""
    if et.kind == "O" and output_format not in ("json", "v2_json"):
        return False
    return nbytes >= STREAM_BYTES


AnswerForm = OutputFormat | Literal["v2_json", "v2_binary"]
"""How an answer is encoded: v1's two forms, V2 JSON (built whole, as v1 JSON text) and V2
binary data (the raw bytes, sent from the output's own memory)."""


def answer_bytes(
    et: ElementType, count: int, rank: int, payload_bytes: int, output_format: AnswerForm
) -> int:
    """The most bytes the answer for one output of `count` elements can take, before it is
    computed (`payload_bytes`: the UTF-8 bytes of strings). JSON writes up to 6 bytes per
    UTF-8 byte of a string (`\\u0001`) and up to 25 per double; base64 writes 4 per 3."""
    if output_format == "v2_binary":  # strings: a 4-byte length before each
        raw = 4 * count + payload_bytes if et.kind == "O" else et.raw_nbytes(count)
        return raw + _ANSWER_OVERHEAD
    if output_format == "tensor_proto":
        if et.kind == "O":
            return tensor_proto_answer_bytes(payload_bytes, rank, count) + _ANSWER_OVERHEAD
        return tensor_proto_answer_bytes(et.raw_nbytes(count), rank) + _ANSWER_OVERHEAD
    return count * json_element_bytes(et) + 6 * payload_bytes + 11 * rank + _ANSWER_OVERHEAD


def answer_memory(
    et: ElementType, count: int, rank: int, payload_bytes: int, output_format: AnswerForm
) -> int:
    """The memory encoding the answer holds beside the output itself: a few chunks when it
    is streamed (one being sent, the next being encoded), else the whole text and its copies."""
    if output_format == "v2_binary":  # a view of the output, but strings and packed types copy
        if et.kind != "O" and et.bits >= 8:
            return 0
        copies = 2 if et.kind == "O" else 1  # strings: encoded in chunks, then joined
        return copies * answer_bytes(et, count, rank, payload_bytes, output_format)
    nbytes = et.raw_nbytes(count) if et.kind != "O" else 8 * count
    if et.kind != "O" and streams(et, nbytes, output_format):  # strings: held whole, below
        chunk = (4 * CHUNK_BYTES // 3 if output_format == "tensor_proto"
                 else CHUNK_ELEMENTS * json_element_bytes(et) * (2 if et.kind == "c" else 1))  # fmt: skip
        return 3 * chunk  # one being encoded, one being sent, one in the socket's buffer
    text = answer_bytes(et, count, rank, payload_bytes, output_format)
    if output_format == "tensor_proto":  # the message, its serialization, base64, the answer
        return nbytes + payload_bytes + nbytes + payload_bytes + 2 * text
    return text + 8 * count  # the answer; strings go through a list first


class Chunks:
    """An answer in chunks, and its length when it is known before they are made. A chunk may
    be a memoryview of an output's own memory (V2 binary data): uvicorn writes any bytes-like
    body as it is, so a large output is sent without a copy."""

    __slots__ = ("chunks", "length")

    def __init__(self, chunks: Iterator[bytes | memoryview], length: int | None) -> None:
        self.chunks = chunks
        self.length = length


def encode_answer(content: dict[str, Any], dumps: Any,
                  tensors: list[dict[str, Any]] | None = None) -> bytes | Chunks:  # fmt: skip
    """The JSON text of an answer (`dumps(content)`), or where its tensors hold Streamed
    values, that text in chunks, theirs encoded as they are taken. The tensors are the dicts
    of `content["outputs"]` and of its `trace` values, unless given."""
    streamed: list[Streamed] = []
    if tensors is None:
        tensors = [*content["outputs"].values(),
                   *(e["value"] for e in content.get("trace", ()))]  # fmt: skip
    for tensor in tensors:
        for key, value in tensor.items():
            if isinstance(value, Streamed):
                tensor[key] = orjson.Fragment(b"\x00%d\x00" % len(streamed))
                streamed.append(value)
    text = dumps(content)
    if not streamed:
        return text
    lengths = [value.length for value in streamed]
    markers = sum(len(b"\x00%d\x00" % i) for i in range(len(streamed)))
    known = None if None in lengths else len(text) - markers + sum(lengths)  # type: ignore[arg-type]
    return Chunks(_chunks(text, streamed), known)


def _chunks(text: bytes, streamed: list[Streamed]) -> Iterator[bytes]:
    for i, value in enumerate(streamed):  # a NUL byte is never in orjson's own text
        before, _, text = text.partition(b"\x00%d\x00" % i)
        yield before
        yield from value.chunks
    yield text
