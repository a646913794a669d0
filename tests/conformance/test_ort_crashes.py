"""Nodes that crash onnxruntime on values a client may send (service/engines/onnxruntime/crashes.py):
each crash still happens (run in a child process: if a new onnxruntime fixes one, its test
fails here and its entry goes), and the screen finds exactly the models that could reach it."""

import signal
import subprocess
import sys

import numpy as np
import pytest
from onnx import ModelProto, TensorProto, helper

from service.engines.onnxruntime.crashes import crashes
from tests.runtime.models import I64, F, model, value

I32 = TensorProto.INT32

CRASH = """
import numpy as np, onnxruntime as ort, sys
from onnx import helper
from tests.conformance.test_ort_crashes import divide
dtype = np.dtype(sys.argv[1])
session = ort.InferenceSession(divide(helper.np_dtype_to_tensor_dtype(dtype)).SerializeToString(),
                               providers=["CPUExecutionProvider"])
session.run(None, {"a": np.array([np.iinfo(dtype).min], dtype), "b": np.array([-1], dtype)})
"""


def divide(elem: int) -> ModelProto:
    """y = a / b, both inputs."""
    return model([helper.make_node("Div", ["a", "b"], ["y"], name="div")],
                 [value("a", elem, [None]), value("b", elem, [None])], [value("y", elem, [None])])  # fmt: skip


@pytest.mark.parametrize("dtype", ["int32", "int64"])
def test_onnxruntime_still_crashes_dividing_the_smallest_integer_by_minus_one(dtype: str) -> None:
    done = subprocess.run([sys.executable, "-c", CRASH, dtype], capture_output=True, timeout=60,
                          check=False)  # fmt: skip
    assert done.returncode == -signal.SIGFPE, (done.returncode, done.stderr[-500:])


def _shape_divided() -> ModelProto:
    """Shape(x)[0] / 2 as int64: a dividend no client sets."""
    nodes = [helper.make_node("Shape", ["x"], ["s"]),
             helper.make_node("Div", ["s", "two"], ["half"], name="half")]  # fmt: skip
    return model(nodes, [value("x", F, [None])], [value("half", I64, [1])],
                 {"two": np.array([2], np.int64)})  # fmt: skip


def _in_a_branch(elem: int) -> ModelProto:
    """If(c) then a / b else a: the Div in a subgraph, on the outer graph's inputs."""
    then = helper.make_graph([helper.make_node("Div", ["a", "b"], ["q"], name="inner")], "then",
                             [], [value("q", elem, [None])])  # fmt: skip
    other = helper.make_graph([helper.make_node("Identity", ["a"], ["r"])], "else", [],
                              [value("r", elem, [None])])  # fmt: skip
    node = helper.make_node("If", ["c"], ["y"], then_branch=then, else_branch=other)
    return model([node], [value("c", TensorProto.BOOL, []), value("a", elem, [None]),
                          value("b", elem, [None])], [value("y", elem, [None])])  # fmt: skip


@pytest.mark.parametrize(("built", "risky"), [
    (divide(I32), True), (divide(I64), True), (_in_a_branch(I64), True),
    (divide(F), False), (divide(TensorProto.INT8), False), (divide(TensorProto.UINT64), False),
    (_shape_divided(), False), (_in_a_branch(F), False),
])  # fmt: skip
def test_the_screen_finds_the_models_a_client_could_crash(built: ModelProto, risky: bool) -> None:
    why = crashes(built)
    assert (why is not None) == risky, why
    if risky:
        assert "SIGFPE" in why and "(Div)" in why  # type: ignore[operator]
