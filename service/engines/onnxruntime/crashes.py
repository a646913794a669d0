"""Nodes that crash onnxruntime, and the server's process with it, on values a client may send:
a model with one runs on the exact engine, with the reason. The load probe cannot find these
(they load, and run, on other values), and a crash while the server runs the model cannot be
caught. Found by hand on onnxruntime 1.32; tests/conformance/test_ort_crashes.py crashes each in
a child process, so a new onnxruntime that fixes one shows there, and its entry goes.

- Div of int32 or int64 whose dividend is the type's smallest value and whose divisor is -1:
  the CPU traps (SIGFPE) and the process dies (a zero divisor is a clean error, and Mod of the
  same values answers 0). A client reaches the dividend through its inputs' values and through
  their shapes too: a tensor with a zero dimension can have any other dimension, so Shape or
  Size of it, multiplied, negated or reduced (ReduceProd), wraps to -2**63. Only a value made
  of initializers, constants and the shapes of values so made or of inputs declared with
  fixed dims cannot be sent (constants are folded at load, in the probe, which would crash
  instead). A divisor given as an initializer or a
  constant without -1 among its values makes any dividend safe (the common case: a dimension
  divided by a head count).
"""

import onnx.shape_inference
from onnx import GraphProto, ModelProto, NodeProto, TensorProto, numpy_helper

from service.runtime.subgraphs import every_node, subgraphs

TRAPS = frozenset({TensorProto.INT32, TensorProto.INT64})  # Div's types that trap; int8 and
# int16 are divided as int (no overflow), unsigned types have no -1
SIZES = frozenset({"Shape", "Size"})  # what a client sets through its inputs' shapes


def crashes(model: ModelProto) -> str | None:
    """Why onnxruntime could crash running the model (None: no node known to)."""
    if not any(node.op_type == "Div" for node in every_node(model.graph)):
        return None  # most models: no shape inference here
    try:
        inferred = onnx.shape_inference.infer_shapes(model, strict_mode=False)
    except Exception:  # inference is a help here: the declared types remain
        inferred = model
    known = _Known(inferred.graph)
    found = _risky(inferred.graph, set(), known)
    if found is None:
        return None
    name = repr(found.name[:100]) if found.name else "(unnamed)"
    return (f"node {name} (Div): onnxruntime 1.32 crashes the process (SIGFPE) dividing the "
            "smallest int32 or int64 by -1, which a client could send (as values, or as its "
            "inputs' shapes) (docs/models.md)")  # fmt: skip


class _Known:
    """What the model says of its values before any request: element types, the main graph's
    inputs of fully static shape (onnxruntime refuses other dims there; an intermediate's
    declared shape is not checked while it runs, so it proves nothing), and the values of
    initializers and Constant nodes (its subgraphs' included)."""

    def __init__(self, graph: GraphProto) -> None:
        self.types: dict[str, int] = {}
        self.tensors: dict[str, TensorProto] = {}
        self._add(graph)
        self.static = {t.name for t in graph.initializer} | {
            info.name for info in graph.input if info.type.HasField("tensor_type")
            and info.type.tensor_type.HasField("shape")
            and all(d.HasField("dim_value") for d in info.type.tensor_type.shape.dim)}  # fmt: skip

    def _add(self, graph: GraphProto) -> None:
        for tensor in graph.initializer:
            self.types[tensor.name] = tensor.data_type
            self.tensors[tensor.name] = tensor
        for info in [*graph.input, *graph.value_info, *graph.output]:
            kind = info.type.tensor_type if info.type.HasField("tensor_type") else None
            if kind is not None and kind.elem_type:
                self.types[info.name] = kind.elem_type
        for node in graph.node:
            value = [a.t for a in node.attribute if a.name == "value" and a.HasField("t")]
            if node.op_type == "Constant" and value and node.output:
                self.tensors[node.output[0]] = value[0]
            for inner in subgraphs(node):
                self._add(inner)

    def never_minus_one(self, name: str) -> bool:
        """Whether `name` is an initializer or constant with no -1 among its values."""
        tensor = self.tensors.get(name)
        if tensor is None or tensor.data_location == TensorProto.EXTERNAL:
            return False
        try:
            return not (numpy_helper.to_array(tensor) == -1).any()
        except Exception:  # a tensor numpy cannot read: unknown values
            return False


def _risky(graph: GraphProto, outer: set[str], known: _Known) -> NodeProto | None:
    """The first integer Div whose dividend a client's values or shapes may reach and whose
    divisor may be -1, in `graph` or its subgraphs; `outer`: names of enclosing graphs that no
    client sets."""
    fixed = outer | {t.name for t in graph.initializer}
    for node in graph.node:
        domain = node.domain in ("", "ai.onnx")
        if domain and node.op_type == "Div" and _traps(node, fixed, known):
            return node
        for inner in subgraphs(node):
            found = _risky(inner, fixed, known)
            if found is not None:
                return found
        if domain and node.op_type in SIZES:  # fixed only where the model fixed the shape
            if node.input and (node.input[0] in known.static or node.input[0] in fixed):
                fixed.update(node.output)
        elif all(n in fixed for n in node.input if n):  # Constant's included (no inputs)
            fixed.update(node.output)
    return None


def _traps(node: NodeProto, fixed: set[str], known: _Known) -> bool:
    dividend, divisor = [*node.input, "", ""][:2]
    if dividend in fixed or known.never_minus_one(divisor):
        return False
    return known.types.get(dividend, 0) in TRAPS or dividend not in known.types
