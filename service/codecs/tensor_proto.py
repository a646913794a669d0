"""base64 TensorProto <-> numpy arrays, over onnx.numpy_helper, for untrusted payloads.

Everything that could make onnx read a file or allocate without bound is checked on
the parsed message before onnx.numpy_helper touches it.
"""

import binascii
from collections.abc import Iterator

import ml_dtypes
import numpy as np
import pybase64
from google.protobuf.message import DecodeError
from onnx import TensorProto, helper, numpy_helper

from service.codecs.dtypes import ElementType, by_enum, element_type_of
from service.codecs.limits import Limits
from service.errors import InvalidInput, PayloadTooLarge, located

_TYPED_FIELDS = ("float_data", "int32_data", "string_data", "int64_data", "double_data",
                 "uint64_data")  # fmt: skip


def decode_tensor_proto(payload: str | bytes, limits: Limits) -> np.ndarray:
    """Decode base64 of a serialized TensorProto into an array."""
    # The decoded bytes are dropped once parsed, before raw_data is copied out of the
    # message: that keeps one payload-sized buffer alive at a time, not two.
    return tensor_to_array(_parse(_b64decode(payload)), limits)


def _b64decode(payload: str | bytes) -> bytes:
    try:
        return pybase64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise InvalidInput(f"tensor_proto is not valid base64: {exc}") from None


def _parse(serialized: bytes) -> TensorProto:
    tensor = TensorProto()
    try:
        tensor.ParseFromString(serialized)
    except (DecodeError, RuntimeError, ValueError) as exc:
        raise InvalidInput(f"tensor_proto is not a serialized onnx.TensorProto: {exc}") from None
    return tensor


def tensor_to_array(tensor: TensorProto, limits: Limits) -> np.ndarray:
    """Check a parsed TensorProto against the limits and convert it."""
    if tensor.data_location == TensorProto.EXTERNAL or len(tensor.external_data):
        raise InvalidInput("tensor_proto uses external data, which the service refuses")
    if tensor.HasField("segment"):
        raise InvalidInput("tensor_proto segments are not supported")
    et = by_enum(tensor.data_type)
    shape = tuple(tensor.dims)
    with located("dims"):
        count = limits.check_shape(shape)
    filled = [name for name in _TYPED_FIELDS if len(getattr(tensor, name))]
    if tensor.HasField("raw_data"):
        filled.insert(0, "raw_data")
    if len(filled) > 1:
        raise InvalidInput(f"tensor_proto fills several data fields: {', '.join(filled)}")
    if filled == ["raw_data"]:
        return _from_raw(tensor, et, shape, count)
    field = helper.tensor_dtype_to_field(et.enum)
    if filled and filled != [field]:
        raise InvalidInput(f"{et.name} data belongs in {field} or raw_data, not {filled[0]}")
    _check_typed_field(tensor, et, field, count, limits)
    if et.is_string:
        return _strings(tensor, shape)
    try:
        return numpy_helper.to_array(tensor)
    except (ValueError, TypeError) as exc:
        raise InvalidInput(f"tensor_proto cannot be converted: {exc}") from None


def _from_raw(tensor: TensorProto, et: ElementType, shape: tuple, count: int) -> np.ndarray:
    if et.is_string:
        raise InvalidInput("string tensors carry string_data, not raw_data")
    raw = tensor.raw_data  # upb copies the field on every access: read it once
    expected = et.raw_nbytes(count)
    if len(raw) != expected:
        raise InvalidInput(
            f"raw_data has {len(raw)} bytes but dims {list(shape)} of {et.name} need {expected}"
        )
    if et.bits < 8:  # packed 4-bit and 2-bit types: numpy_helper unpacks them
        return numpy_helper.to_array(tensor)
    if et.kind == "b":  # a byte other than 0 or 1 is not a valid numpy bool
        return np.frombuffer(raw, dtype=np.uint8).reshape(shape) != 0
    # numpy_helper.to_array would read tensor.raw_data again (a second full copy);
    # this is its own frombuffer over the bytes already in hand (read-only, no copy).
    return np.frombuffer(raw, dtype=et.wire_dtype).reshape(shape)


def _strings(tensor: TensorProto, shape: tuple) -> np.ndarray:
    # Not numpy_helper.to_array: it goes through a numpy unicode array, which drops
    # trailing NUL characters ("a\x00" comes back as "a").
    array = np.empty(len(tensor.string_data), dtype=object)
    try:
        array[:] = [s.decode("utf-8") for s in tensor.string_data]
    except UnicodeDecodeError:
        raise InvalidInput("tensor_proto string_data is not valid UTF-8") from None
    return array.reshape(shape)


