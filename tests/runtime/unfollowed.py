"""Models whose run's size onnx's shape inference cannot follow, each making `n` floats and
answering their sum: issue 31's ConstantOfShape(Abs(d)), Tile(x, Add(r, r)), a shape through
Reshape (FOLDED: the onnxruntime engine's estimate now follows them, onnxruntime/fold.py), an If
branch and a Loop's scan outputs (MEASURED: counted as nothing before the run, measured after
it). `inputs(name, n)` is the v1 JSON that makes n floats."""

import numpy as np
from onnx import ModelProto, TensorProto, helper

from .models import I64, F, model, value

N = helper.make_node
BOOL = TensorProto.BOOL
ROW = 256 * 1024  # floats a Loop turn makes: 1 MiB, a block glibc keeps in its heap


def _fill(shape: str, out: str) -> helper.NodeProto:
    return N("ConstantOfShape", [shape], [out], value=helper.make_tensor("v", F, [1], [1.0]))


def _summed(steps: list, inputs: list, initializers: dict | None = None) -> ModelProto:
    steps = [*steps, N("ReduceSum", ["t"], ["y"], keepdims=0)]
    return model(steps, inputs, [value("y", F, [])], initializers)


def abs_fill() -> ModelProto:
    return _summed([N("Abs", ["d"], ["a"]), _fill("a", "t")], [value("d", I64, [1])])


def tile_add() -> ModelProto:
    return _summed([N("Add", ["r", "r"], ["rr"]), N("Tile", ["x", "rr"], ["t"])],
                   [value("x", F, [1]), value("r", I64, [1])])  # fmt: skip


def reshaped() -> ModelProto:
    return _summed([N("Reshape", ["d", "flat"], ["s"]), _fill("s", "t")],
                   [value("d", I64, [1])], {"flat": np.array([1], np.int64)})  # fmt: skip


def branch() -> ModelProto:
    """If(c) then the fill's sum else 0: the fill lives in the branch."""
    then = helper.make_graph([_fill("d", "f"), N("ReduceSum", ["f"], ["s"], keepdims=0)],
                             "then", [], [value("s", F, [])])  # fmt: skip
    other = helper.make_graph([N("Constant", [], ["z"], value=helper.make_tensor("z", F, [], [0]))],
                              "else", [], [value("z", F, [])])  # fmt: skip
    steps = [N("If", ["c"], ["y"], then_branch=then, else_branch=other)]
    return model(steps, [value("c", BOOL, []), value("d", I64, [1])], [value("y", F, [])])


def scan() -> ModelProto:
    """Loop(k) whose scan output is a fill of d floats a turn: k x d floats."""
    body = helper.make_graph([N("Identity", ["cond_in"], ["cond_out"]), _fill("d", "row")],
                             "body", [value("i", I64, []), value("cond_in", BOOL, [])],
                             [value("cond_out", BOOL, []), value("row", F, [None])])  # fmt: skip
    return _summed([N("Loop", ["k", ""], ["t"], body=body)],
                   [value("k", I64, []), value("d", I64, [1])])  # fmt: skip


UNFOLLOWED = {"abs_fill": abs_fill, "tile_add": tile_add, "reshaped": reshaped,
              "branch": branch, "scan": scan}  # fmt: skip
FOLDED = ("abs_fill", "tile_add", "reshaped")
MEASURED = ("branch", "scan")


def inputs(name: str, n: int) -> dict[str, dict]:
    """The v1 JSON inputs that make `name` fill n floats (n a multiple of 2 and of ROW)."""
    count = {"dtype": "int64", "data": [n]}
    if name == "abs_fill":
        return {"d": {"dtype": "int64", "data": [-n]}}
    if name == "tile_add":
        return {"x": {"dtype": "float", "data": [1.0]}, "r": {"dtype": "int64", "data": [n // 2]}}
    if name == "branch":
        return {"c": {"dtype": "bool", "shape": [], "data": True}, "d": count}
    if name == "scan":
        return {"k": {"dtype": "int64", "shape": [], "data": n // ROW},
                "d": {"dtype": "int64", "data": [ROW]}}  # fmt: skip
    return {"d": count}


def arrays(name: str, n: int) -> dict[str, np.ndarray]:
    """inputs(name, n) as arrays, for a model run in process."""
    kinds = {"int64": np.int64, "float": np.float32, "bool": np.bool_}
    return {k: np.array(v["data"], kinds[v["dtype"]]) for k, v in inputs(name, n).items()}
