"""base64 TensorProto <-> numpy arrays, over onnx.numpy_helper, for untrusted payloads.

Everything that could make onnx read a file or allocate without bound is checked on
the parsed message before onnx.numpy_helper touches it.
"""

import binascii

import numpy as np
import pybase64
from google.protobuf.message import DecodeError
from onnx import TensorProto, numpy_helper

from service.codecs.dtypes import ElementType, by_enum
from service.codecs.limits import Limits
from service.errors import InvalidInput

# The typed field that holds each storage kind when raw_data is absent, and how many
# entries one element takes there (complex numbers are two floats or doubles).
_TYPED_FIELDS = ("float_data", "int32_data", "string_data", "int64_data", "double_data",
                 "uint64_data")  # fmt: skip


def decode_tensor_proto(payload: str | bytes, limits: Limits) -> np.ndarray:
    """Decode base64 of a serialized TensorProto into an array."""
    try:
        serialized = pybase64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise InvalidInput(f"tensor_proto is not valid base64: {exc}") from None
    return parse_tensor_proto(serialized, limits)


def parse_tensor_proto(serialized: bytes, limits: Limits) -> np.ndarray:
    """Parse a serialized TensorProto, check it, and convert it to an array."""
    tensor = TensorProto()
    try:
        tensor.ParseFromString(serialized)
    except (DecodeError, RuntimeError, ValueError) as exc:
        raise InvalidInput(f"tensor_proto is not a serialized onnx.TensorProto: {exc}") from None
    return tensor_to_array(tensor, limits)


def tensor_to_array(tensor: TensorProto, limits: Limits) -> np.ndarray:
    """Check a parsed TensorProto against the limits and convert it."""
    if tensor.data_location == TensorProto.EXTERNAL or len(tensor.external_data):
        raise InvalidInput("tensor_proto uses external data, which the service refuses")
    if tensor.HasField("segment"):
        raise InvalidInput("tensor_proto segments are not supported")
    et = by_enum(tensor.data_type)
    shape = tuple(tensor.dims)
    count = limits.check_shape(shape)
    if tensor.HasField("raw_data"):
        return _from_raw(tensor, et, shape, count)
    _check_typed_fields(tensor, et, count, limits)
    try:
        array = numpy_helper.to_array(tensor)
    except UnicodeDecodeError:
        raise InvalidInput("tensor_proto string_data is not valid UTF-8") from None
    except (ValueError, TypeError) as exc:
        raise InvalidInput(f"tensor_proto cannot be converted: {exc}") from None
    return array


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
    # numpy_helper.to_array would read tensor.raw_data again (a second full copy);
    # this is its own frombuffer over the bytes already in hand.
    return np.frombuffer(raw, dtype=et.np_dtype).reshape(shape)


def _check_typed_fields(tensor: TensorProto, et: ElementType, count: int, limits: Limits) -> None:
    filled = [name for name in _TYPED_FIELDS if len(getattr(tensor, name))]
    if len(filled) > 1:
        raise InvalidInput(f"tensor_proto fills several data fields: {', '.join(filled)}")
    expected_field = _storage_field(et)
    if filled and filled[0] != expected_field:
        raise InvalidInput(f"{et.name} data belongs in {expected_field}, not {filled[0]}")
    entries = len(getattr(tensor, expected_field))
    per_element = 2 if et.kind == "c" else 1
    needed = count * per_element
    if et.bits < 8:  # packed into int32_data entries, one byte's worth each
        needed = et.raw_nbytes(count)
    if entries != needed:
        raise InvalidInput(
            f"{expected_field} has {entries} entries but dims {list(tensor.dims)} of "
            f"{et.name} need {needed}"
        )
    if et.is_string:
        total = sum(len(s) for s in tensor.string_data)
        if total > limits.max_string_bytes:
            raise InvalidInput(f"strings exceed the limit of {limits.max_string_bytes} bytes")


def _storage_field(et: ElementType) -> str:
    from onnx import helper

    return helper.tensor_dtype_to_field(et.enum)


def encode_tensor_proto(array: np.ndarray) -> str:
    """base64 of the serialized TensorProto of an array (raw_data, packed where ONNX packs)."""
    return pybase64.b64encode(array_to_tensor(array).SerializeToString()).decode("ascii")


def array_to_tensor(array: np.ndarray, name: str | None = None) -> TensorProto:
    """numpy_helper.from_array, with strings kept as UTF-8 string_data."""
    return numpy_helper.from_array(array, name=name)