def _check_typed_field(
    tensor: TensorProto, et: ElementType, field: str, count: int, limits: Limits
) -> None:
    entries = getattr(tensor, field)
    needed = et.raw_nbytes(count) if et.bits < 8 else count * (2 if et.kind == "c" else 1)
    if len(entries) != needed:  # packed types hold one byte's worth per int32_data entry
        raise InvalidInput(
            f"{field} has {len(entries)} entries but dims {list(tensor.dims)} of "
            f"{et.name} need {needed}"
        )
    if et.is_string:
        if sum(len(s) for s in entries) > limits.max_string_bytes:
            raise PayloadTooLarge(f"strings exceed the limit of {limits.max_string_bytes} bytes")
        return
    bounds = _entry_bounds(et)
    if bounds and needed:
        values = np.array(entries, dtype=np.uint64 if field == "uint64_data" else np.int64)
        low, high = int(values.min()), int(values.max())
        if low < bounds[0] or high > bounds[1]:
            bad = low if low < bounds[0] else high
            raise InvalidInput(f"{field} entry {bad} is out of [{bounds[0]}, {bounds[1]}] for "
                               f"{et.name}; numpy_helper would wrap it")  # fmt: skip


def _entry_bounds(et: ElementType) -> tuple[int, int] | None:
    """Range of one int32_data/uint64_data entry where the field is wider than the type."""
    if et.bits < 8 or (et.kind == "f" and et.bits < 32):  # packed bytes, or bit patterns
        return 0, 2 ** max(et.bits, 8) - 1
    if et.kind == "b":
        return 0, 1
    if et.kind == "i" and (et.bits < 32 or et.enum == TensorProto.UINT32):
        info = ml_dtypes.iinfo(et.np_dtype)
        return int(info.min), int(info.max)
    return None


def encode_tensor_proto(array: np.ndarray) -> str:
    """base64 of the serialized TensorProto of an array (raw_data, packed where ONNX packs)."""
    return pybase64.b64encode_as_string(array_to_tensor(array).SerializeToString())


def array_to_tensor(array: np.ndarray, name: str | None = None) -> TensorProto:
    """numpy_helper.from_array, with strings kept as UTF-8 string_data."""
    return numpy_helper.from_array(array, name=name)


CHUNK_BYTES = 3 * 1024 * 1024
"""Serialized bytes per base64 chunk of a streamed answer (a multiple of 3: no padding inside)."""
_RAW_DATA_TAG = b"\x4a"  # field 9 (raw_data), wire type 2 (length-delimited)


def tensor_proto_chunks(array: np.ndarray) -> Iterator[bytes]:
    """The JSON string (quotes included) of `encode_tensor_proto(array)`, in chunks, for an
    array that is not strings: the same bytes, but the serialized message is never built whole.
    Protobuf writes fields in number order, so the message is its dims and data_type, then
    raw_data's tag and length, then the raw bytes themselves, read straight from the array."""
    et = element_type_of(array)
    if et.bits < 8:  # packed 4-bit and 2-bit types: numpy_helper packs them (half the size)
        raw = memoryview(array_to_tensor(array).raw_data)
    else:
        if array.dtype.byteorder == ">":
            array = array.astype(array.dtype.newbyteorder("<"))
        # a byte view: memoryview cannot take ml_dtypes' types (bfloat16, float8) directly
        raw = np.ascontiguousarray(array).reshape(-1).view(np.uint8).data
    header = TensorProto(dims=array.shape, data_type=et.enum).SerializeToString()
    head = header + _RAW_DATA_TAG + varint(len(raw))
    split = (-len(head)) % 3  # the first chunk ends on a multiple of 3 bytes
    yield b'"' + pybase64.b64encode(head + raw[:split])
    for start in range(split, len(raw), CHUNK_BYTES):
        yield pybase64.b64encode(raw[start : start + CHUNK_BYTES])
    yield b'"'


def tensor_proto_chunks_length(array: np.ndarray) -> int:
    """The total length of what tensor_proto_chunks(array) yields (quotes included)."""
    et = element_type_of(array)
    raw = et.raw_nbytes(array.size)
    header = TensorProto(dims=array.shape, data_type=et.enum).SerializeToString()
    serialized = len(header) + len(_RAW_DATA_TAG) + len(varint(raw)) + raw
    return 4 * ((serialized + 2) // 3) + 2


def tensor_proto_answer_bytes(nbytes: int, rank: int, count: int = 0) -> int:
    """The most bytes the base64 JSON string of a tensor of `nbytes` data bytes (raw, or
    string UTF-8 over `count` strings) and `rank` dims can take."""
    serialized = nbytes + 11 * rank + 32 + 6 * count  # tags, varints, data_type
    return 4 * (serialized // 3 + 1) + 2


def varint(value: int) -> bytes:
    """A non-negative integer as protobuf's base-128 varint."""
    out = bytearray()
    while value > 0x7F:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)
