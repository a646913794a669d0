"""Edge cases the ONNX spec implies, per operator version; expected values worked out by hand."""

import tracemalloc
from typing import Any

import ml_dtypes
import numpy as np
import pytest
from onnx import helper, numpy_helper

from service.codecs.sparse_tensor import SparseArray
from service.errors import InvalidInput, PayloadTooLarge, ServiceError
from service.kernels.context import KernelContext
from service.operators.node_attributes import node_attributes
from service.operators.registry import resolve
from service.operators.run import run
from tests.conformance.oracles import seeding_rule

CTX = KernelContext(max_output_bytes=1 << 20)
I64 = np.int64
F32 = np.float32
BF16 = ml_dtypes.bfloat16


def call(op_type: str, version: int, inputs: dict[str, Any], **attributes: Any) -> np.ndarray:
    """The one output of `op_type` at `version` (the version must be served exactly)."""
    op = resolve(op_type, version)
    assert op.since_version == version
    (output,) = run(op, inputs, attributes, CTX).values()
    return output


def refused(
    error: type[ServiceError], op_type: str, version: int, inputs: dict[str, Any],
    loc: tuple[str, ...], match: str = "", **attributes: Any,
) -> ServiceError:  # fmt: skip
    """Assert the call is refused with `error`, naming the version and the field at fault."""
    with pytest.raises(error, match=match) as caught:
        call(op_type, version, inputs, **attributes)
    assert caught.value.operator == f"{op_type}-{version}"
    assert str(caught.value).startswith(f"{op_type}-{version}: ")
    assert caught.value.loc[: len(loc)] == loc, caught.value.loc
    return caught.value


def equal(actual: np.ndarray, expected: np.ndarray) -> None:
    np.testing.assert_array_equal(actual, expected, strict=True)


# --- Shape ---------------------------------------------------------------------------------

DATA = np.zeros((2, 3, 4, 5), F32)


@pytest.mark.parametrize(
    ("start", "end", "expected"),
    [
        (0, None, [2, 3, 4, 5]),
        (1, None, [3, 4, 5]),
        (-1, None, [5]),  # negative counts from the back
        (-3, -1, [3, 4]),
        (1, 3, [3, 4]),
        (-10, None, [2, 3, 4, 5]),  # clipped to 0
        (0, 10, [2, 3, 4, 5]),  # clipped to rank
        (-10, -10, []),
        (10, 20, []),
        (3, 1, []),  # start > end: empty
        (2, 2, []),
        (-(2**63), 2**63 - 1, [2, 3, 4, 5]),  # the int64 extremes clip too
    ],
)
@pytest.mark.parametrize("version", [15, 19, 21, 23, 24, 25])
def test_shape_slice(version: int, start: int, end: int | None, expected: list[int]) -> None:
    equal(call("Shape", version, {"data": DATA}, start=start, end=end), np.array(expected, I64))


@pytest.mark.parametrize("version", [1, 13, 15, 19, 21, 23, 24, 25])
def test_shape_of_scalar_is_empty(version: int) -> None:
    equal(call("Shape", version, {"data": np.array(1.5, F32)}), np.zeros(0, I64))
    equal(call("Shape", version, {"data": np.zeros((0, 7), F32)}), np.array([0, 7], I64))


def test_shape_13_refuses_float8_that_19_accepts() -> None:
    data = np.zeros((2, 1), ml_dtypes.float8_e4m3fn)
    refused(InvalidInput, "Shape", 13, {"data": data}, ("inputs", "data"), "float8e4m3fn")
    equal(call("Shape", 19, {"data": data}), np.array([2, 1], I64))


@pytest.mark.parametrize("version", [1, 13])
def test_shape_before_15_has_no_start(version: int) -> None:
    attr = helper.make_attribute("start", 1)
    with pytest.raises(
        InvalidInput, match=rf"Shape-{version}: attributes\.start: no attribute 'start'"
    ):
        node_attributes(resolve("Shape", version), [attr])


# --- ConstantOfShape -----------------------------------------------------------------------

COS_VERSIONS = [9, 20, 21, 23, 24, 25]


