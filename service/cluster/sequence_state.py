"""A sequence's implicit state as one Redis value: each state tensor an onnx TensorProto
(numpy_helper for numbers, string_data for BYTES, whose items may be any bytes), named by its
state input, each after its length (8 bytes, big-endian)."""

import struct

import numpy as np
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
    """The state tensors of a value encode_state made (read-only arrays)."""
    found: dict[str, np.ndarray] = {}
    view, at = memoryview(value), 0
    while at < len(view):
        if at + _LENGTH.size > len(view):
            raise ServiceError("a sequence state in the cluster store is truncated")
        (size,) = _LENGTH.unpack_from(view, at)
        at += _LENGTH.size
        tensor = TensorProto()
        tensor.ParseFromString(view[at : at + size])
        at += size
        array = _from_strings(tensor) if tensor.data_type == TensorProto.STRING else (
            numpy_helper.to_array(tensor))  # fmt: skip
        array.flags.writeable = False
        found[tensor.name] = array
    return found


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


def state_nbytes(array: np.ndarray) -> int:
    """Bytes an array of state holds (its strings' bytes counted), as sequences.py counts."""
    if array.dtype != object:
        return int(array.nbytes)
    return int(array.nbytes) + sum(
        len(item) for item in array.flat if isinstance(item, str | bytes)
    )
