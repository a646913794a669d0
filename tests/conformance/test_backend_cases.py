"""Every onnx backend node case of the served operators, run through the kernel layer."""

import numpy as np
import pytest
from onnx import numpy_helper
from onnx.backend.test.case.test_case import TestCase

from service.kernels.context import KernelContext
from service.operators.node_attributes import node_attributes
from service.operators.registry import resolve
from service.operators.run import run

from .backend_cases import backend_cases, opset

CASES = backend_cases()
CTX = KernelContext(max_output_bytes=1 << 30)


def test_every_case_is_collected() -> None:
    # 17 in onnx 1.23: Constant 1, ConstantOfShape 3, Shape 11, Tile 2 (none for
    # RandomUniformLike). A change means onnx added or dropped cases: look at them.
    assert len(CASES) == 17, [case.name for case in CASES]


def _proto_round_trip(array: np.ndarray) -> np.ndarray:
    """The array as a runtime receives it: through a TensorProto."""
    return numpy_helper.to_array(numpy_helper.from_array(array))


@pytest.mark.parametrize("case", CASES, ids=lambda case: case.name)
def test_backend_case(case: TestCase) -> None:
    node = case.model.graph.node[0]
    op = resolve(node.op_type, opset(case))
    attributes = node_attributes(op, node.attribute)
    for inputs, expected in case.data_sets:
        feeds = {
            formal: _proto_round_trip(array)
            for formal, array in zip(op.inputs, inputs, strict=False)
        }
        outputs = run(op, feeds, attributes, CTX)
        assert len(outputs) == len(expected) == len(node.output)
        for (name, actual), want in zip(outputs.items(), expected, strict=True):
            want = _proto_round_trip(np.asarray(want))
            assert actual.shape == want.shape, name
            assert actual.dtype == want.dtype, name
            if node.op_type == "RandomUniformLike":  # random: shape, type and range only
                values = actual.astype(np.float64)
                assert attributes["low"] <= values.min() and values.max() < attributes["high"]
                continue
            # These operators copy or count; nothing rounds, so the match must be exact.
            np.testing.assert_array_equal(actual, want, err_msg=name, strict=True)
