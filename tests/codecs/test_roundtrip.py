"""Round trips of every element type through both tensor forms, against onnx as the oracle.

ndarray -> JSON (real orjson bytes) -> ndarray and ndarray -> TensorProto -> ndarray are
bit-exact, with one documented exception: JSON carries a single "NaN", so a NaN comes
back as a NaN of the type but not necessarily with the same sign and payload bits.
"""

import json
import math

import ml_dtypes
import numpy as np
import orjson
import pybase64
import pydantic
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import array_shapes, arrays
from onnx import TensorProto, helper, numpy_helper

from api_schemas.tensors import JsonTensor
from service.codecs.dtypes import ELEMENT_TYPES, ElementType, element_type
from service.codecs.json_encode import encode_json
from service.codecs.json_tensor import decode_json
from service.codecs.limits import Limits
from service.codecs.tensor_proto import decode_tensor_proto, encode_tensor_proto
from service.errors import InvalidInput

LIMITS = Limits()
SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
SHAPES = array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=5)
UINT_OF_BITS: dict[int, type] = {8: np.uint8, 16: np.uint16, 32: np.uint32, 64: np.uint64}
SPECIALS = (0.0, -0.0, math.inf, -math.inf, math.nan, -math.nan, 1.0, -1.0, 0.5, 6.0, 1e30)


def _ids(et: ElementType) -> str:
    return et.name


# --- strategies ------------------------------------------------------------------------


def _float_bits(dtype: np.dtype) -> st.SearchStrategy[int]:
    """Any bit pattern of a float type, weighted towards the special values of that type."""
    info = ml_dtypes.finfo(dtype)
    specials = [*SPECIALS, float(info.max), float(info.min), float(info.smallest_subnormal),
                float(info.smallest_normal), -float(info.smallest_subnormal)]  # fmt: skip
    with np.errstate(all="ignore"):
        cast = np.array(specials, dtype=np.float64).astype(dtype)
    bits = dtype.itemsize * 8
    special_bits = sorted({int(b) for b in cast.view(UINT_OF_BITS[bits])})
    if dtype == ml_dtypes.float4_e2m1fn:  # one code per byte, in the low 4 bits
        return st.integers(0, 15)
    return st.one_of(st.sampled_from(special_bits), st.integers(0, 2**bits - 1))


def _ints(dtype: np.dtype) -> st.SearchStrategy[int]:
    info = ml_dtypes.iinfo(dtype)
    low, high = int(info.min), int(info.max)
    return st.one_of(st.sampled_from(sorted({low, high, 0, min(1, high), max(-1, low)})),
                     st.integers(low, high))  # fmt: skip


@st.composite
def arrays_of(draw: st.DrawFn, et: ElementType) -> np.ndarray:
    """An array of `et` with a drawn shape (scalars and empty shapes included)."""
    shape = draw(SHAPES)
    dtype = et.np_dtype
    if et.kind == "O":
        text = st.text(st.characters(exclude_categories=["Cs"]), max_size=8)
        flat = draw(st.lists(text, min_size=math.prod(shape), max_size=math.prod(shape)))
        strings = np.empty(len(flat), dtype=object)
        strings[:] = flat
        return strings.reshape(shape)
    if et.kind == "b":
        return draw(arrays(np.bool_, shape))
    if et.kind == "i":
        wide: type = np.uint64 if dtype == np.uint64 else np.int64
        return draw(arrays(wide, shape, elements=_ints(dtype))).astype(dtype)
    if et.kind == "c":
        part = np.dtype(np.float32 if dtype == np.complex64 else np.float64)
        bits = draw(arrays(UINT_OF_BITS[part.itemsize * 8], (*shape, 2),
                           elements=_float_bits(part)))  # fmt: skip
        return bits.view(part).view(dtype).reshape(shape)
    storage = UINT_OF_BITS[dtype.itemsize * 8]
    return draw(arrays(storage, shape, elements=_float_bits(dtype))).view(dtype)


# --- comparison ------------------------------------------------------------------------


def _float_parts(array: np.ndarray) -> np.ndarray:
    """The float components of a float or complex array, flat."""
    flat = array.reshape(-1)
    if flat.dtype.kind == "c":
        flat = flat.view(np.float32 if flat.dtype == np.complex64 else np.float64)
    return flat


