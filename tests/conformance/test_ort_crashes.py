"""Nodes that crash onnxruntime on values a client may send (service/engines/onnxruntime/crashes.py):
each crash still happens (run in a child process: if a new onnxruntime fixes one, its test
fails here and its entry goes), and the screen finds exactly the models that could reach it,
through the inputs' values or their shapes (SHAPED: a dividend computed from Shape or Size)."""

import signal
import subprocess
import sys

import numpy as np
import pytest
from onnx import ModelProto, TensorProto, helper, numpy_helper

from service.engines.onnxruntime.crashes import crashes
from tests.runtime.models import I64, F, model, value

I32, U8 = TensorProto.INT32, TensorProto.UINT8
N = helper.make_node

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


SHAPED_CRASH = """
import numpy as np, onnxruntime as ort, sys
from tests.conformance.test_ort_crashes import SHAPED
built, shape = SHAPED[sys.argv[1]]
session = ort.InferenceSession(built().SerializeToString(), providers=["CPUExecutionProvider"])
session.run(None, {"x": np.zeros(shape, np.uint8)})
"""


def _shaped(nodes: list, divisor: str = "minus", x: list | None = None) -> ModelProto:
    """Shape(x) as s (x uint8), then `nodes` ending in `dividend`, divided by `divisor`."""
    nodes = [N("Shape", ["x"], ["s"]), *nodes, N("Div", ["dividend", divisor], ["q"], name="div")]
    known = {"minus": np.array([-1], np.int64), "two": np.array([2], np.int64),
             "one": np.array([1], np.int64), "three": np.array([3], np.int64),
             "i0": np.array(0, np.int64), "i1": np.array(1, np.int64), "heads": np.array([2, 3, 4], np.int64)}  # fmt: skip
    used = {n for node in nodes for n in node.input}
    return model(nodes, [value("x", U8, x or [None, None, None])], [value("q", I64, [1])],
                 {k: v for k, v in known.items() if k in used})  # fmt: skip


def _mul() -> ModelProto:
    """s[1] * s[1] * s[1]: 2**63 (the smallest int64) for a dimension of 2**21."""
    return _shaped([N("Gather", ["s", "i1"], ["a"]), N("Mul", ["a", "a"], ["b"]),
                    N("Mul", ["b", "a"], ["dividend"])])  # fmt: skip


def _neg_sub() -> ModelProto:
    """-s[1] * s[1] * s[1] - s[0]: -2**63 for a dimension of 2**21 (and s[0] = 0)."""
    return _shaped([N("Gather", ["s", "i1"], ["a"]), N("Neg", ["a"], ["n"]),
                    N("Mul", ["n", "a"], ["b"]), N("Mul", ["b", "a"], ["c"]),
                    N("Gather", ["s", "i0"], ["z"]), N("Sub", ["c", "z"], ["dividend"])])  # fmt: skip


def _size() -> ModelProto:
    """Size(x) * 2**62: -2**63 for two elements."""
    return model([N("Size", ["x"], ["z"]), N("Mul", ["z", "big"], ["dividend"]),
                  N("Div", ["dividend", "minus"], ["q"], name="div")],
                 [value("x", U8, [None, None, None])], [value("q", I64, [1])],
                 {"big": np.array(2**62, np.int64), "minus": np.array([-1], np.int64)})  # fmt: skip


def _slice_concat() -> ModelProto:
    """ReduceProd(Concat(s[1:2], Gather(s, [1]))) * s[1]: Slice, Gather and Concat of a shape."""
    return _shaped([N("Slice", ["s", "one", "two"], ["a"]), N("Gather", ["s", "one"], ["b"]),
                    N("Concat", ["a", "b"], ["c"], axis=0),
                    N("ReduceProd", ["c"], ["p"], keepdims=0),
                    N("Mul", ["p", "a"], ["dividend"])])  # fmt: skip