@pytest.mark.parametrize("version", COS_VERSIONS)
def test_constant_of_shape_defaults_to_float_zero(version: int) -> None:
    equal(call("ConstantOfShape", version, {"input": np.array([2, 3], I64)}), np.zeros((2, 3), F32))


@pytest.mark.parametrize("version", COS_VERSIONS)
def test_constant_of_shape_empty_shape_is_scalar(version: int) -> None:
    value = np.array([7], np.int32)
    got = call("ConstantOfShape", version, {"input": np.zeros(0, I64)}, value=value)
    equal(got, np.array(7, np.int32))


@pytest.mark.parametrize("version", COS_VERSIONS)
def test_constant_of_shape_zero_dims_are_empty(version: int) -> None:
    got = call("ConstantOfShape", version, {"input": np.array([3, 0, 2], I64)})
    equal(got, np.zeros((3, 0, 2), F32))


@pytest.mark.parametrize(
    "value",
    [np.array([7], np.int32), np.array([True]), np.array([-0.0], np.float16),
     np.array([np.nan], np.float64), np.array([-(2**63)], I64), np.array(2.5, F32)],
    ids=["int32", "bool", "negative-zero", "nan", "int64-min", "scalar-value"],
)  # fmt: skip
def test_constant_of_shape_fill(value: np.ndarray) -> None:
    got = call("ConstantOfShape", 9, {"input": np.array([2, 2], I64)}, value=value)
    assert got.dtype == value.dtype and got.shape == (2, 2)
    # Bits, not values: -0.0 must stay negative and NaN must stay NaN.
    assert (got.view(np.uint8).reshape(4, -1) == value.reshape(1).view(np.uint8)).all()


@pytest.mark.parametrize("version", COS_VERSIONS)
def test_constant_of_shape_refusals(version: int) -> None:
    refused(InvalidInput, "ConstantOfShape", version, {"input": np.array([2, -1], I64)},
            ("inputs", "input"), "negative")  # fmt: skip
    refused(InvalidInput, "ConstantOfShape", version, {"input": np.array([2, 3], np.int32)},
            ("inputs", "input"), "cannot be int32")  # fmt: skip
    refused(InvalidInput, "ConstantOfShape", version, {"input": np.array(3, I64)},
            ("inputs", "input"), "1-D")  # fmt: skip
    refused(InvalidInput, "ConstantOfShape", version, {"input": np.array([2], I64)},
            ("attributes", "value"), "one element", value=np.array([1, 2], np.int32))  # fmt: skip
    refused(InvalidInput, "ConstantOfShape", version, {"input": np.array([2], I64)},
            ("attributes", "value"), "string", value=np.array(["a"], object))  # fmt: skip


def test_constant_of_shape_bfloat16_from_version_20() -> None:
    value = np.array([1.5], BF16)
    refused(InvalidInput, "ConstantOfShape", 9, {"input": np.array([2], I64)},
            ("attributes", "value"), "bfloat16", value=value)  # fmt: skip
    equal(call("ConstantOfShape", 20, {"input": np.array([2], I64)}, value=value),
          np.array([1.5, 1.5], BF16))  # fmt: skip


# --- Constant ------------------------------------------------------------------------------

CONSTANT_VERSIONS = [1, 9, 11, 12, 13, 19, 21, 23, 24, 25]
SPARSE = helper.make_sparse_tensor(
    numpy_helper.from_array(np.array([5.0, 6.0], F32)),
    numpy_helper.from_array(np.array([1, 4], I64)),
    [2, 3],
)
# Every attribute form, the first version that has it, and the output worked out by hand.
FORMS: list[tuple[str, Any, int, np.ndarray]] = [
    ("value", numpy_helper.from_array(np.array([[1, 2]], F32)), 1, np.array([[1, 2]], F32)),
    ("sparse_value", SPARSE, 11, np.array([[0, 5, 0], [0, 6, 0]], F32)),
    ("value_float", 1.5, 12, np.array(1.5, F32)),
    ("value_floats", [1.5, -2.0], 12, np.array([1.5, -2.0], F32)),
    ("value_int", -(2**63), 12, np.array(-(2**63), I64)),
    ("value_ints", [1, 2, 3], 12, np.array([1, 2, 3], I64)),
    ("value_string", "héllo", 12, np.array("héllo", dtype=object)),
    ("value_strings", ["a", "bc"], 12, np.array(["a", "bc"], dtype=object)),
]  # fmt: skip