def assert_same(got: np.ndarray, want: np.ndarray, *, exact_nan: bool) -> None:
    """Same dtype, shape and bits (strings: same text); NaN bits only if `exact_nan`."""
    assert got.dtype == want.dtype
    assert got.shape == want.shape
    if want.dtype == object:
        assert all(type(s) is str for s in got.reshape(-1))
        assert got.tolist() == want.tolist()
        return
    kind = element_type(want.dtype.name).kind
    if exact_nan or kind not in "fc":
        assert got.tobytes() == want.tobytes()
        return
    got_parts, want_parts = _float_parts(got), _float_parts(want)
    nan = np.isnan(want_parts.astype(np.float64))
    assert np.array_equal(np.isnan(got_parts.astype(np.float64)), nan)
    assert got_parts[~nan].tobytes() == want_parts[~nan].tobytes()


def through_json(array: np.ndarray) -> np.ndarray:
    body = orjson.dumps(encode_json(array), option=orjson.OPT_SERIALIZE_NUMPY)
    return decode_json(JsonTensor.model_validate_json(body), LIMITS)


# --- round trips -----------------------------------------------------------------------


@pytest.mark.parametrize("et", ELEMENT_TYPES, ids=_ids)
def test_json_round_trip(et: ElementType) -> None:
    @SETTINGS
    @given(arrays_of(et))
    def check(array: np.ndarray) -> None:
        assert_same(through_json(array), array, exact_nan=False)

    check()


@pytest.mark.parametrize("et", ELEMENT_TYPES, ids=_ids)
def test_proto_round_trip_and_onnx_reads_it(et: ElementType) -> None:
    @SETTINGS
    @given(arrays_of(et))
    def check(array: np.ndarray) -> None:
        payload = encode_tensor_proto(array)
        assert_same(decode_tensor_proto(payload, LIMITS), array, exact_nan=True)
        tensor = TensorProto.FromString(pybase64.b64decode(payload))
        assert tensor.data_type == et.enum
        assert list(tensor.dims) == list(array.shape)
        if et.is_string:  # numpy_helper.to_array drops trailing NULs: read string_data
            assert [s.decode() for s in tensor.string_data] == array.reshape(-1).tolist()
        else:
            assert_same(numpy_helper.to_array(tensor), array, exact_nan=True)

    check()


def _json_value(value: object, et: ElementType) -> object:
    """What a JSON element of `et` must look like, computed from the element alone."""
    if et.kind == "f":
        f = float(value)  # type: ignore[arg-type]
        if math.isnan(f):
            return "NaN"
        return f if math.isfinite(f) else ("Infinity" if f > 0 else "-Infinity")
    if et.kind == "c":
        return [_json_value(v, element_type("double")) for v in (value.real, value.imag)]  # type: ignore[attr-defined]
    return value if et.kind in "bO" else int(value)  # type: ignore[call-overload]


@pytest.mark.parametrize("et", ELEMENT_TYPES, ids=_ids)
def test_json_wire_form_read_by_stdlib(et: ElementType) -> None:
    """The JSON form itself, read by the stdlib, holds the element values (not only itself)."""

    @SETTINGS
    @given(arrays_of(et))
    def check(array: np.ndarray) -> None:
        body = json.loads(orjson.dumps(encode_json(array), option=orjson.OPT_SERIALIZE_NUMPY))
        assert body["dtype"] == et.name
        assert body["shape"] == list(array.shape)
        flat = np.asarray(body["data"], dtype=object).reshape(-1).tolist()
        if et.kind == "c":
            flat = [flat[i : i + 2] for i in range(0, len(flat), 2)]
        want = [_json_value(v, et) for v in array.reshape(-1).tolist()]
        if et.kind in "fc":  # printed shortest: equal once rounded back to the type
            flat = [_round_to(v, et) for v in flat]
            want = [_round_to(v, et) for v in want]
        assert flat == want
        if et.kind in "bi":
            assert all(type(v) is (bool if et.kind == "b" else int) for v in flat)

    check()


def _round_to(value: object, et: ElementType) -> object:
    if isinstance(value, list):
        part = element_type("float" if et.np_dtype == np.complex64 else "double")
        return [_round_to(v, part) for v in value]
    if isinstance(value, str):
        return value
    return np.array(value, dtype=np.float64).astype(et.np_dtype).tobytes()


# --- fixed cases that hypothesis may not reach ------------------------------------------

EXTREMES = [
    ("int64", [-(2**63), 2**63 - 1, 0]),
    ("uint64", [0, 2**63, 2**64 - 1]),
    ("uint32", [0, 2**32 - 1]),
    ("int8", [-128, 127]),
    ("int4", [-8, 7]),
    ("uint4", [0, 15]),
    ("int2", [-2, 1]),
    ("uint2", [0, 3]),
]


