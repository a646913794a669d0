"""The dtype names of the wire against onnx's own TensorProto.DataType table."""

import ml_dtypes
import numpy as np
import pytest
from onnx import TensorProto, helper

from api_schemas.tensors import DTYPE_NAMES
from service.codecs.dtypes import ELEMENT_TYPES, by_enum, element_type, element_type_of
from service.errors import InvalidInput

ONNX_NAMES = {number: name for name, number in TensorProto.DataType.items()}
ENUMS = range(1, 27)  # the 26 element types of the contract; 27+ (float6) are not served


def test_names_are_onnx_enum_names_in_enum_order() -> None:
    onnx_names = tuple(ONNX_NAMES[number].lower() for number in ENUMS)
    assert onnx_names == DTYPE_NAMES
    assert [et.enum for et in ELEMENT_TYPES] == list(ENUMS)


@pytest.mark.parametrize("number", ENUMS, ids=lambda n: ONNX_NAMES[n])
def test_table_agrees_with_onnx(number: int) -> None:
    et = by_enum(number)
    assert et.name == ONNX_NAMES[number].lower()
    assert et.type_str == f"tensor({et.name})"
    assert et.np_dtype == helper.tensor_dtype_to_np_dtype(number)


def _aliases(number: int) -> list[str | int]:
    enum_name = ONNX_NAMES[number]
    np_dtype = helper.tensor_dtype_to_np_dtype(number)
    aliases: list[str | int] = [
        enum_name.lower(), enum_name, enum_name.upper(), number, str(number),
        f"tensor({enum_name.lower()})", f"TensorProto.{enum_name}",
    ]  # fmt: skip
    if number != TensorProto.STRING:  # numpy calls the string type 'object'
        aliases += [np_dtype.name, np_dtype.name.upper()]
    return aliases


@pytest.mark.parametrize("number", ENUMS, ids=lambda n: ONNX_NAMES[n])
def test_every_alias_resolves(number: int) -> None:
    for alias in _aliases(number):
        assert element_type(alias).enum == number, alias


@pytest.mark.parametrize(
    ("alias", "name"),
    [("float32", "float"), ("float64", "double"), ("FLOAT", "float"), ("INT64", "int64"),
     ("bfloat16", "bfloat16"), ("float8_e4m3fn", "float8e4m3fn"), ("float8_e8m0fnu", "float8e8m0"),
     ("float4_e2m1fn", "float4e2m1"), (" float ", "float"), ("tensor(float16)", "float16")],
)  # fmt: skip
def test_hand_picked_aliases(alias: str, name: str) -> None:
    assert element_type(alias).name == name


@pytest.mark.parametrize(
    "spec",
    ["float31", "tensor(float", "object", "str", "", "float6e2m3", 0, 27, 28, 99, -1,
     pytest.param(10**5000, id="int-of-5000-digits")],
)  # fmt: skip
def test_unknown_names_refused_naming_the_choices(spec: str | int) -> None:
    with pytest.raises(InvalidInput) as info:
        element_type(spec)
    message = str(info.value)
    assert "unknown dtype" in message
    for name in DTYPE_NAMES:
        assert name in message


@pytest.mark.parametrize("spec", [True, False, 1.0, None, [1]])
def test_non_name_specs_refused(spec: object) -> None:
    with pytest.raises(InvalidInput, match="dtype must be a name or an enum number"):
        element_type(spec)  # type: ignore[arg-type]


def test_long_unknown_name_is_not_echoed_whole() -> None:
    with pytest.raises(InvalidInput) as info:
        element_type("x" * 100_000)
    assert len(str(info.value)) < 1000


@pytest.mark.parametrize("number", ENUMS, ids=lambda n: ONNX_NAMES[n])
def test_element_type_of_round_trip(number: int) -> None:
    et = by_enum(number)
    array = np.zeros((2, 1), dtype=helper.tensor_dtype_to_np_dtype(number))
    assert element_type_of(array) is et
    assert element_type(et.name) is et


def test_unicode_arrays_are_strings() -> None:
    assert element_type_of(np.array(["a", "bc"])).name == "string"


@pytest.mark.parametrize(
    ("name", "bits"),
    [("int4", 4), ("uint4", 4), ("float4e2m1", 4), ("int2", 2), ("uint2", 2), ("bool", 8),
     ("float8e8m0", 8), ("bfloat16", 16), ("complex128", 128)],
)  # fmt: skip
def test_wire_bits(name: str, bits: int) -> None:
    assert element_type(name).bits == bits


def test_small_ints_are_integers() -> None:
    assert {et.name for et in ELEMENT_TYPES if et.kind == "i"} == {
        "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
        "int4", "uint4", "int2", "uint2",
    }  # fmt: skip
    assert element_type("int4").np_dtype == ml_dtypes.int4
