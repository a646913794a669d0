"""Models that harm the process running them on onnxruntime (issue 31's table), built small
with onnx.helper: each crashes, hangs or swells onnxruntime for inputs the client chooses.
`harms(built, inputs)` proves it in a child process, never in the tests' own."""

import pickle
import subprocess
import sys

import numpy as np
from onnx import ModelProto, TensorProto, helper

from tests.runtime.models import I64, F, model, value

INT64_MIN = -(2**63)


def shape_divided() -> ModelProto:
    """(INT64_MIN + 1 - len(x)) / -1 in int64: len(x) == 1 makes INT64_MIN / -1, which kills
    the process with SIGFPE; any other length answers. The dividend follows the shape."""
    nodes = [helper.make_node("Shape", ["x"], ["s"], name="shape"),
             helper.make_node("Sub", ["base", "s"], ["d"], name="sub"),
             helper.make_node("Div", ["d", "minus_one"], ["y"], name="div")]  # fmt: skip
    return model(nodes, [value("x", F, [None])], [value("y", I64, [1])],
                 {"base": np.array([INT64_MIN + 1], np.int64),
                  "minus_one": np.array([-1], np.int64)})  # fmt: skip


def shape_divided_size() -> ModelProto:
    """The same through Size and Neg: -(size) - (2**63 - 1) reaches INT64_MIN at size 1."""
    nodes = [helper.make_node("Size", ["x"], ["n"], name="size"),
             helper.make_node("Neg", ["n"], ["m"], name="neg"),
             helper.make_node("Sub", ["m", "big"], ["d"], name="sub"),
             helper.make_node("Div", ["d", "minus_one"], ["y"], name="div")]  # fmt: skip
    return model(nodes, [value("x", F, [None])], [value("y", I64, [])],
                 {"big": np.array(2**63 - 1, np.int64),
                  "minus_one": np.array(-1, np.int64)})  # fmt: skip


def empty_loop() -> ModelProto:
    """A Loop of `trips` turns (an input) whose body only passes its values on: onnxruntime
    checks no stop inside it, so a huge count never ends (RunOptions.terminate unseen)."""
    body = helper.make_graph(
        [helper.make_node("Identity", ["cond_in"], ["cond_out"]),
         helper.make_node("Identity", ["x_in"], ["x_out"])], "body",
        [value("i", I64, []), value("cond_in", TensorProto.BOOL, []), value("x_in", F, [1])],
        [value("cond_out", TensorProto.BOOL, []), value("x_out", F, [1])])  # fmt: skip
    nodes = [helper.make_node("Squeeze", ["trips"], ["m"], name="count"),
             helper.make_node("Squeeze", ["cond"], ["c"], name="condition"),
             helper.make_node("Loop", ["m", "c", "x"], ["y"], name="loop", body=body)]  # fmt: skip
    # the count and condition as one-element tensors: Triton's configuration has no scalars
    return model(nodes, [value("x", F, [1]), value("trips", I64, [1]),
                         value("cond", TensorProto.BOOL, [1])], [value("y", F, [1])])  # fmt: skip


def zero_kernel_conv() -> ModelProto:
    """A Conv whose weights (the client's input) have a zero-size kernel dimension."""
    node = helper.make_node("Conv", ["x", "w"], ["y"], name="conv")
    return model([node], [value("x", F, [1, 1, None, None]), value("w", F, [1, 1, None, None])],
                 [value("y", F, [1, 1, None, None])])  # fmt: skip


def swell() -> ModelProto:
    """If(cond) fills ConstantOfShape(n) doubles in its branch and sums them: a size the
    memory estimate cannot follow before the run (a branch's), so only the process's own
    limit stops it."""
    fill = helper.make_graph(
        [helper.make_node("ConstantOfShape", ["n"], ["t"], name="fill",
                          value=helper.make_tensor("v", TensorProto.DOUBLE, [1], [1.0])),
         helper.make_node("ReduceSum", ["t"], ["s"], name="sum", keepdims=0)],
        "fill", [], [value("s", TensorProto.DOUBLE, [])])  # fmt: skip
    none = helper.make_graph(
        [helper.make_node("Constant", [], ["z"], name="zero",
                          value=helper.make_tensor("z0", TensorProto.DOUBLE, [], [0.0]))],
        "none", [], [value("z", TensorProto.DOUBLE, [])])  # fmt: skip
    nodes = [helper.make_node("If", ["cond"], ["y"], name="branch", then_branch=fill,
                              else_branch=none)]  # fmt: skip
    return model(nodes, [value("n", I64, [1]), value("cond", TensorProto.BOOL, [1])],
                 [value("y", TensorProto.DOUBLE, [])])  # fmt: skip


CHILD = """
import pickle, sys
import onnxruntime as ort
data, inputs = pickle.loads(sys.stdin.buffer.read())
session = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
session.run(None, inputs)
"""


def harms(built: ModelProto, inputs: dict[str, np.ndarray], seconds: float) -> str:
    """What running `built` on onnxruntime does to a child process in `seconds`: "ok",
    "hang" (still running), or the signal or exit status that ended it."""
    message = pickle.dumps((built.SerializeToString(), inputs))
    try:
        done = subprocess.run([sys.executable, "-c", CHILD], input=message, capture_output=True,
                              timeout=seconds, check=False)  # fmt: skip
    except subprocess.TimeoutExpired:
        return "hang"
    if done.returncode < 0:
        import signal

        return signal.Signals(-done.returncode).name
    return "ok" if done.returncode == 0 else f"exit {done.returncode}"
