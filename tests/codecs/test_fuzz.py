"""Hypothesis fuzzing of both codecs (arbitrary bytes, arbitrary JSON), the non-finite
encoder against a plain-Python oracle, streamed chunks against the whole text, and the
encoded-answer bound against real answers."""

import json
import math

import numpy as np
import orjson
import pybase64
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import service.codecs.json_encode as json_encode
from api_schemas.tensors import DTYPE_NAMES, JsonTensor
from service.codecs.dtypes import element_type, element_type_of
from service.codecs.json_encode import encode_json, json_data_chunks, numbers_text
from service.codecs.json_tensor import decode_json
from service.codecs.limits import Limits
from service.codecs.tensor_proto import decode_tensor_proto, encode_tensor_proto
from service.codecs.wire import answer_bytes
from service.errors import ServiceError

LIMITS = Limits(max_elements=1 << 16, max_string_bytes=1 << 16, max_rank=32)
FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=4), inner, max_size=3)
    ),
    max_leaves=30,
)


@FUZZ
@given(payload=st.binary(max_size=300))
def test_tensor_proto_of_arbitrary_bytes_decodes_or_is_refused(payload: bytes) -> None:
    for form in (pybase64.b64encode(payload), payload):  # as base64, and as it is
        try:
            decode_tensor_proto(form, LIMITS)
        except ServiceError as exc:
            assert 400 <= exc.status_code < 500


@FUZZ
@given(
    dtype=st.sampled_from(DTYPE_NAMES),
    data=JSON,
    shape=st.none() | st.lists(st.integers(0, 4), max_size=3),
)
def test_json_tensor_of_arbitrary_json_decodes_or_is_refused(
    dtype: str, data: object, shape: list | None
) -> None:
    try:
        array = decode_json(JsonTensor(dtype=dtype, shape=shape, data=data), LIMITS)
    except ServiceError as exc:
        assert 400 <= exc.status_code < 500
    else:
        assert element_type_of(array).name == dtype


def _oracle(values: np.ndarray) -> list:
    """What the JSON of float values must say, element by element, in plain Python."""
    out = []
    for value in values.astype(np.float64).tolist():
        if math.isnan(value):
            out.append("NaN")
        elif math.isinf(value):
            out.append("Infinity" if value > 0 else "-Infinity")
        else:
            out.append(value)
    return out


FLOATS = hnp.arrays(st.sampled_from([np.float16, np.float32, np.float64]), st.integers(0, 60),
                    elements=st.sampled_from([0.0, -1.5, 3.25, math.nan, math.inf, -math.inf]))  # fmt: skip


@FUZZ
@given(values=FLOATS)
def test_non_finite_text_matches_a_plain_python_oracle(values: np.ndarray) -> None:
    assert json.loads(numbers_text(values)) == _oracle(values)


@FUZZ
@given(values=FLOATS, chunk=st.integers(1, 7))
def test_streamed_data_equals_the_whole_text(
    values: np.ndarray, chunk: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(json_encode, "CHUNK_ELEMENTS", chunk)
    et = element_type_of(values)
    whole = orjson.dumps(encode_json(values)["data"], option=orjson.OPT_SERIALIZE_NUMPY)
    assert b"".join(json_data_chunks(values, et)) == whole


def test_complex_non_finite_pairs() -> None:
    values = np.array([1 + 2j, complex(math.nan, math.inf), complex(-math.inf, 0)], np.complex64)
    data = orjson.dumps(encode_json(values)["data"], option=orjson.OPT_SERIALIZE_NUMPY)
    assert json.loads(data) == [[1.0, 2.0], ["NaN", "Infinity"], ["-Infinity", 0.0]]


NUMERIC = [name for name in DTYPE_NAMES if name != "string"]


@settings(max_examples=100, deadline=None, suppress_health_check=list(HealthCheck))
@given(name=st.sampled_from(NUMERIC), bits=st.lists(st.integers(0, 2**64 - 1), max_size=40))
def test_answer_bound_holds_for_any_bit_pattern(name: str, bits: list[int]) -> None:
    """Any value of the type (random bit patterns: NaNs, infinities, subnormals, extremes)
    encodes within the bound computed before the work, in both forms."""
    et = element_type(name)
    raw = np.array(bits, dtype=np.uint64).view(np.uint8)
    width = max(et.np_dtype.itemsize, 1)
    array = raw[: len(raw) // width * width].view(et.np_dtype) if et.bits >= 8 else None
    if array is None:  # packed 4/2-bit types: every value of the range
        info = {
            "int4": (-8, 7),
            "uint4": (0, 15),
            "int2": (-2, 1),
            "uint2": (0, 3),
            "float4e2m1": (0, 15),
        }
        low, high = info[name]
        array = (np.arange(low, high + 1).astype(et.np_dtype) if name != "float4e2m1"
                 else np.arange(16, dtype=np.uint8).view(np.uint8).astype(np.float32).astype(et.np_dtype))  # fmt: skip
    if et.kind == "b":
        array = array.view(np.uint8) % 2 == 1
    for fmt in ("json", "tensor_proto"):
        answer = (
            encode_json(array) if fmt == "json" else {"tensor_proto": encode_tensor_proto(array)}
        )
        text = orjson.dumps(answer, option=orjson.OPT_SERIALIZE_NUMPY)
        assert len(text) <= answer_bytes(et, array.size, array.ndim, 0, fmt), (name, fmt)  # type: ignore[arg-type]


@pytest.mark.parametrize("text", ["a", "\u0001" * 50, "é" * 20, '"\\'])
def test_answer_bound_holds_for_strings(text: str) -> None:
    array = np.array([text] * 3, dtype=object)
    payload = 3 * len(text.encode())
    for fmt in ("json", "tensor_proto"):
        answer = (
            encode_json(array) if fmt == "json" else {"tensor_proto": encode_tensor_proto(array)}
        )
        assert len(orjson.dumps(answer)) <= answer_bytes(element_type("string"), 3, 1, payload, fmt)


def test_ragged_and_deep_data_say_which_with_the_configured_limit() -> None:
    with pytest.raises(ServiceError, match="ragged") as ragged:
        decode_json(JsonTensor(dtype="float", data=[[1, 2], [3]]), LIMITS)
    assert "rank limit" not in str(ragged.value)
    deep: list = [1]
    for _ in range(65):
        deep = [deep]
    with pytest.raises(
        ServiceError, match="nested more than 64 levels deep, over the rank limit of 32"
    ):
        decode_json(JsonTensor(dtype="float", data=deep), LIMITS)
    at_64: list = [1]
    for _ in range(63):
        at_64 = [at_64]
    with pytest.raises(ServiceError, match="rank 64 exceeds the limit of 32"):
        decode_json(JsonTensor(dtype="float", data=at_64), LIMITS)
