"""Nodes whose answers on onnxruntime differ from the ONNX specification's (onnx.reference's,
and the backend cases' expected outputs), found by comparing the two engines on every onnx
backend node case (tests/conformance/test_engines_agree.py, onnxruntime 1.32). A model with
such a node runs on the exact engine, with the reason; a new onnxruntime that fixes one shows
in that test, and the entry goes.

Differences that show only for some values (a NaN, an overflow, a string: KNOWN in that test,
docs/models.md "Where the engines differ") are not listed: no node type answers otherwise as
such, so routing by node type would make every model with a ReduceMax or a Cast slow for
inputs that have none of those values, and such a model answers as Triton's would."""

from onnx import ModelProto, NodeProto, helper


def _align_corners(node: NodeProto) -> bool:
    attributes = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    return (attributes.get("coordinate_transformation_mode") == b"align_corners"
            and attributes.get("mode", b"nearest") in (b"linear", b"cubic"))  # fmt: skip


def _causal(node: NodeProto) -> bool:
    return any(a.name == "is_causal" and a.i for a in node.attribute)


def _unpool_shape(node: NodeProto) -> bool:
    return len(node.input) > 2 and bool(node.input[2])


DIFFERS = {
    "DFT": (lambda node: True, "its DFT answers differ from the specification's"),
    "STFT": (lambda node: True, "its STFT answers differ from the specification's"),
    "Resize": (_align_corners, "its linear and cubic Resize with align_corners differ"),
    "Attention": (_causal, "its causal Attention differs from the specification's"),
    "MaxUnpool": (_unpool_shape, "its MaxUnpool with output_shape differs"),
    "Dropout": (lambda node: len(node.input) > 2 and bool(node.input[2]),
                "its training-mode Dropout draws other numbers"),
}  # fmt: skip


def differs(model: ModelProto) -> str | None:
    """Why onnxruntime would answer the model differently from the exact engine (None: it
    would not, as far as the backend cases show). Nodes of the main graph only."""
    for node in model.graph.node:
        rule = DIFFERS.get(node.op_type) if node.domain in ("", "ai.onnx") else None
        if rule is not None and rule[0](node):
            name = repr(node.name[:100]) if node.name else "(unnamed)"
            return f"node {name} ({node.op_type}): {rule[1]} (docs/models.md)"
    return None
