"""Triton's binary tensor data extension: raw tensor bytes after the JSON header.

Elements are little-endian and row-major in their native size; BOOL is one byte (0 or 1);
BYTES elements are each a 4-byte little-endian length and that many bytes, any bytes (an
element that is UTF-8 becomes text, as ONNX strings are; one that is not, an image say, stays
bytes and goes back out as it came); the packed 4-bit and 2-bit types use ONNX's packing
(raw_data: the first element in the low bits of the first byte). Every size is checked
against what the body holds before anything is allocated.
"""

import struct
from collections.abc import Sequence
from typing import Any

import numpy as np
from onnx import TensorProto

from service.codecs.dtypes import ElementType, element_type_of, string_wire
from service.codecs.limits import Limits
from service.codecs.sliced import sliced_array
from service.codecs.tensor_proto import array_to_tensor, tensor_to_array
from service.errors import BadRequest, InvalidInput, PayloadTooLarge

_LENGTH = struct.Struct("<I")


def split_body(body: bytes, header_length: int | None) -> tuple[bytes, memoryview]:
    """The JSON header and the binary part of a body (`Inference-Header-Content-Length`)."""
    if header_length is None:
        return body, memoryview(b"")
    if not 0 < header_length <= len(body):
        raise BadRequest(f"Inference-Header-Content-Length {header_length} is not within the "
                         f"{len(body)}-byte body")  # fmt: skip
    return body[:header_length], memoryview(body)[header_length:]


class BinaryReader:
    """Hands out the binary part of a body, tensor by tensor, in the order of the inputs."""

    def __init__(self, data: memoryview) -> None:
        self.data = data
        self.offset = 0

    def take(self, size: int) -> memoryview:
        """The next `size` bytes, refused if the body holds fewer."""
        left = len(self.data) - self.offset
        if size > left:
            raise InvalidInput(f"binary_data_size {size} is more than the {left} bytes of "
                               "binary data left in the body")  # fmt: skip
        chunk = self.data[self.offset : self.offset + size]
        self.offset += size
        return chunk

    def finish(self) -> None:
        """Refuse bytes that no input claimed."""
        left = len(self.data) - self.offset
        if left:
            raise InvalidInput(f"the body has {left} bytes of binary data after the last "
                               "input's binary_data_size")  # fmt: skip


def decode_binary(et: ElementType, shape: list[int], raw: memoryview, limits: Limits) -> np.ndarray:
    """The array of one tensor's binary data."""
    count = limits.check_shape(shape)
    if et.is_string:
        return _strings(raw, count, limits).reshape(shape)
    expected = et.raw_nbytes(count)
    if len(raw) != expected:
        raise InvalidInput(f"binary_data_size is {len(raw)} bytes but shape {list(shape)} of "
                           f"{et.name} needs {expected}")  # fmt: skip
    if et.bits < 8:  # packed: onnx unpacks them, and checks them, as it does raw_data
        tensor = TensorProto(data_type=et.enum, dims=shape, raw_data=bytes(raw))
        return tensor_to_array(tensor, limits)
    if et.kind == "b":  # a byte other than 0 or 1 is not a valid numpy bool
        return np.frombuffer(raw, dtype=np.uint8).reshape(shape) != 0
    return np.frombuffer(raw, dtype=et.wire_dtype).reshape(shape)


STRING_CHUNK = 1 << 16
"""BYTES elements encoded at a time: the small objects one chunk makes are all that exist at
once (6M elements made 12M small bytes objects at once before)."""


def string_decode_memory(count: int, raw: memoryview) -> int:
    """What decoding `count` BYTES elements from `raw` holds: a pointer and a Python object
    per element (49 bytes of header for ASCII text, up to 80 and 4 bytes a character for
    other text) besides the bytes themselves."""
    payload = max(len(raw) - 4 * count, 0)
    ascii_only = not len(raw) or int(np.frombuffer(raw, np.uint8).max()) < 0x80
    return count * 57 + payload if ascii_only else count * 88 + 4 * payload


