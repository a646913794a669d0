"""Hostile payloads: each is refused with its typed error and a message naming the field."""

import json
import tracemalloc
from pathlib import Path

import numpy as np
import pybase64
import pydantic
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, numpy_helper

from api_schemas.tensors import JsonTensor
from service.codecs.json_tensor import decode_json
from service.codecs.limits import Limits
from service.codecs.tensor_proto import decode_tensor_proto
from service.errors import InvalidInput, PayloadTooLarge, ServiceError

LIMITS = Limits()
SECRET = b"TOP-SECRET-0123456789abcdef"  # 27 bytes; its text must never reach an error


def b64(tensor: TensorProto) -> str:
    return pybase64.b64encode(tensor.SerializeToString()).decode()


def refused(payload: str | bytes, error: type[ServiceError], *words: str, limits: Limits = LIMITS):
    """decode_tensor_proto(payload) raises `error` and its text holds every word."""
    with pytest.raises(error) as info:
        decode_tensor_proto(payload, limits)
    assert type(info.value) is error
    for word in words:
        assert word in str(info.value)
    return info.value


def _chain_text(exc: BaseException | None) -> str:
    """Every message and argument of an exception and of its causes and contexts."""
    text = ""
    while exc is not None:
        text += repr(exc) + str(exc) + repr(exc.args)
        exc = exc.__cause__ or exc.__context__
    return text


# --- external data -------------------------------------------------------------------


def _external(location: str, *, data_location: int = TensorProto.EXTERNAL) -> TensorProto:
    tensor = TensorProto(data_type=TensorProto.UINT8, dims=[len(SECRET)])
    tensor.data_location = data_location  # type: ignore[assignment]
    for key, value in (("location", location), ("offset", "0"), ("length", str(len(SECRET)))):
        entry = tensor.external_data.add()
        entry.key, entry.value = key, value
    return tensor


@pytest.mark.parametrize("data_location", [TensorProto.EXTERNAL, TensorProto.DEFAULT])
def test_external_data_refused_and_file_never_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, data_location: int
) -> None:
    (tmp_path / "weights.bin").write_bytes(SECRET)
    monkeypatch.chdir(tmp_path)
    tensor = _external("weights.bin", data_location=data_location)
    if data_location == TensorProto.EXTERNAL:  # the payload is real: onnx would read the file
        assert numpy_helper.to_array(tensor).tobytes() == SECRET
    error = refused(b64(tensor), InvalidInput, "external data")
    text = _chain_text(error)
    assert SECRET.decode() not in text and "TOP-SECRET" not in text
    assert str(list(SECRET[:8]))[1:-1] not in text  # nor the bytes as numbers


def test_external_data_with_absolute_path_refused(tmp_path: Path) -> None:
    secret = tmp_path / "secret.bin"
    secret.write_bytes(SECRET)
    error = refused(b64(_external(str(secret))), InvalidInput, "external data")
    assert "TOP-SECRET" not in _chain_text(error)


# --- sizes: dims, raw_data, typed fields -------------------------------------------------


def test_billion_dims_over_the_limit_refused_as_too_large() -> None:
    tensor = TensorProto(data_type=TensorProto.DOUBLE, dims=[10**9], raw_data=b"\0" * 8)
    refused(b64(tensor), PayloadTooLarge, "dims", "1000000000")


def test_billion_dims_do_not_allocate() -> None:
    # with a limit that lets the count through, the raw_data length check must still come
    # before any allocation of 8 GB
    generous = Limits(max_elements=10**12)
    payload = b64(TensorProto(data_type=TensorProto.DOUBLE, dims=[10**9], raw_data=b"\0" * 8))
    tracemalloc.start()
    try:
        refused(payload, InvalidInput, "raw_data", "8 bytes", limits=generous)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 1_000_000


@pytest.mark.parametrize("dims", [[2**62, 2**62, 0], [0, 2**63 - 1], [2**40, 0, 2**40]])
def test_empty_shape_with_huge_dims_refused(dims: list[int]) -> None:
    # numpy cannot build these even empty ("array is too big"): refused before it tries
    tensor = TensorProto(data_type=TensorProto.FLOAT, dims=dims)
    refused(b64(tensor), PayloadTooLarge, "dims", "zeros as 1")
    with pytest.raises(PayloadTooLarge) as info:
        decode_json(JsonTensor(dtype="float", shape=dims, data=[]), LIMITS)
    assert info.value.loc == ("shape",)


def test_empty_shape_within_the_limit_decodes() -> None:
    tensor = TensorProto(data_type=TensorProto.FLOAT, dims=[0, 10, 0])
    assert decode_tensor_proto(b64(tensor), Limits(max_elements=10)).shape == (0, 10, 0)


def test_huge_python_ints_in_a_shape_do_not_break_the_message() -> None:
    with pytest.raises(PayloadTooLarge, match="bit number"):
        decode_json(JsonTensor(dtype="float", shape=[10**5000, 0], data=[]), LIMITS)
    with pytest.raises(InvalidInput, match="negative"):
        decode_json(JsonTensor.model_construct(dtype="float", shape=[10**5000, -1], data=[]),
                    LIMITS)  # fmt: skip


