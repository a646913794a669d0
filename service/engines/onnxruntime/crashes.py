"""Nodes that crash onnxruntime, and the server's process with it, on values a client may send:
a model with one runs on the exact engine, with the reason. The load probe cannot find these
(they load, and run, on other values), and a crash while the server runs the model cannot be
caught. Found by hand on onnxruntime 1.32; tests/conformance/test_ort_crashes.py crashes each in
a child process, so a new onnxruntime that fixes one shows there, and its entry goes.

- Div of int32 or int64 whose dividend is the type's smallest value and whose divisor is -1:
  the CPU traps (SIGFPE) and the process dies (a zero divisor is a clean error). A dividend
  made only of initializers, constants and shapes cannot be sent: constants are folded at load
  (in the probe, which would crash instead) and shapes are never negative.
"""

import onnx.shape_inference
from onnx import GraphProto, ModelProto, NodeProto, TensorProto

from service.runtime.subgraphs import every_node, subgraphs

TRAPS = frozenset({TensorProto.INT32, TensorProto.INT64})  # Div's types that trap; int8 and
# int16 are divided as int (no overflow), unsigned types have no -1
SHAPES = frozenset({"Shape", "Size", "Constant"})  # nodes whose outputs no client sets


def crashes(model: ModelProto) -> str | None:
    """Why onnxruntime could crash running the model (None: no node known to)."""
    if not any(node.op_type == "Div" for node in every_node(model.graph)):
        return None  # most models: no shape inference here
    try:
        inferred = onnx.shape_inference.infer_shapes(model, strict_mode=False)
    except Exception:  # inference is a help here: the declared types remain
        inferred = model
    types = _elem_types(inferred.graph)
    found = _risky(inferred.graph, set(), types)
    if found is None:
        return None
    name = repr(found.name[:100]) if found.name else "(unnamed)"
    return (f"node {name} (Div): onnxruntime 1.32 crashes the process (SIGFPE) dividing the "
            "smallest int32 or int64 by -1, which a client could send (docs/models.md)")  # fmt: skip


def _risky(graph: GraphProto, outer: set[str], types: dict[str, int]) -> NodeProto | None:
    """The first integer Div whose dividend a client's values may reach, in `graph` or its
    subgraphs; `outer`: names of enclosing graphs that no client sets."""
    fixed = outer | {t.name for t in graph.initializer}
    for node in graph.node:
        domain = node.domain in ("", "ai.onnx")
        if domain and node.op_type == "Div" and node.input[0] not in fixed and (
                types.get(node.input[0], 0) in TRAPS or node.input[0] not in types):  # fmt: skip
            return node
        for inner in subgraphs(node):
            found = _risky(inner, fixed, types)
            if found is not None:
                return found
        if (domain and node.op_type in SHAPES) or all(n in fixed for n in node.input if n):
            fixed.update(node.output)
    return None


def _elem_types(graph: GraphProto) -> dict[str, int]:
    """Element types of the values the graph and its subgraphs declare or inference found."""
    types = {t.name: t.data_type for t in graph.initializer}
    for info in [*graph.input, *graph.value_info, *graph.output]:
        if info.type.HasField("tensor_type") and info.type.tensor_type.elem_type:
            types[info.name] = info.type.tensor_type.elem_type
    for node in graph.node:
        for inner in subgraphs(node):
            types.update(_elem_types(inner))
    return types