@pytest.mark.parametrize(("name", "values"), EXTREMES)
def test_integer_extremes_both_forms(name: str, values: list[int]) -> None:
    array = np.array(values, dtype=object).astype(element_type(name).np_dtype)
    assert [int(v) for v in array] == values  # the oracle holds them exactly
    for back in (through_json(array), decode_tensor_proto(encode_tensor_proto(array), LIMITS)):
        assert back.dtype == array.dtype
        assert [int(v) for v in back] == values


VIEWS = {
    "reversed": lambda a: a[::-1],
    "transposed": lambda a: a.reshape(3, 4).T,
    "strided": lambda a: a.reshape(3, 4)[:, ::-2],
}


@pytest.mark.parametrize("view", VIEWS, ids=str)
@pytest.mark.parametrize("name", ["float", "int64", "bool", "float8e5m2", "int4", "complex64",
                                  "string", "bfloat16"])  # fmt: skip
def test_non_contiguous_views(view: str, name: str) -> None:
    et = element_type(name)
    base = np.arange(12) % 7
    if et.kind == "O":
        base = base.astype(str).astype(object)
    array = VIEWS[view](base.astype(et.np_dtype))
    assert not array.flags.c_contiguous
    want = np.ascontiguousarray(array)
    assert_same(through_json(array), want, exact_nan=True)
    assert_same(decode_tensor_proto(encode_tensor_proto(array), LIMITS), want, exact_nan=True)


def test_uint64_above_2_63_is_a_json_integer() -> None:
    body = orjson.dumps(encode_json(np.array([2**64 - 1], np.uint64)),
                        option=orjson.OPT_SERIALIZE_NUMPY)  # fmt: skip
    assert b"18446744073709551615" in body


@pytest.mark.parametrize("name", ["float", "double", "float16", "bfloat16", "float8e4m3fn"])
def test_negative_zero_and_scalar(name: str) -> None:
    array = np.array(-0.0, dtype=element_type(name).np_dtype)
    for back in (through_json(array), decode_tensor_proto(encode_tensor_proto(array), LIMITS)):
        assert back.shape == ()
        assert back.tobytes() == array.tobytes()
        assert np.signbit(back.astype(np.float32))


def test_float16_subnormal_and_max_through_orjson() -> None:
    bits = np.array([0x0001, 0x8001, 0x03FF, 0x7BFF, 0xFBFF, 0x3555], dtype=np.uint16)
    array = bits.view(np.float16)
    assert through_json(array).view(np.uint16).tolist() == bits.tolist()


@pytest.mark.parametrize("name", ["complex64", "complex128"])
@pytest.mark.parametrize("shape", [(0,), (2, 0), ()])
def test_complex_empty_and_scalar(name: str, shape: tuple[int, ...]) -> None:
    array = np.full(shape, 1.5 - 2j, dtype=element_type(name).np_dtype)
    assert_same(through_json(array), array, exact_nan=True)


# --- JSON decoding rules -----------------------------------------------------------------


def decode(body: dict) -> np.ndarray:
    return decode_json(JsonTensor.model_validate_json(json.dumps(body)), LIMITS)


def test_flat_and_nested_data_agree() -> None:
    nested = decode({"dtype": "int32", "shape": [2, 3], "data": [[1, 2, 3], [4, 5, 6]]})
    flat = decode({"dtype": "int32", "shape": [2, 3], "data": [1, 2, 3, 4, 5, 6]})
    assert nested.dtype == np.int32
    assert nested.tolist() == flat.tolist() == [[1, 2, 3], [4, 5, 6]]


def test_shape_inferred_from_nesting() -> None:
    assert decode({"dtype": "float", "data": [[[1], [2]]]}).shape == (1, 2, 1)
    assert decode({"dtype": "float", "data": 2.5}).shape == ()
    assert decode({"dtype": "float", "data": []}).shape == (0,)
    assert decode({"dtype": "complex64", "data": [[1, 2], [3, 4]]}).tolist() == [1 + 2j, 3 + 4j]


def test_scalar_from_one_element_list() -> None:
    assert decode({"dtype": "int64", "shape": [], "data": [7]}).shape == ()


def test_non_finite_strings() -> None:
    got = decode({"dtype": "double", "data": ["NaN", "Infinity", "-Infinity", -0.0]})
    assert math.isnan(got[0]) and got[1] == math.inf and got[2] == -math.inf
    assert math.copysign(1.0, got[3]) == -1.0


