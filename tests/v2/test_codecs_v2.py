"""Round trips of every element type through V2 JSON (real orjson bytes) and the binary
extension, and the datatype names. Binary is bit-exact; JSON is too except that a NaN comes
back as a NaN of the type (JSON carries a single "NaN"), as with v1 JSON tensors."""

import ml_dtypes
import numpy as np
import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from api_schemas.v2 import EXTENSION_DATATYPES, V2_DATATYPES
from service.codecs.dtypes import ELEMENT_TYPES, ElementType
from service.codecs.limits import Limits
from service.codecs.v2_binary import decode_binary, encode_binary
from service.codecs.v2_json import decode_v2_json, encode_v2_json
from service.codecs.v2_types import datatype_of, from_datatype
from service.errors import InvalidInput
from tests.conformance.runtimes import canonical
from tests.conformance.strategies import arrays

LIMITS = Limits()
SETTINGS = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
TYPES = [pytest.param(et, id=et.name) for et in ELEMENT_TYPES]


def _nan_as_zero(array: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
    """The array with NaNs set to zero, and where they were (None: a type without NaN)."""
    if array.dtype == object or array.dtype.kind in "biu" or "int" in array.dtype.name:
        return array, None
    parts = array.reshape(-1)
    if array.dtype.kind == "c":
        parts = parts.view(np.float32 if array.dtype == np.complex64 else np.float64)
    wide = parts.astype(np.float64)
    nan = np.isnan(wide)
    cleaned = parts.copy()
    cleaned[nan] = 0
    return cleaned, nan


def test_every_element_type_has_one_v2_name() -> None:
    names = [datatype_of(et) for et in ELEMENT_TYPES]
    assert sorted(names) == sorted({*V2_DATATYPES, *EXTENSION_DATATYPES})
    assert datatype_of(from_datatype("BF16")).lower() == "bf16"
    assert from_datatype("FP32").name == "float" and from_datatype("BYTES").name == "string"
    with pytest.raises(InvalidInput, match="unknown datatype 'fp32'"):
        from_datatype("fp32")  # the protocol's names are upper case


@pytest.mark.parametrize("et", TYPES)
@SETTINGS
@given(data=st.data())
def test_binary_round_trip(et: ElementType, data: st.DataObject) -> None:
    array = data.draw(arrays(et.name))
    blob = encode_binary(array)
    if not et.is_string:
        assert len(blob) == et.raw_nbytes(array.size)
    back = decode_binary(et, list(array.shape), memoryview(blob), LIMITS)
    assert back.dtype == array.dtype and back.shape == array.shape
    assert canonical(back) == canonical(array)


@pytest.mark.parametrize("et", TYPES)
@SETTINGS
@given(data=st.data())
def test_json_round_trip(et: ElementType, data: st.DataObject) -> None:
    array = data.draw(arrays(et.name))
    wire = orjson.loads(orjson.dumps(encode_v2_json("x", array), option=orjson.OPT_SERIALIZE_NUMPY))
    assert wire["datatype"] == datatype_of(et) and wire["shape"] == list(array.shape)
    back = decode_v2_json(wire["datatype"], wire["shape"], wire["data"], LIMITS)
    assert back.dtype == array.dtype and back.shape == array.shape
    got, got_nan = _nan_as_zero(back)
    want, want_nan = _nan_as_zero(array)
    if want_nan is not None:
        assert got_nan is not None and (got_nan == want_nan).all()
    assert canonical(got) == canonical(want)


def test_packed_types_use_onnx_packing() -> None:
    """int4 [1, -2, 3]: the first element in the low nibble of the first byte."""
    blob = encode_binary(np.array([1, -2, 3], dtype=ml_dtypes.int4))
    assert blob == bytes([0xE1, 0x03])
    assert encode_binary(np.array([True, False])) == b"\x01\x00"
    assert (
        encode_binary(np.array(["ab", ""], dtype=object)) == b"\x02\x00\x00\x00ab\x00\x00\x00\x00"
    )


def test_nested_json_data_is_accepted() -> None:
    got = decode_v2_json("INT32", [2, 2], [[1, 2], [3, 4]], LIMITS)
    np.testing.assert_array_equal(got, np.array([[1, 2], [3, 4]], dtype=np.int32))
