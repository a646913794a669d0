"""The two ways a node runs: on our kernels (`KernelStep`) or on onnx.reference
(`ReferenceStep`). Both are built once per model and called once per run."""

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from onnx import ModelProto, NodeProto, TypeProto, helper

from service.errors import InvalidInput, PayloadTooLarge
from service.kernels.context import KernelContext
from service.operators.registry import OpVersion
from service.operators.run import run as run_node

Value = Any  # an array; a list or None only between reference nodes (sequences, optionals)


@dataclass(frozen=True)
class NodeReport:
    """Which node ran, at which schema version, where: "kernel" or "reference"."""

    name: str
    op_type: str
    domain: str
    version: int | None
    ran_on: str


@dataclass(frozen=True)
class KernelStep:
    """A node of a served operator: attributes decoded and checked at load time."""

    report: NodeReport
    reads: tuple[str, ...]  # the node's inputs by position; "" for an omitted optional one
    writes: tuple[str, ...]
    op: OpVersion
    attributes: dict[str, Any]
    max_output_bytes: int
    claims_outputs = True  # the kernel claims its output before allocating it (reserve)

    def __call__(self, values: Sequence[Value], budget: int, run: KernelContext) -> list[Value]:
        inputs: dict[str, np.ndarray | None] = {}
        for formal, name, value in zip(self.op.inputs, self.reads, values, strict=False):
            if name and not isinstance(value, np.ndarray):
                raise InvalidInput(f"input {name!r} is a {type(value).__name__}, not a tensor",
                                   loc=("inputs", formal))  # fmt: skip
            inputs[formal] = value if name else None
        # an intermediate: held to the graph's budget, claimed from the run's reservation
        ctx = KernelContext(min(self.max_output_bytes, budget), output_format=None,
                            claims=run.claims)  # fmt: skip
        outputs = run_node(self.op, inputs, self.attributes, ctx)
        return [outputs[formal] for formal in self.op.outputs[: len(self.writes)]]


class ReferenceStep:
    """A node of a standard operator without a kernel, run on onnx.reference as a one-node
    model. Names its subgraphs read from the enclosing graph are inputs of that model."""

    claims_outputs = False  # the reference allocates as it likes: claimed once made

    def __init__(
        self,
        report: NodeReport,
        node: NodeProto,
        outer: Sequence[str],
        model: ModelProto,
        types: Mapping[str, TypeProto],
    ) -> None:
        from onnx.reference import ReferenceEvaluator  # imported only when the fallback is on

        from service.runtime.reference_fixes import corrections

        self.report = report
        self.reads = tuple(dict.fromkeys([*(n for n in node.input if n), *outer]))
        self.writes = tuple(node.output)
        # Typed where the model (or shape inference) says: the reference expands functions
        # whose body depends on the input types (GroupNormalization-21) only when it knows them.
        untyped = [
            helper.make_value_info(name, types.get(name, TypeProto())) for name in self.reads
        ]
        outputs = [helper.make_value_info(name, TypeProto()) for name in node.output if name]
        graph = helper.make_graph([node], "node", untyped, outputs)
        one = helper.make_model(graph, opset_imports=model.opset_import,
                                functions=model.functions, ir_version=model.ir_version)  # fmt: skip
        opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 1)
        self._evaluator = ReferenceEvaluator(one, new_ops=corrections(opset))

    def __call__(self, values: Sequence[Value], budget: int, run: KernelContext) -> list[Value]:
        try:
            produced = self._evaluator.run(None, dict(zip(self.reads, values, strict=True)))
        except MemoryError:  # a fallback worker's address-space limit (engines/workers/pool.py)
            raise PayloadTooLarge(
                "onnx.reference ran out of the memory the run may take (the "
                "fallback worker's limit, from OPSERVE_MAX_GRAPH_BYTES)"
            ) from None
        except Exception as exc:  # the reference's errors on bad input are the client's
            raise InvalidInput(f"onnx.reference refused the inputs: {_said(exc)}") from exc
        named = iter(produced)
        return [_value(next(named)) if name else None for name in self.writes]


def _value(value: Value) -> Value:
    if isinstance(value, np.generic):  # some reference ops answer numpy scalars
        value = np.asarray(value)
    if isinstance(value, np.ndarray) and value.dtype.kind in "US":
        # strings as numpy text (Cast to string does this): ONNX strings are object arrays
        return value.astype(object)
    return value


def _said(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}"
    return text if len(text) <= 500 else text[:500] + "..."