def _strings(raw: memoryview, count: int, limits: Limits) -> np.ndarray:
    if 4 * count > len(raw):  # before the array of `count` elements is made
        raise InvalidInput(f"BYTES data of {len(raw)} bytes cannot hold {count} elements "
                           "(4-byte length prefixes)")  # fmt: skip
    if len(raw) - 4 * count > limits.max_string_bytes:
        raise PayloadTooLarge(f"strings exceed the limit of {limits.max_string_bytes} bytes")
    same = _same_length(raw, count)
    if same is not None:
        return same
    out = np.empty(count, dtype=object)
    offset = 0
    for i in range(count):
        if offset + 4 > len(raw):
            raise InvalidInput(f"BYTES element {i} has no length prefix: the data ends first")
        (size,) = _LENGTH.unpack_from(raw, offset)
        offset += 4
        if size > len(raw) - offset:
            raise InvalidInput(f"BYTES element {i} says {size} bytes, past the end of its data")
        element = bytes(raw[offset : offset + size])
        try:
            out[i] = element.decode("utf-8")
        except UnicodeDecodeError:
            out[i] = element  # arbitrary bytes: kept as they are
        offset += size
    if offset != len(raw):
        raise InvalidInput(f"BYTES data has {len(raw) - offset} bytes after its {count} elements")
    return out


def _same_length(raw: memoryview, count: int) -> np.ndarray | None:
    """ASCII elements that all have one length, decoded by numpy a chunk at a time rather than
    one by one in Python (10 times faster; the GIL is let go between chunks). None when they
    are not all alike, or one is not ASCII or ends in a NUL (numpy's fixed-width bytes would
    drop it): the general loop then decodes them."""
    if not count or (len(raw) - 4 * count) % count:
        return None
    width = (len(raw) - 4 * count) // count
    if not width:
        return None
    rows = np.frombuffer(raw, np.uint8).reshape(count, 4 + width)
    out = np.empty(count, dtype=object)
    for start in range(0, count, STRING_CHUNK):
        part = rows[start : start + STRING_CHUNK]
        lengths = np.ascontiguousarray(part[:, :4]).view("<u4")
        text = part[:, 4:]
        if not (lengths == width).all() or not text[:, -1].all() or (text >= 0x80).any():
            return None
        fixed = np.ascontiguousarray(text).view(f"S{width}").reshape(len(part))
        out[start : start + len(part)] = fixed.astype(f"U{width}")
    return out


def _encode_strings(array: np.ndarray) -> bytes:
    chunks = []
    flat = array.reshape(-1)
    for start in range(0, len(flat), STRING_CHUNK):
        parts: list[bytes] = []
        for element in flat[start : start + STRING_CHUNK]:
            data = string_wire(element)
            parts += (_LENGTH.pack(len(data)), data)
        chunks.append(b"".join(parts))
        del parts
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


SMALL_COPY_BYTES = 16384
"""Up to this size a numeric array's binary data is a copy (bytes): 0.1 us for a 96-byte
array, where the view of a large one costs 1.4 us to make."""


def encode_binary(array: np.ndarray) -> bytes | memoryview:
    """The binary data of an array, as `decode_binary` reads it: a view of the array's own
    memory where its layout is already the wire's (no copy of a large output), bytes for a
    small one."""
    et = element_type_of(array)
    if et.is_string:
        return _encode_strings(array)
    if et.bits < 8:
        return array_to_tensor(array).raw_data
    if et.kind == "b":
        return np.ascontiguousarray(array, dtype=np.uint8).tobytes()
    if array.nbytes <= SMALL_COPY_BYTES:  # one small copy costs less than making the view
        return array.astype(et.wire_dtype, copy=False).tobytes()
    wire = np.ascontiguousarray(array, dtype=et.wire_dtype)
    return wire.reshape(-1).view(np.uint8).data


def pack_values(et: ElementType, values: Sequence[Any]) -> bytes:
    """The binary data of a tensor given as a flat sequence of its elements in a wider container
    (gRPC's typed contents: INT8 and INT16 in int32s, UINT8 and UINT16 in uint32s, BYTES
    elements as bytes). A value out of its type's range is refused, not wrapped."""
    if et.is_string:
        return b"".join(_LENGTH.pack(len(element)) + element for element in values)
    if et.kind == "b":
        return sliced_array(values, np.dtype(np.bool_)).view(np.uint8).tobytes()
    wide = sliced_array(values, np.dtype(_CONTAINERS.get(et.name, et.np_dtype)))
    if wide.dtype != et.np_dtype and wide.size:
        info = np.iinfo(et.np_dtype)
        low, high = int(wide.min()), int(wide.max())
        if low < info.min or high > info.max:
            bad = low if low < info.min else high
            raise InvalidInput(f"{bad} is out of the range of {et.name} [{info.min}, {info.max}]")
    return wide.astype(et.wire_dtype, copy=False).tobytes()


_CONTAINERS = {"int8": np.int32, "int16": np.int32, "uint8": np.uint32, "uint16": np.uint32}