@pytest.mark.parametrize("version", CONSTANT_VERSIONS)
@pytest.mark.parametrize(("name", "value", "since", "expected"), FORMS, ids=[f[0] for f in FORMS])
def test_constant_attribute_forms(
    version: int, name: str, value: Any, since: int, expected: np.ndarray
) -> None:
    op = resolve("Constant", version)
    attribute = helper.make_attribute(name, value)
    if version < since:
        with pytest.raises(
            InvalidInput, match=rf"Constant-{version}: attributes\.{name}: no attribute '{name}'"
        ):
            node_attributes(op, [attribute])
        return
    output = run(op, {}, node_attributes(op, [attribute]), CTX)["output"]
    equal(output, expected)


@pytest.mark.parametrize("version", [11, 12, 13, 19, 21, 23, 24, 25])
def test_constant_needs_exactly_one_attribute(version: int) -> None:
    op = resolve("Constant", version)
    with pytest.raises(InvalidInput, match=f"Constant-{version}: .*exactly one"):
        node_attributes(op, [])
    two = [helper.make_attribute("value", numpy_helper.from_array(np.ones(1, F32))),
           helper.make_attribute("sparse_value", SPARSE)]  # fmt: skip
    with pytest.raises(InvalidInput, match=f"Constant-{version}: .*exactly one"):
        node_attributes(op, two)


def test_constant_attribute_of_the_wrong_type_is_refused() -> None:
    wrong = helper.make_attribute("value_int", 1.5)  # a FLOAT where the schema says INT
    with pytest.raises(
        InvalidInput, match=r"Constant-13: attributes\.value_int: attribute 'value_int' must be INT"
    ):
        node_attributes(resolve("Constant", 13), [wrong])


def test_constant_bfloat16_from_version_13() -> None:
    value = np.array([1.5], BF16)
    refused(InvalidInput, "Constant", 12, {}, ("attributes", "value"), "bfloat16", value=value)
    equal(call("Constant", 13, {}, value=value), value)


def sparse(values: list[Any], indices: Any, dims: list[int], dtype: Any = F32) -> SparseArray:
    return SparseArray(np.array(values, dtype), np.array(indices, I64), tuple(dims))


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (sparse([1, 2], [0, 5], [2, 3]), [[1, 0, 0], [0, 0, 2]]),  # [NNZ] linear
        (sparse([1, 2], [[0, 0], [1, 2]], [2, 3]), [[1, 0, 0], [0, 0, 2]]),  # [NNZ, rank]
        (sparse([2, 1], [[1, 2], [0, 0]], [2, 3]), [[1, 0, 0], [0, 0, 2]]),  # any order
        (sparse([], np.zeros(0), [2, 2]), [[0, 0], [0, 0]]),  # no values
        (sparse([3], [0], []), 3),  # a scalar, linear
        (sparse([3], np.zeros((1, 0)), []), 3),  # a scalar, [NNZ, 0]
    ],
)
def test_sparse_value_densified(value: SparseArray, expected: Any) -> None:
    equal(call("Constant", 11, {}, sparse_value=value), np.array(expected, F32))


def test_sparse_strings_fill_with_empty_strings() -> None:
    value = sparse(["x"], [1], [3], dtype=object)
    equal(call("Constant", 25, {}, sparse_value=value), np.array(["", "x", ""], dtype=object))


@pytest.mark.parametrize(
    ("value", "match"),
    [
        (sparse([1], [6], [2, 3]), "outside the dense shape"),
        (sparse([1], [-1], [2, 3]), "outside the dense shape"),
        (sparse([1], [[0, 3]], [2, 3]), "outside the dense shape"),
        (sparse([1], [[-1, 0]], [2, 3]), "outside the dense shape"),
        (sparse([1, 2], [4, 4], [2, 3]), "repeat"),
        (sparse([1, 2], [[1, 1], [1, 1]], [2, 3]), "repeat"),
        (sparse([1, 2], [0], [2, 3]), r"\[NNZ\] or \[NNZ, rank\]"),
        (sparse([[1, 2]], [0, 1], [2, 3]), "1-D"),
        (SparseArray(np.ones(1, F32), np.zeros(1, np.int32), (2,)), "int64"),
        (sparse([1], [0], [1] * 65), "rank 65"),
    ],
)
def test_sparse_value_refusals(value: SparseArray, match: str) -> None:
    refused(InvalidInput, "Constant", 11, {}, ("attributes", "sparse_value"), match,
            sparse_value=value)  # fmt: skip


