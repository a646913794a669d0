"""A sequence's implicit state as one Redis value: each state tensor an onnx TensorProto
(numpy_helper for numbers, string_data for BYTES, whose items may be any bytes), named by its
state input, each after its length (8 bytes, big-endian)."""

import struct

import numpy as np
from google.protobuf.message import DecodeError
from onnx import TensorProto, numpy_helper

from service.errors import ServiceError

_LENGTH = struct.Struct(">Q")


def encode_state(state: dict[str, np.ndarray]) -> bytes:
    """The state tensors (by state input name) as one value."""
    parts = []
    for name, array in state.items():
        tensor = _strings(name, array) if array.dtype == object else numpy_helper.from_array(
            np.ascontiguousarray(array), name)  # fmt: skip
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
        array = _from_strings(tensor) if tensor.data_type == TensorProto.STRING else (
            numpy_helper.to_array(tensor))  # fmt: skip
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