def _reduce_prod() -> ModelProto:
    """ReduceProd(s[1:3]) cubed (onnxruntime's ReduceProd saturates past 2**63, Mul wraps)."""
    return _shaped([N("Slice", ["s", "one", "three"], ["a"]),
                    N("ReduceProd", ["a"], ["p"], keepdims=0), N("Mul", ["p", "p"], ["b"]),
                    N("Mul", ["b", "p"], ["dividend"])])  # fmt: skip


def _declared_static() -> ModelProto:
    """Shape(Identity(x)) * itself * itself / -1, the Identity's output declared of fixed dims:
    onnxruntime does not check an intermediate's declared dims, so they prove nothing."""
    built = _mul()
    built.graph.node.insert(0, N("Identity", ["x"], ["y"]))
    built.graph.node[1].input[0] = "y"  # Shape(y)
    built.graph.value_info.append(value("y", U8, [0, 2**21, 1]))
    return built


SHAPED = {name: (built, (0, 2**21, 1)) for name, built in (
    ("mul", _mul), ("neg_sub", _neg_sub), ("slice_concat", _slice_concat),
    ("reduce_prod", _reduce_prod), ("declared", _declared_static))} | {
    "size": (_size, (1, 2, 1))}  # fmt: skip
"""Ways a client's inputs' shapes reach the smallest int64, and a shape that does it: a zero
dimension lets another be 2**21 in a tensor of no elements (within OPSERVE_MAX_ELEMENTS, which
counts zeros as 1), and three of it multiply to 2**63."""


@pytest.mark.parametrize("name", sorted(SHAPED))
def test_onnxruntime_crashes_dividing_a_value_computed_from_a_shape(name: str) -> None:
    done = subprocess.run([sys.executable, "-c", SHAPED_CRASH, name], capture_output=True,
                          timeout=60, check=False)  # fmt: skip
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


def _by_heads(divisor: str, constant: bool = False, x: list | None = None) -> ModelProto:
    """s[1] (a shape's dimension) divided by `divisor`: an initializer, or a Constant node."""
    steps = [N("Gather", ["s", "i1"], ["dividend"])]
    if constant:
        steps.append(N("Constant", [], ["by"], value=numpy_helper.from_array(
            np.array([2, -1], np.int64) if divisor == "minus" else np.array([4], np.int64))))  # fmt: skip
        divisor = "by"
    return _shaped(steps, divisor, x)


def _divisor_input() -> ModelProto:
    """s[1] / two, where "two" is an input: a client sends -1."""
    built = _by_heads("two")
    two = next(t for t in built.graph.initializer if t.name == "two")
    built.graph.initializer.remove(two)  # an input of the same name
    built.graph.input.append(value("two", I64, [1]))
    return built


@pytest.mark.parametrize(("built", "risky"), [
    (divide(I32), True), (divide(I64), True), (_in_a_branch(I64), True),
    (divide(F), False), (divide(TensorProto.INT8), False), (divide(TensorProto.UINT64), False),
    (_shape_divided(), False), (_in_a_branch(F), False),
    *((built(), True) for built, _shape in SHAPED.values()),
    (_by_heads("minus"), True), (_by_heads("minus", constant=True), True),
    (_divisor_input(), True),
    # a divisor known without -1: any dividend is safe (a dimension divided by a head count)
    (_by_heads("heads"), False), (_by_heads("two", constant=True), False),
    # a shape inference fixed (declared dims) is not the client's
    (_by_heads("minus", x=[0, 4, 1]), False), (_shaped([N("Mul", ["s", "s"], ["dividend"])],
                                                       x=[2, 3, 4]), False),
])  # fmt: skip
def test_the_screen_finds_the_models_a_client_could_crash(built: ModelProto, risky: bool) -> None:
    why = crashes(built)
    assert (why is not None) == risky, why
    if risky:
        assert "SIGFPE" in why and "(Div)" in why  # type: ignore[operator]
