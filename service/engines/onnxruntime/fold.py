"""Small integer arithmetic on a request's small number inputs, folded before shapes are
inferred again with those values (memory.py's skeleton). onnx's inference carries values
through Shape, Gather, Slice, Concat and a few more, not through Abs, an Add of two values or
a Reshape, so `ConstantOfShape(Abs(d))` was sized as nothing. A node of FOLDED whose inputs are
all known integers of at most SMALL elements becomes a Constant of its value, which inference
reads; anything else is left as it is (its size then stays unknown, as before)."""

from collections.abc import Callable
from functools import reduce

import numpy as np
from onnx import GraphProto, NodeProto, TensorProto, helper, numpy_helper

SMALL = 64  # elements: a shape or a count (memory.py's SMALL_INITIALIZER)
INTEGERS = (TensorProto.INT64, TensorProto.INT32)


def _reshaped(data: np.ndarray, shape: np.ndarray) -> np.ndarray:
    if (shape == 0).any():
        raise ValueError("a 0 in Reshape's shape copies a dimension: not folded")
    return data.reshape(tuple(int(n) for n in shape))


FOLDED: dict[str, Callable[..., np.ndarray]] = {
    "Abs": np.abs, "Neg": np.negative, "Identity": np.asarray,
    "Add": np.add, "Sub": np.subtract, "Mul": np.multiply,
    "Max": lambda *xs: reduce(np.maximum, xs), "Min": lambda *xs: reduce(np.minimum, xs),
    "Reshape": _reshaped,
}  # fmt: skip
"""Integer arithmetic onnxruntime does as numpy does (wrapping on overflow), by op type."""


def fold(graph: GraphProto) -> None:
    """Replace, in place, each node of FOLDED whose inputs are known small integers (the
    graph's initializers, Constant nodes and nodes folded before it) by a Constant."""
    known = {t.name: numpy_helper.to_array(t) for t in graph.initializer
             if t.data_type in INTEGERS and _elements(t.dims) <= SMALL}  # fmt: skip
    for at, node in enumerate(graph.node):
        if node.domain not in ("", "ai.onnx") or len(node.output) != 1:
            continue
        if node.op_type == "Constant":
            _remember(node, known)
            continue
        step = FOLDED.get(node.op_type)
        if step is None or not node.input or not all(n in known for n in node.input):
            continue
        try:
            with np.errstate(all="ignore"):  # integers wrap, as onnxruntime's do
                value = np.asarray(step(*(known[n] for n in node.input)))
        except (ValueError, TypeError):  # shapes that do not broadcast, a Reshape it skips
            continue
        if value.dtype.kind != "i" or value.size > SMALL:
            continue
        known[node.output[0]] = value
        graph.node[at].CopyFrom(helper.make_node(
            "Constant", [], [node.output[0]], name=node.name,
            value=numpy_helper.from_array(value, node.output[0])))  # fmt: skip


def _remember(node: NodeProto, known: dict[str, np.ndarray]) -> None:
    for attribute in node.attribute:
        if attribute.name == "value" and attribute.HasField("t"):
            tensor = attribute.t
            if tensor.data_type in INTEGERS and _elements(tensor.dims) <= SMALL:
                known[node.output[0]] = numpy_helper.to_array(tensor)


def _elements(dims: object) -> int:
    return int(np.prod(list(dims))) if dims else 1  # type: ignore[call-overload]