@pytest.mark.parametrize(
    ("data_type", "dims", "nbytes"),
    [(TensorProto.FLOAT, [3], 8), (TensorProto.FLOAT, [3], 16), (TensorProto.INT4, [3], 1),
     (TensorProto.INT4, [3], 3), (TensorProto.UINT2, [5], 1), (TensorProto.COMPLEX64, [1], 4),
     (TensorProto.FLOAT, [], 0), (TensorProto.BOOL, [0], 1)],
)  # fmt: skip
def test_raw_data_length_disagreeing_with_dims(data_type: int, dims: list, nbytes: int) -> None:
    tensor = TensorProto(data_type=data_type, dims=dims, raw_data=b"\1" * nbytes)
    refused(b64(tensor), InvalidInput, "raw_data", f"{nbytes} bytes", str(dims))


@pytest.mark.parametrize(
    ("fields", "field"),
    [({"data_type": TensorProto.FLOAT, "dims": [3], "float_data": [1, 2]}, "float_data"),
     ({"data_type": TensorProto.COMPLEX64, "dims": [2], "float_data": [1, 2, 3]}, "float_data"),
     ({"data_type": TensorProto.INT64, "dims": [2, 2], "int64_data": [1]}, "int64_data"),
     ({"data_type": TensorProto.INT4, "dims": [3], "int32_data": [1, 2, 3]}, "int32_data"),
     ({"data_type": TensorProto.UINT64, "dims": [1], "uint64_data": [1, 2]}, "uint64_data"),
     ({"data_type": TensorProto.DOUBLE, "dims": [2]}, "double_data"),
     ({"data_type": TensorProto.STRING, "dims": [3], "string_data": [b"a"]}, "string_data")],
)  # fmt: skip
def test_typed_field_count_disagreeing_with_dims(fields: dict, field: str) -> None:
    refused(b64(TensorProto(**fields)), InvalidInput, field, "entries", "need")


@pytest.mark.parametrize(
    ("fields", "field"),
    [({"data_type": TensorProto.INT32, "dims": [1], "float_data": [1]}, "int32_data"),
     ({"data_type": TensorProto.FLOAT, "dims": [1], "float_data": [1], "raw_data": b"\0" * 4},
      "raw_data, float_data"),
     ({"data_type": TensorProto.STRING, "dims": [1], "raw_data": b"a"}, "string_data")],
)  # fmt: skip
def test_data_in_the_wrong_field(fields: dict, field: str) -> None:
    refused(b64(TensorProto(**fields)), InvalidInput, field)


@pytest.mark.parametrize(
    ("data_type", "entry"),
    [(TensorProto.INT8, 128), (TensorProto.UINT8, -1), (TensorProto.UINT16, 65536),
     (TensorProto.BOOL, 2), (TensorProto.FLOAT16, 65536), (TensorProto.FLOAT8E4M3FN, 256),
     (TensorProto.INT4, 256), (TensorProto.FLOAT16, -1)],
)  # fmt: skip
def test_int32_data_entries_out_of_range_refused_not_wrapped(data_type: int, entry: int) -> None:
    tensor = TensorProto(data_type=data_type, dims=[1], int32_data=[entry])
    refused(b64(tensor), InvalidInput, "int32_data", str(entry))


def test_uint32_in_uint64_data_out_of_range() -> None:
    tensor = TensorProto(data_type=TensorProto.UINT32, dims=[1], uint64_data=[2**32])
    refused(b64(tensor), InvalidInput, "uint64_data", str(2**32))


@pytest.mark.parametrize("dims", [[-1], [2, -3], [-(2**63)]])
def test_negative_dims(dims: list) -> None:
    refused(
        b64(TensorProto(data_type=TensorProto.FLOAT, dims=dims)), InvalidInput, "dims", "negative"
    )


def test_rank_over_the_limit() -> None:
    refused(b64(TensorProto(data_type=TensorProto.FLOAT, dims=[1] * 65, raw_data=b"\0" * 4)),
            InvalidInput, "dims", "rank 65")  # fmt: skip


def test_element_count_over_limit_in_proto() -> None:
    tensor = TensorProto(data_type=TensorProto.UINT8, dims=[11], raw_data=b"\0" * 11)
    refused(b64(tensor), PayloadTooLarge, "dims", "11 elements", limits=Limits(max_elements=10))


def test_strings_over_the_byte_limit_in_proto() -> None:
    tensor = TensorProto(data_type=TensorProto.STRING, dims=[2], string_data=[b"abc", b"de"])
    refused(b64(tensor), PayloadTooLarge, "strings", "4 bytes", limits=Limits(max_string_bytes=4))


@pytest.mark.parametrize("data_type", [0, 27, 28, 99, -1])
def test_unknown_data_type_numbers(data_type: int) -> None:
    tensor = TensorProto(data_type=data_type, dims=[1], raw_data=b"\0")
    refused(b64(tensor), InvalidInput, "data_type", str(data_type))