@pytest.mark.parametrize("bad", ["nan", "inf", "1.5", "", "Infinite"])
def test_other_strings_refused_for_floats(bad: str) -> None:
    with pytest.raises(InvalidInput, match="data"):
        decode({"dtype": "float", "data": [bad]})


def test_complex_pairs() -> None:
    got = decode({"dtype": "complex128", "shape": [2], "data": [[1.5, -2], ["NaN", "Infinity"]]})
    assert got[0] == 1.5 - 2j
    assert math.isnan(got[1].real) and got[1].imag == math.inf


@pytest.mark.parametrize("data", [[1, 2, 3], [[1, 2, 3]], [[1], [2]]])
def test_complex_needs_pairs(data: list) -> None:
    with pytest.raises(InvalidInput, match=r"\[re, im\]"):
        decode({"dtype": "complex64", "data": data})


FLOAT8 = ["float8e4m3fn", "float8e4m3fnuz", "float8e5m2", "float8e5m2fnuz", "float8e8m0",
          "float4e2m1"]  # fmt: skip


@pytest.mark.parametrize("name", FLOAT8)
def test_saturation_matches_onnx(name: str) -> None:
    values = [1e6, -1e6, 1e30, -1e30, 448.5, 500, 240.5, 57344.0, 60000, 7, -7, 1e-12, 0.0, -0.0]
    dtype = element_type(name).np_dtype
    want = numpy_helper.saturate_cast(np.array(values, dtype=np.float64), dtype)
    assert decode({"dtype": name, "data": values}).tobytes() == want.tobytes()


@pytest.mark.parametrize("name", FLOAT8)
def test_saturation_matches_onnx_for_any_finite_number(name: str) -> None:
    dtype = element_type(name).np_dtype

    @SETTINGS
    @given(st.lists(st.floats(allow_nan=False, allow_infinity=False), max_size=20))
    def check(values: list[float]) -> None:
        want = numpy_helper.saturate_cast(np.array(values, dtype=np.float64), dtype)
        assert decode({"dtype": name, "data": values}).tobytes() == want.tobytes()

    check()


@pytest.mark.parametrize(
    ("name", "value", "bits"),
    [("float8e4m3fn", 1e6, 0x7E), ("float8e4m3fn", -1e6, 0xFE), ("float8e5m2", 1e6, 0x7B),
     ("float8e4m3fnuz", 1e6, 0x7F), ("float4e2m1", 100, 0x7), ("float4e2m1", -100, 0xF),
     ("float8e8m0", 1e300, 0xFE), ("float8e8m0", 0.0, 0x00), ("float8e8m0", -4.0, 0x00),
     ("float8e8m0", 4.0, 0x81),
     # "Infinity" saturates where the type has no infinity, and stays one where it has
     ("float8e4m3fn", "Infinity", 0x7E), ("float8e5m2", "Infinity", 0x7C),
     ("float8e5m2", "-Infinity", 0xFC), ("float8e8m0", "Infinity", 0xFE)],
)  # fmt: skip
def test_saturation_hand_computed(name: str, value: float | str, bits: int) -> None:
    # 448 = 0x7E in e4m3fn; 57344 = 0x7B in e5m2; 240 = 0x7F in e4m3fnuz; 6 = 0x7 in e2m1;
    # e8m0 is a biased exponent (127 = 2^0): 2^127 = 0xFE, 2^-127 = 0x00, 4 = 0x81.
    got = decode({"dtype": name, "data": [value]})
    assert got.view(np.uint8).tolist() == [bits]


def test_float4_has_no_nan() -> None:
    with pytest.raises(InvalidInput, match="float4e2m1 has no NaN"):
        decode({"dtype": "float4e2m1", "data": ["NaN"]})


def test_floats_round_to_nearest() -> None:
    got = decode({"dtype": "float16", "data": [0.1, 65519, 65520, 1e-8]})
    with np.errstate(over="ignore"):
        want = np.array([0.1, 65519, 65520, 1e-8], dtype=np.float64).astype(np.float16)
    assert got.tobytes() == want.tobytes()
    assert got[2] == np.inf  # 65520 rounds up past the largest float16