def test_sparse_value_dense_size_is_budgeted_before_index_arithmetic() -> None:
    value = sparse([1], [[0, 0]], [10**10, 10**10])  # product overflows int64
    refused(PayloadTooLarge, "Constant", 11, {}, ("attributes", "sparse_value"),
            "over the limit", sparse_value=value)  # fmt: skip


# --- Tile ----------------------------------------------------------------------------------

X = np.arange(6, dtype=F32).reshape(2, 3)


@pytest.mark.parametrize("version", [6, 13])
@pytest.mark.parametrize(
    ("repeats", "expected"),
    [
        ([1, 1], X),
        ([2, 1], [[0, 1, 2], [3, 4, 5], [0, 1, 2], [3, 4, 5]]),
        ([1, 2], [[0, 1, 2, 0, 1, 2], [3, 4, 5, 3, 4, 5]]),
        ([0, 2], np.zeros((0, 6), F32)),  # zero repeats: an empty axis
        ([2, 0], np.zeros((4, 0), F32)),
    ],
)
def test_tile_repeats(version: int, repeats: list[int], expected: Any) -> None:
    got = call("Tile", version, {"input": X, "repeats": np.array(repeats, I64)})
    equal(got, np.array(expected, F32))


@pytest.mark.parametrize("version", [6, 13])
def test_tile_scalar_and_strings(version: int) -> None:
    equal(call("Tile", version, {"input": np.array(5.0, F32), "repeats": np.zeros(0, I64)}),
          np.array(5.0, F32))  # fmt: skip
    words = np.array(["a", "b"], dtype=object)
    equal(call("Tile", version, {"input": words, "repeats": np.array([2], I64)}),
          np.array(["a", "b", "a", "b"], dtype=object))  # fmt: skip


@pytest.mark.parametrize("version", [6, 13])
@pytest.mark.parametrize(
    ("repeats", "match"),
    [
        (np.array([2], I64), "one value per input axis"),
        (np.array([2, 2, 2], I64), "one value per input axis"),
        (np.array([[2, 2]], I64), "1-D"),
        (np.array([2, -1], I64), "must not be negative"),
        (np.array([2, 2], np.int32), "cannot be int32"),
    ],
)
def test_tile_refuses_bad_repeats(version: int, repeats: np.ndarray, match: str) -> None:
    refused(InvalidInput, "Tile", version, {"input": X, "repeats": repeats},
            ("inputs", "repeats"), match)  # fmt: skip


def test_tile_6_refuses_bfloat16_that_13_accepts() -> None:
    inputs = {"input": X.astype(BF16), "repeats": np.array([1, 2], I64)}
    refused(InvalidInput, "Tile", 6, inputs, ("inputs", "input"), "bfloat16")
    equal(call("Tile", 13, inputs), np.tile(X, [1, 2]).astype(BF16))


@pytest.mark.parametrize(
    ("tiles", "axis", "expected"),
    [
        (np.array(2, I64), np.array(0, I64), np.tile(X, [2, 1])),
        (np.array(3, I64), np.array(1, I64), np.tile(X, [1, 3])),
        (np.array(2, I64), np.array(-1, I64), np.tile(X, [1, 2])),  # negative axis
        (np.array(2.0, F32), np.array(1.0, F32), np.tile(X, [1, 2])),  # the input's type
        (np.array([2], I64), np.array([0], I64), np.tile(X, [2, 1])),  # one-element tensors
        (np.array(2.0, F32), np.array(0, I64), np.tile(X, [2, 1])),  # mixed
        (np.array(0, I64), np.array(1, I64), np.zeros((2, 0), F32)),
    ],
)
def test_tile_1(tiles: np.ndarray, axis: np.ndarray, expected: np.ndarray) -> None:
    equal(call("Tile", 1, {"input": X, "tiles": tiles, "axis": axis}), expected)