def test_segment_refused() -> None:
    tensor = TensorProto(data_type=TensorProto.FLOAT, dims=[1], raw_data=b"\0" * 4)
    tensor.segment.begin, tensor.segment.end = 0, 1
    refused(b64(tensor), InvalidInput, "segment")


# --- malformed bytes -----------------------------------------------------------------------


@pytest.mark.parametrize("payload", ["not base64!!", "AAA", "AA=A", "é", "QUJD\nRA==", b"\xff\xfe"])
def test_invalid_base64(payload: str | bytes) -> None:
    refused(payload, InvalidInput, "tensor_proto", "base64")


@pytest.mark.parametrize("garbage", [b"\xff\xff\xff\xff", b"\x0a\xff\xff\xff\xff\x0f", b"\x08"])
def test_protobuf_garbage(garbage: bytes) -> None:
    refused(pybase64.b64encode(garbage), InvalidInput, "tensor_proto", "onnx.TensorProto")


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=64))
def test_any_bytes_decode_or_are_refused_cleanly(garbage: bytes) -> None:
    try:
        array = decode_tensor_proto(pybase64.b64encode(garbage), Limits(max_elements=10**6))
    except (InvalidInput, PayloadTooLarge):
        return
    assert isinstance(array, np.ndarray)


# --- JSON ------------------------------------------------------------------------------------


def test_json_nested_100000_deep_refused_by_the_schema() -> None:
    body = '{"dtype": "float", "data": ' + "[" * 100_000 + "]" * 100_000 + "}"
    with pytest.raises(pydantic.ValidationError, match="recursion"):
        JsonTensor.model_validate_json(body)


def test_json_nested_100000_deep_refused_by_decode() -> None:
    deep: list = [1.0]
    for _ in range(100_000):
        deep = [deep]
    with pytest.raises(InvalidInput, match="nested more than 64 levels deep") as info:
        decode_json(JsonTensor(dtype="float", data=deep), LIMITS)
    assert info.value.loc == ("data",)


def test_json_ragged_refused() -> None:
    with pytest.raises(InvalidInput, match="ragged") as info:
        decode_json(JsonTensor(dtype="int32", data=[[1, 2], [3]]), LIMITS)
    assert info.value.loc == ("data",)


def test_json_declared_shape_over_the_limit() -> None:
    with pytest.raises(PayloadTooLarge, match="over the limit") as info:
        decode_json(JsonTensor(dtype="float", shape=[10**6, 10**6], data=[]), LIMITS)
    assert info.value.loc == ("shape",)


def test_json_data_over_the_limit_without_shape() -> None:
    with pytest.raises(PayloadTooLarge, match="11 elements") as info:
        decode_json(JsonTensor(dtype="uint8", data=[0] * 11), Limits(max_elements=10))
    assert info.value.loc == ("data",)


def test_json_negative_shape() -> None:
    with pytest.raises(pydantic.ValidationError):
        JsonTensor.model_validate_json('{"dtype": "float", "shape": [-1], "data": []}')
    built = JsonTensor.model_construct(dtype="float", shape=[-1], data=[])
    with pytest.raises(InvalidInput, match="negative") as info:
        decode_json(built, LIMITS)
    assert info.value.loc == ("shape",)


def test_json_strings_over_the_byte_limit() -> None:
    tensor = JsonTensor.model_validate_json(json.dumps({"dtype": "string", "data": ["é", "abc"]}))
    with pytest.raises(PayloadTooLarge, match="4 bytes") as info:
        decode_json(tensor, Limits(max_string_bytes=4))  # "é" is 2 bytes in UTF-8
    assert info.value.loc == ("data",)
    assert decode_json(tensor, Limits(max_string_bytes=5)).tolist() == ["é", "abc"]


@pytest.mark.parametrize("dtype", [0, 27, "float6e2m3", "FLOAT7"])
def test_json_unknown_dtype(dtype: int | str) -> None:
    with pytest.raises(InvalidInput, match="unknown dtype") as info:
        decode_json(JsonTensor(dtype=dtype, data=[]), LIMITS)
    assert info.value.loc == ("dtype",)


def test_data_in_a_field_of_another_type_is_refused_even_when_empty_dims() -> None:
    tensor = TensorProto(data_type=TensorProto.FLOAT, dims=[0])
    tensor.int32_data.extend([5])
    with pytest.raises(InvalidInput, match="belongs in float_data or raw_data, not int32_data"):
        decode_tensor_proto(b64(tensor), LIMITS)


@pytest.mark.parametrize("body", [
    b'{"dtype": "float", "data": [1, NaN]}',
    b'{"dtype": "double", "data": [1e400]}',
    b'{"dtype": "float16", "data": [-Infinity]}',
    b'{"dtype": "complex64", "data": [[1, 1e999]]}',
])  # fmt: skip
def test_non_finite_numbers_must_be_strings(body: bytes) -> None:
    """The JSON parser takes NaN tokens and overflowing literals; the contract says strings."""
    with pytest.raises(InvalidInput, match="not finite") as caught:
        decode_json(JsonTensor.model_validate_json(body), LIMITS)
    assert caught.value.loc == ("data",)