@pytest.mark.parametrize(
    ("name", "value"),
    [("int8", 128), ("int8", -129), ("uint8", -1), ("uint8", 256), ("int16", 2**15),
     ("uint32", 2**32), ("int32", -(2**31) - 1), ("int64", 2**63), ("int64", -(2**63) - 1),
     ("uint64", 2**64), ("uint64", -1), ("int4", 8), ("int4", -9), ("uint4", 16), ("int2", 2),
     ("uint2", 4), ("uint2", -1), ("int64", 10**400)],
)  # fmt: skip
def test_ints_out_of_range_refused_not_wrapped(name: str, value: int) -> None:
    with pytest.raises(InvalidInput, match="out of the range") as info:
        decode({"dtype": name, "data": [0, value]})
    assert info.value.loc == ("data",)


@pytest.mark.parametrize(
    ("name", "data"),
    [("int32", [1.0]), ("int32", [1.5]), ("int32", [True]), ("int32", ["1"]),
     ("bool", [1]), ("bool", [0]), ("bool", ["true"]), ("float", [True]), ("string", [1]),
     ("uint8", [None])],
)  # fmt: skip
def test_wrong_json_types_refused(name: str, data: list) -> None:
    with pytest.raises(InvalidInput) as info:
        decode({"dtype": name, "data": data})
    assert info.value.loc == ("data",)


def test_bool_is_true_false() -> None:
    got = decode({"dtype": "bool", "data": [True, False]})
    assert got.dtype == np.bool_ and got.tolist() == [True, False]


def test_shape_and_data_must_agree() -> None:
    with pytest.raises(InvalidInput, match="shape") as info:
        decode({"dtype": "float", "shape": [2, 2], "data": [1, 2, 3]})
    assert info.value.loc == ("data",)


def test_strings_are_utf8_text() -> None:
    got = decode({"dtype": "string", "data": ["", "é", "😀", "a\u0000b"]})
    assert got.dtype == object and got.tolist() == ["", "é", "😀", "a\u0000b"]


@pytest.mark.parametrize(
    "body",
    [b'{"dtype": "string", "data": ["\xff\xfe"]}',
     b'{"dtype": "string", "data": ["\xed\xa0\x80"]}',  # a surrogate encoded as UTF-8
     b'{"dtype": "string", "data": ["\\ud800"]}',
     b'{"dtype": "string", "data": ["\\udc00x"]}',
     b'{"dtype": "string", "data": ["\\ud800\\ud800"]}'],
)  # fmt: skip
def test_non_utf8_json_refused_by_the_schema(body: bytes) -> None:
    with pytest.raises(pydantic.ValidationError):
        JsonTensor.model_validate_json(body)


def test_lone_surrogate_built_in_python_refused_by_decode() -> None:
    with pytest.raises(InvalidInput, match="UTF-8") as info:
        decode_json(JsonTensor(dtype="string", data=["ok", "\ud800"]), LIMITS)
    assert info.value.loc == ("data",)


# --- TensorProtos built independently with onnx.helper.make_tensor --------------------

TYPED = [
    (TensorProto.FLOAT, "float_data", [1.5, -0.0, 2.0**127, 2.0**-149]),
    (TensorProto.COMPLEX64, "float_data", [1 + 2j, -3.5j]),
    (TensorProto.DOUBLE, "double_data", [1e308, -5e-324, 0.1]),
    (TensorProto.COMPLEX128, "double_data", [1e300 - 1e-300j]),
    (TensorProto.INT32, "int32_data", [-(2**31), 2**31 - 1, 0]),
    (TensorProto.INT8, "int32_data", [-128, 127]),
    (TensorProto.UINT8, "int32_data", [0, 255]),
    (TensorProto.INT16, "int32_data", [-32768, 32767]),
    (TensorProto.UINT16, "int32_data", [0, 65535]),
    (TensorProto.BOOL, "int32_data", [True, False, True]),
    (TensorProto.FLOAT16, "int32_data", [1.0, -2.5, 65504.0, 2.0**-24]),
    (TensorProto.BFLOAT16, "int32_data", [1.0, -2.5, 3.3895313892515355e38]),
    (TensorProto.FLOAT8E4M3FN, "int32_data", [448.0, -0.001953125, 1.5]),
    (TensorProto.FLOAT8E5M2, "int32_data", [57344.0, -1.5, 0.0]),
    (TensorProto.INT64, "int64_data", [-(2**63), 2**63 - 1]),
    (TensorProto.UINT32, "uint64_data", [0, 2**32 - 1]),
    (TensorProto.UINT64, "uint64_data", [0, 2**64 - 1]),
    (TensorProto.INT4, "int32_data", [-8, 7, 3]),
    (TensorProto.UINT4, "int32_data", [0, 15, 9, 1]),
    (TensorProto.INT2, "int32_data", [-2, 1, 0, -1, 1]),
    (TensorProto.UINT2, "int32_data", [3, 0, 2]),
    (TensorProto.FLOAT4E2M1, "int32_data", [6.0, -0.5, 1.5]),
]