@pytest.mark.parametrize(
    ("tiles", "axis", "field", "match"),
    [
        (np.array(-1, I64), np.array(0, I64), "tiles", "must not be negative"),
        (np.array(2.5, F32), np.array(0, I64), "tiles", "whole number"),
        (np.array(np.nan, F32), np.array(0, I64), "tiles", "whole number"),
        (np.array([2, 2], I64), np.array(0, I64), "tiles", "scalar"),
        (np.array(2, I64), np.array(2, I64), "axis", "out of range"),
        (np.array(2, I64), np.array(-3, I64), "axis", "out of range"),
        (np.array(2, I64), np.array(0.5, F32), "axis", "whole number"),
        (np.array(2.0, np.float64), np.array(0, I64), "tiles", "same type"),
        (np.array(2, np.int32), np.array(0, I64), "tiles", "cannot be int32"),
    ],
)
def test_tile_1_refusals(tiles: np.ndarray, axis: np.ndarray, field: str, match: str) -> None:
    refused(InvalidInput, "Tile", 1, {"input": X, "tiles": tiles, "axis": axis},
            ("inputs", field), match)  # fmt: skip


def test_tile_1_takes_only_float_inputs() -> None:
    inputs = {"input": X.astype(np.int32), "tiles": np.array(2, I64), "axis": np.array(0, I64)}
    refused(InvalidInput, "Tile", 1, inputs, ("inputs", "input"), "int32")


# --- RandomUniformLike ---------------------------------------------------------------------

Z = np.zeros((4, 5), F32)


@pytest.mark.parametrize(
    ("version", "input", "dtype", "expected"),
    [
        (1, Z, None, np.float32),  # the input's type
        (1, Z.astype(np.float64), None, np.float64),
        (1, Z, 10, np.float16),  # an enum number
        (1, Z, "double", np.float64),  # a name
        (1, Z.astype(np.int32), 1, np.float32),
        (1, np.array(["a", "b"], dtype=object), "float16", np.float16),  # strings need dtype
        (22, Z, 16, BF16),
        (22, Z.astype(BF16), None, BF16),
        (22, Z, "bfloat16", BF16),
    ],
)
def test_random_uniform_like_output_type(
    version: int, input: np.ndarray, dtype: Any, expected: Any
) -> None:
    got = call("RandomUniformLike", version, {"input": input}, dtype=dtype, seed=1.0)
    assert got.dtype == expected and got.shape == input.shape


@pytest.mark.parametrize(
    ("version", "input", "attributes", "field", "match"),
    [
        (1, np.array(["a"], dtype=object), {}, "dtype", "string input needs the dtype"),
        (22, Z.astype(np.int32), {}, "dtype", "not int32 .the input's type"),
        (22, Z, {"dtype": 7}, "dtype", "not int64"),
        (22, Z, {"dtype": 14}, "dtype", "not complex64"),  # once a 500
        (22, Z, {"dtype": 8}, "dtype", "not string"),  # once a 500
        (22, Z, {"dtype": "float8e4m3fn"}, "dtype", "not float8e4m3fn"),
        (22, Z, {"dtype": 99}, "dtype", "unknown dtype"),
        (22, Z, {"low": 1.0, "high": 1.0}, "low", "low < high"),
        (22, Z, {"low": 2.0, "high": 1.0}, "low", "low < high"),
        (22, Z, {"high": float("inf")}, "low", "finite"),
        (22, Z, {"dtype": 10, "low": 1.0001, "high": 1.0002}, "low", "no float16 value"),
    ],
)
def test_random_uniform_like_refusals(
    version: int, input: np.ndarray, attributes: dict, field: str, match: str
) -> None:
    refused(InvalidInput, "RandomUniformLike", version, {"input": input},
            ("attributes", field), match, **attributes)  # fmt: skip


def test_random_uniform_like_bfloat16_from_version_22() -> None:
    refused(InvalidInput, "RandomUniformLike", 1, {"input": Z}, ("attributes", "dtype"),
            "bfloat16", dtype=16)  # fmt: skip
    assert call("RandomUniformLike", 22, {"input": Z}, dtype=16).dtype == BF16


