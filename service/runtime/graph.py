"""A loaded model and its runs: inputs checked against the graph, nodes run in order, each
intermediate released after its last consumer, the live bytes held to a budget."""

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from service.codecs.dtypes import element_type_of
from service.errors import InvalidInput, PayloadTooLarge, ServiceError, listed, located, shown_shape
from service.kernels.context import KernelContext
from service.runtime.steps import KernelStep, NodeReport, ReferenceStep, Value

Step = KernelStep | ReferenceStep


@dataclass(frozen=True)
class TensorSpec:
    """A graph input or output as the model declares it."""

    name: str
    elem_type: int  # onnx.TensorProto enum; 0 when the model leaves it unset
    shape: tuple[int | None, ...] | None  # None per dynamic dim; None for unknown rank


@dataclass(frozen=True)
class TraceEntry:
    """One intermediate value of a traced run."""

    name: str
    node: str
    op_type: str
    version: int | None
    ran_on: str
    value: Value
    microseconds: float


@dataclass
class RunResult:
    outputs: dict[str, np.ndarray]
    nodes: list[NodeReport]
    trace: list[TraceEntry] | None


@dataclass(frozen=True)
class LoadedModel:
    """A validated model, ready to run any number of times (from any thread)."""

    inputs: tuple[TensorSpec, ...]  # what a client may send; initializer-backed ones optional
    outputs: tuple[TensorSpec, ...]
    steps: tuple[Step, ...]
    initializers: Mapping[str, np.ndarray]
    max_graph_bytes: int
    # the serialized model, kept when a node runs on onnx.reference: such a run goes whole to
    # a worker process (workers/pool.py), which loads the model from it
    source: bytes = field(default=b"", repr=False)
    source_id: bytes = b""  # a digest of `source`: what a worker caches the loaded model by
    # why the exact engine runs a model whose configuration names onnxruntime ("": it was not
    # asked to, or it was asked for by name); choice.py
    engine_reason: str = ""

    @property
    def engine(self) -> str:
        """Which engine runs the model: "exact" (kernels, onnx.reference) or "onnxruntime"."""
        return "exact"

    @property
    def isolated(self) -> bool:
        """Whether runs go to a fallback worker process (a node runs on onnx.reference)."""
        return bool(self.source)

    @property
    def inline(self) -> bool:
        """Whether a small request may run on the event loop now: never on the exact engine,
        whose outputs cannot be sized before it runs (onnxruntime's: onnxruntime/inline.py)."""
        return False

    def run(self, inputs: Mapping[str, np.ndarray], outputs: Sequence[str] | None = None,
            *, trace: bool = False, ctx: KernelContext | None = None) -> RunResult:  # fmt: skip
        """Run the nodes the requested outputs need (all graph outputs by default), under the
        request's `ctx`: each intermediate is claimed from its memory reservation as it is made
        and given back when released, and the outputs' answer is bounded and claimed in the
        context's answer form (unbounded and unclaimed without a context)."""
        ctx = ctx or KernelContext(self.max_graph_bytes, output_format=None)
        control = ctx.control
        if self.isolated and control is not None and control.fallback is not None:
            isolated: RunResult = control.fallback.run(self, inputs, outputs, trace, ctx)
            self._check_answer(isolated, ctx)
            return isolated
        claims = ctx.claims
        wanted = self._wanted(outputs)
        values: dict[str, Value] = {**self.initializers, **self._feeds(inputs)}
        order = self._needed(wanted)
        last_use = {name: i for i in order for name in self.steps[i].reads}
        kept = set(wanted) | set(values)  # graph outputs and inputs are never released
        sizes: dict[str, int] = {}
        traced: list[TraceEntry] | None = [] if trace else None
        for i in order:
            step = self.steps[i]
            if control is not None:
                control.check(_label(step))
            start = time.perf_counter()
            produced = self._call(step, values, self.max_graph_bytes - sum(sizes.values()), ctx)
            took = (time.perf_counter() - start) * 1e6
            for name, value in zip(step.writes, produced, strict=True):
                if not name:
                    continue
                values[name], sizes[name] = value, _nbytes(value)
                if claims is not None and not step.claims_outputs:
                    claims.claim(sizes[name])  # made without asking first: claimed now
                if traced is not None:
                    traced.append(TraceEntry(name, step.report.name, step.report.op_type,
                                             step.report.version, step.report.ran_on, value,
                                             took))  # fmt: skip
            live = sum(sizes.values())
            if live > self.max_graph_bytes:
                raise PayloadTooLarge(
                    f"{_label(step)}: its outputs take the live intermediates to {live} bytes, "
                    f"over the limit of {self.max_graph_bytes} (OPSERVE_MAX_GRAPH_BYTES)"
                )
            if traced is None:  # a trace returns every intermediate: nothing is released
                for name in [n for n in sizes if last_use.get(n, -1) <= i and n not in kept]:
                    if claims is not None:
                        claims.unclaim(sizes[name])
                    del values[name], sizes[name]
        result = {name: _tensor(name, values[name]) for name in wanted}
        ran = RunResult(result, [self.steps[i].report for i in order], traced)
        self._check_answer(ran, ctx)
        return ran

    def _check_answer(self, result: RunResult, ctx: KernelContext) -> None:
        """The answer bounded (413) and claimed: the outputs, and the trace's values."""
        if ctx.output_format is None:
            return
        if len(result.outputs) == 1 and not result.trace:
            with located("outputs", next(iter(result.outputs))):
                ctx.check_answer(*result.outputs.values())
            return
        traced = [e.value for e in result.trace or () if isinstance(e.value, np.ndarray)]
        what = "the outputs and the trace" if traced else "the outputs"
        ctx.check_answer(*result.outputs.values(), *traced, what=what)

    def _call(self, step: Step, values: dict[str, Value], budget: int,
              ctx: KernelContext) -> list[Value]:  # fmt: skip
        try:
            return step([values[name] if name else None for name in step.reads], budget, ctx)
        except PayloadTooLarge as exc:
            if budget < getattr(step, "max_output_bytes", budget + 1):  # the graph budget bit
                exc.detail += (f" (the live intermediates leave {max(budget, 0)} of "
                               f"OPSERVE_MAX_GRAPH_BYTES={self.max_graph_bytes})")  # fmt: skip
            exc.operator = _label(step)
            raise
        except ServiceError as exc:
            exc.operator = _label(step)
            raise

    def _wanted(self, outputs: Sequence[str] | None) -> list[str]:
        names = [spec.name for spec in self.outputs]
        if outputs is None:
            return names
        for name in outputs:
            if name not in names:
                raise InvalidInput(f"the graph has no output {name[:100]!r}; its outputs are "
                                   f"{listed(names)}", loc=("outputs",))  # fmt: skip
        return list(dict.fromkeys(outputs))

    def _feeds(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        specs = {spec.name: spec for spec in self.inputs}
        for name in inputs:
            if name not in specs:
                raise InvalidInput(f"the graph has no input {name[:100]!r}; its inputs are "
                                   f"{listed(list(specs)) or 'none'}", loc=("inputs",))  # fmt: skip
        for spec in self.inputs:
            if spec.name in inputs:
                _check_input(spec, inputs[spec.name])
            elif spec.name not in self.initializers:
                raise InvalidInput(f"graph input {spec.name!r} is missing (it has no "
                                   "initializer to default to)", loc=("inputs", spec.name))  # fmt: skip
        return dict(inputs)

    def _needed(self, wanted: list[str]) -> list[int]:
        """Indices of the steps the wanted names depend on, in graph order."""
        producer = {name: i for i, step in enumerate(self.steps) for name in step.writes if name}
        needed: set[int] = set()
        stack = [producer[name] for name in wanted if name in producer]
        while stack:
            i = stack.pop()
            if i not in needed:
                needed.add(i)
                stack += [producer[n] for n in self.steps[i].reads if n in producer]
        return sorted(needed)


def _check_input(spec: TensorSpec, array: np.ndarray) -> None:
    loc = ("inputs", spec.name)
    sent = element_type_of(array)
    if spec.elem_type and sent.enum != spec.elem_type:
        declared = _type_name(spec.elem_type)
        raise InvalidInput(f"graph input {spec.name!r} is {declared}, not {sent.name}", loc=loc)
    if spec.shape is None:
        return
    fits = len(spec.shape) == array.ndim and all(
        dim is None or dim == got for dim, got in zip(spec.shape, array.shape, strict=True)
    )
    if not fits:
        declared = "[" + ", ".join("?" if d is None else str(d) for d in spec.shape) + "]"
        raise InvalidInput(f"graph input {spec.name!r} has shape {declared}, not "
                           f"{shown_shape(array.shape)}", loc=loc)  # fmt: skip


def _type_name(enum: int) -> str:
    from service.codecs.dtypes import by_enum

    try:
        return by_enum(enum).name
    except ServiceError:
        return f"element type {enum}"


def _tensor(name: str, value: Value) -> np.ndarray:
    if not isinstance(value, np.ndarray):
        raise InvalidInput(f"output {name!r} is a {type(value).__name__}, not a tensor; only "
                           "tensors travel over the API", loc=("outputs",))  # fmt: skip
    return value


def _nbytes(value: Any) -> int:
    if isinstance(value, np.ndarray):
        return value.nbytes
    if isinstance(value, list | tuple):
        return sum(_nbytes(item) for item in value)
    return 0


def _label(step: Step) -> str:
    report = step.report
    name = repr(report.name) if report.name else f"(unnamed, making {step.writes[0]!r})"
    version = f"-{report.version}" if report.version else ""
    return f"node {name} ({report.op_type}{version})"