@pytest.mark.parametrize(("enum", "field", "values"), TYPED, ids=lambda v: str(v)[:20])
def test_decodes_typed_fields_from_make_tensor(enum: int, field: str, values: list) -> None:
    tensor = helper.make_tensor("t", enum, [len(values)], values)
    assert helper.tensor_dtype_to_field(enum) == field and len(getattr(tensor, field))
    assert not tensor.HasField("raw_data")
    got = decode_tensor_proto(pybase64.b64encode(tensor.SerializeToString()), LIMITS)
    assert got.dtype == helper.tensor_dtype_to_np_dtype(enum)
    assert got.shape == (len(values),)
    # every value above is exact in its type, so a plain cast is the expected array
    want = np.array(values, dtype=np.complex128 if got.dtype.kind == "c" else np.float64)
    assert np.array_equal(got.astype(want.dtype), want)
    assert np.array_equal(np.signbit(got.real.astype(np.float64)), np.signbit(want.real))


def test_packed_int4_in_int32_data_by_hand() -> None:
    # [-8, 7, 3]: low nibble first: 0x78 = (7 << 4) | 0x8, then 0x03
    tensor = TensorProto(data_type=TensorProto.INT4, dims=[3], int32_data=[0x78, 0x03])
    got = decode_tensor_proto(pybase64.b64encode(tensor.SerializeToString()), LIMITS)
    assert got.dtype == ml_dtypes.int4 and got.astype(int).tolist() == [-8, 7, 3]


def test_decodes_string_data_from_make_tensor() -> None:
    strings: list = [b"caf\xc3\xa9", b""]
    tensor = helper.make_tensor("s", TensorProto.STRING, [2, 1], strings)
    got = decode_tensor_proto(pybase64.b64encode(tensor.SerializeToString()), LIMITS)
    assert got.dtype == object and got.tolist() == [["café"], [""]]


def test_trailing_nul_survives_string_data() -> None:
    # Built by hand: onnx 1.23's make_tensor and numpy_helper.to_array both pass strings
    # through a numpy unicode array, which drops trailing NULs.
    strings = [b"a\x00", b"\x00", b"\x00b"]
    tensor = TensorProto(data_type=TensorProto.STRING, dims=[3], string_data=strings)
    assert numpy_helper.to_array(tensor).tolist() != ["a\x00", "\x00", "\x00b"]  # the onnx bug
    got = decode_tensor_proto(pybase64.b64encode(tensor.SerializeToString()), LIMITS)
    assert got.tolist() == ["a\x00", "\x00", "\x00b"]


def test_string_data_not_utf8_refused() -> None:
    tensor = TensorProto(data_type=TensorProto.STRING, dims=[2], string_data=[b"ok", b"\xff"])
    with pytest.raises(InvalidInput, match="UTF-8"):
        decode_tensor_proto(pybase64.b64encode(tensor.SerializeToString()), LIMITS)


def test_raw_data_from_make_tensor() -> None:
    values = np.array([[1.25, -0.0], [np.inf, 2.0**-149]], dtype=np.float32)
    tensor = helper.make_tensor("r", TensorProto.FLOAT, [2, 2], values.tobytes(), raw=True)
    got = decode_tensor_proto(pybase64.b64encode(tensor.SerializeToString()), LIMITS)
    assert got.tobytes() == values.tobytes() and got.shape == (2, 2)


def test_bool_raw_bytes_other_than_0_1_are_true() -> None:
    tensor = TensorProto(data_type=TensorProto.BOOL, dims=[3], raw_data=bytes([0, 1, 2]))
    got = decode_tensor_proto(pybase64.b64encode(tensor.SerializeToString()), LIMITS)
    assert got.view(np.uint8).tolist() == [0, 1, 1]


def test_proto_decode_is_a_view_of_raw_data() -> None:
    array = np.arange(12, dtype=np.float32).reshape(3, 4)
    got = decode_tensor_proto(encode_tensor_proto(array), LIMITS)
    base: object = got
    while isinstance(base, np.ndarray):
        base = base.base
    assert isinstance(base, bytes) and len(base) == array.nbytes  # np.frombuffer, no copy
    assert not got.flags.writeable