@pytest.mark.parametrize("dtype", [np.float16, BF16, np.float32, np.float64])
@pytest.mark.parametrize(
    ("low", "high"),
    [
        (0.0, 1.0),  # values near 1 round up to 1.0 in float16/bfloat16
        (0.1, 0.2),  # neither bound is a float16/bfloat16 value
        (-3.0, 1.0009765625),  # high just above a float16 value (1 + 2**-10)
        (1.0, 1.0078125),  # one bfloat16 step: 1 and 1 + 2**-7
        (-1e6, 1e6),  # beyond float16's range: saturated to +-65504
    ],
)
def test_random_uniform_like_in_range_and_seeded(low: float, high: float, dtype: Any) -> None:
    big = np.zeros((200, 500), F32)  # enough draws to land next to both bounds
    enum = {np.float16: 10, BF16: 16, np.float32: 1, np.float64: 11}[dtype]
    got = call("RandomUniformLike", 22, {"input": big}, dtype=enum, low=low, high=high, seed=7.0)
    as_double = got.astype(np.float64)
    assert float(F32(low)) <= as_double.min() and as_double.max() < float(F32(high))
    again = call("RandomUniformLike", 22, {"input": big}, dtype=enum, low=low, high=high, seed=7.0)
    assert got.tobytes() == again.tobytes()  # same seed, same bits
    expected = seeding_rule(big.size, 7.0, low, high, dtype).reshape(big.shape)
    assert got.tobytes() == expected.tobytes()


def test_random_uniform_like_seeds() -> None:
    first = call("RandomUniformLike", 1, {"input": Z})
    second = call("RandomUniformLike", 1, {"input": Z})
    assert not np.array_equal(first, second)  # no seed: fresh values on every call
    one = call("RandomUniformLike", 1, {"input": Z}, seed=1.0)
    two = call("RandomUniformLike", 1, {"input": Z}, seed=2.0)
    assert not np.array_equal(one, two)
    # A version change does not change the stream: 22 only widened the types.
    equal(call("RandomUniformLike", 22, {"input": Z}, seed=1.0), one)


# --- Output budget: refused before anything is allocated ----------------------------------

TERA = 10**12
HUGE: list[tuple[str, int, dict[str, Any], dict[str, Any], tuple[str, ...]]] = [
    ("ConstantOfShape", 9, {"input": np.array([10**6, 10**6], I64)},
     {"value": np.array([1], np.int8)}, ("inputs", "input")),
    ("ConstantOfShape", 25, {"input": np.array([10**6, 10**6], I64)},
     {"value": np.array([0], np.int8)}, ("inputs", "input")),  # zero fill: calloc
    ("Tile", 13, {"input": np.zeros((1000, 1000), np.int8), "repeats": np.array([1000, 1000], I64)},
     {}, ("inputs", "repeats")),
    ("Tile", 1, {"input": np.zeros(1000, np.float16), "tiles": np.array(TERA // 2000, I64),
                 "axis": np.array(0, I64)}, {}, ("inputs", "tiles")),
    ("Constant", 11, {}, {"sparse_value": sparse([1], [0], [10**6, 10**6], np.int8)},
     ("attributes", "sparse_value")),
    ("RandomUniformLike", 22, {"input": np.broadcast_to(np.float16(0), (10**6, 10**6 // 2))},
     {}, ("inputs", "input")),
]  # fmt: skip


@pytest.mark.parametrize(("op_type", "version", "inputs", "attributes", "loc"), HUGE,
                         ids=[f"{h[0]}-{h[1]}" for h in HUGE])  # fmt: skip
def test_terabyte_output_refused_before_allocation(
    op_type: str, version: int, inputs: dict, attributes: dict, loc: tuple
) -> None:
    tracemalloc.start()
    try:
        error = refused(PayloadTooLarge, op_type, version, inputs, loc, "over the limit",
                        **attributes)  # fmt: skip
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert f"{TERA} bytes" in error.detail
    assert peak < 1 << 20, f"{peak} bytes were allocated before the refusal"
