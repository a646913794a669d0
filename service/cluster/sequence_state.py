"""A sequence's implicit state as one Redis value: each state tensor an onnx TensorProto
(numpy_helper for numbers, string_data for BYTES, whose items may be any bytes), named by its
state input, each after its length (8 bytes, big-endian)."""

import struct
import sys

import numpy as np
from google.protobuf.message import DecodeError
from onnx import TensorProto, helper, numpy_helper

from service.errors import ServiceError

_LENGTH = struct.Struct(">Q")
# Types numpy holds as the tensor's raw_data holds them (little-endian, one item after another):
# made and read here directly, the bytes numpy_helper makes, without its general conversion
# (a one-item state: 10 -> 5 us to write, 17 -> 10 us to read); the others go through it.
_RAW: dict[int, np.dtype] = {code: np.dtype(helper.tensor_dtype_to_np_dtype(code)) for code in (
    TensorProto.FLOAT, TensorProto.DOUBLE, TensorProto.FLOAT16, TensorProto.BOOL,
    TensorProto.INT8, TensorProto.INT16, TensorProto.INT32, TensorProto.INT64,
    TensorProto.UINT8, TensorProto.UINT16, TensorProto.UINT32, TensorProto.UINT64,
)} if sys.byteorder == "little" else {}  # fmt: skip
_CODES = {dtype: code for code, dtype in _RAW.items()}


def encode_state(state: dict[str, np.ndarray]) -> bytes:
    """The state tensors (by state input name) as one value."""
    parts = []
    for name, array in state.items():
        code = _CODES.get(array.dtype)
        if code is not None:
            tensor = TensorProto(name=name, data_type=code, dims=array.shape,
                                 raw_data=array.tobytes())  # fmt: skip
        elif array.dtype == object:
            tensor = _strings(name, array)
        else:
            tensor = numpy_helper.from_array(np.ascontiguousarray(array), name)
        serialized = tensor.SerializeToString()
        parts += [_LENGTH.pack(len(serialized)), serialized]
    return b"".join(parts)


def decode_state(value: bytes) -> dict[str, np.ndarray]:
    """The state tensors of a value encode_state made (read-only arrays). A value it cannot
    read (cut short, written by something else, a tensor pointing at external data, which is
    never read from disk) is a ServiceError (500) that says so and how to go on, where a
    parser's own error would be an unexplained 500."""
    try:
        return _decoded(value)
    except (DecodeError, ValueError, TypeError) as exc:
        raise _unreadable(str(exc)[:200]) from None


def _decoded(value: bytes) -> dict[str, np.ndarray]:
    found: dict[str, np.ndarray] = {}
    view, at = memoryview(value), 0
    while at < len(view):
        if at + _LENGTH.size > len(view):
            raise _unreadable("it is truncated")
        (size,) = _LENGTH.unpack_from(view, at)
        at += _LENGTH.size
        if at + size > len(view):
            raise _unreadable("it is truncated")
        tensor = TensorProto()
        tensor.ParseFromString(view[at : at + size])
        at += size
        if tensor.data_location == TensorProto.EXTERNAL or tensor.external_data:
            raise _unreadable(f"its tensor {tensor.name[:100]!r} names external data")
        dtype = _RAW.get(tensor.data_type)
        if dtype is not None and tensor.HasField("raw_data"):
            array = np.frombuffer(tensor.raw_data, dtype).reshape(tuple(tensor.dims))
        elif tensor.data_type == TensorProto.STRING:
            array = _from_strings(tensor)
        else:
            array = numpy_helper.to_array(tensor)
        array.flags.writeable = False
        found[tensor.name] = array
    return found


def _unreadable(why: str) -> ServiceError:
    return ServiceError(f"the sequence's state in the cluster store cannot be read ({why}); "
                        "start the sequence again (a request with the START flag)")  # fmt: skip


def _strings(name: str, array: np.ndarray) -> TensorProto:
    tensor = TensorProto(name=name, data_type=TensorProto.STRING, dims=array.shape)
    tensor.string_data.extend(item if isinstance(item, bytes) else str(item).encode()
                              for item in array.flat)  # fmt: skip
    return tensor


def _from_strings(tensor: TensorProto) -> np.ndarray:
    # Not numpy_helper.to_array: it decodes every item as UTF-8 (any bytes may be a state's)
    # and drops trailing NULs. Text comes back as str, as the model produced it; other bytes
    # as bytes.
    items = np.empty(len(tensor.string_data), dtype=object)
    items[:] = [_text(item) for item in tensor.string_data]
    return items.reshape(tuple(tensor.dims))


def _text(item: bytes) -> str | bytes:
    try:
        return item.decode()
    except UnicodeDecodeError:
        return item
