"""AttributeProtos of a node -> kernel keyword arguments, checked like REST attributes."""

from typing import Any

import numpy as np
import pytest
from onnx import AttributeProto, TensorProto, helper, numpy_helper

from service.codecs.limits import Limits
from service.codecs.sparse_tensor import SparseArray
from service.errors import InvalidInput, PayloadTooLarge
from service.operators.node_attributes import node_attributes
from service.operators.registry import resolve


def test_defaults_are_filled_in() -> None:
    assert node_attributes(resolve("Shape", 15), []) == {"start": 0, "end": None}
    assert node_attributes(resolve("RandomUniformLike", 22), []) == {
        "dtype": None, "high": 1.0, "low": 0.0, "seed": None,
    }  # fmt: skip
    assert node_attributes(resolve("Tile", 13), []) == {}


@pytest.mark.parametrize(
    ("name", "value", "expected"),
    [
        ("value_int", 7, 7),
        ("value_float", 0.1, float(np.float32(0.1))),  # FLOAT attributes hold float32
        ("value_string", "naïve", "naïve"),
        ("value_ints", [1, -2], [1, -2]),
        ("value_floats", [0.5, 2.0], [0.5, 2.0]),
        ("value_strings", ["a", "ü"], ["a", "ü"]),
    ],
)
def test_plain_values(name: str, value: Any, expected: Any) -> None:
    kwargs = node_attributes(resolve("Constant", 13), [helper.make_attribute(name, value)])
    assert kwargs[name] == expected and type(kwargs[name]) is type(expected)
    assert sum(v is not None for v in kwargs.values()) == 1


def test_tensors_are_arrays() -> None:
    value = numpy_helper.from_array(np.array([[1, 2]], np.int32))
    kwargs = node_attributes(resolve("Constant", 13), [helper.make_attribute("value", value)])
    np.testing.assert_array_equal(kwargs["value"], np.array([[1, 2]], np.int32), strict=True)
    sparse = helper.make_sparse_tensor(
        numpy_helper.from_array(np.array([1.5], np.float32)),
        numpy_helper.from_array(np.array([[0, 1]], np.int64)),
        [2, 2],
    )
    kwargs = node_attributes(
        resolve("Constant", 13), [helper.make_attribute("sparse_value", sparse)]
    )
    got = kwargs["sparse_value"]
    assert isinstance(got, SparseArray) and got.dims == (2, 2)
    np.testing.assert_array_equal(got.indices, np.array([[0, 1]], np.int64), strict=True)


def _short_tensor() -> TensorProto:
    """A tensor whose float_data holds fewer values than its dims need."""
    tensor = helper.make_tensor("t", TensorProto.FLOAT, [1], [1.0])
    tensor.dims[0] = 2
    return tensor


def _raw(name: str, kind: int, **fields: Any) -> AttributeProto:
    attr = AttributeProto(name=name, type=kind)
    for key, value in fields.items():
        setattr(attr, key, value)
    return attr


@pytest.mark.parametrize(
    ("op_type", "version", "attribute", "loc", "match"),
    [
        ("Shape", 15, helper.make_attribute("stop", 1), ("attributes", "stop"), "no attribute 'stop'"),
        ("Shape", 15, helper.make_attribute("start", 1.0), ("attributes", "start"), "must be INT, not FLOAT"),
        ("Shape", 15, _raw("start", AttributeProto.INT, ref_attr_name="s"), ("attributes", "start"),
         "function attribute"),
        ("Constant", 13, _raw("value_string", AttributeProto.STRING, s=b"\xff"),
         ("attributes", "value_string"), "UTF-8"),
        ("RandomUniformLike", 22, helper.make_attribute("dtype", 99), ("attributes", "dtype"),
         "not a TensorProto element type"),
        ("Constant", 13, helper.make_attribute("value", _short_tensor()),
         ("attributes", "value"), "float_data has 1 entries"),
    ],
)  # fmt: skip
def test_refusals(
    op_type: str, version: int, attribute: AttributeProto, loc: tuple, match: str
) -> None:
    with pytest.raises(InvalidInput, match=match) as caught:
        node_attributes(resolve(op_type, version), [attribute])
    assert caught.value.operator == f"{op_type}-{version}"
    assert caught.value.loc[:2] == loc


def test_an_attribute_given_twice_is_refused() -> None:
    twice = [helper.make_attribute("start", 1), helper.make_attribute("start", 2)]
    with pytest.raises(
        InvalidInput, match=r"Shape-15: attributes\.start: attribute 'start' is given twice"
    ):
        node_attributes(resolve("Shape", 15), twice)


def test_tensor_limits_apply() -> None:
    value = numpy_helper.from_array(np.zeros(100, np.float32))
    with pytest.raises(PayloadTooLarge) as caught:
        node_attributes(resolve("Constant", 13), [helper.make_attribute("value", value)],
                        Limits(max_elements=10))  # fmt: skip
    assert caught.value.loc[:2] == ("attributes", "value")
    assert caught.value.operator == "Constant-13"
