"""One inference from the door's parse to the door's encode, as execution.py's Work: the
inputs decoded once, the model run, classification applied, the answer encoded."""

from collections.abc import Callable
from time import perf_counter_ns
from typing import Generic, TypeVar

import numpy as np

from service.codecs.dtypes import element_type_of
from service.codecs.limits import Limits
from service.codecs.v2_binary import decode_binary
from service.codecs.v2_json import decode_v2_json
from service.codecs.v2_types import datatype_of, from_datatype
from service.core.calls import InferCall, InferInput, InferResult, OutputTensor
from service.core.classification import class_count, classify
from service.core.model import V2Model
from service.core.statistics import Timings
from service.errors import InvalidInput, ServiceError, located
from service.kernels.context import KernelContext

T = TypeVar("T")
Parse = Callable[[KernelContext], InferCall]
"""The door's decoder: its body or message to the neutral call (claiming what it holds)."""
Encode = Callable[[InferCall, InferResult, KernelContext], T]
"""The door's encoder: the result to its answer (claiming what the answer holds)."""


class InferWork(Generic[T]):
    """One inference as execution.py's Work: parse, decode every input once, run, encode.
    Inputs decoded inline are kept when the work moves to a thread (their memory is then part
    of `holding`), so they are never decoded twice."""

    __slots__ = ("body_bytes", "call", "encode", "inputs", "limits", "model", "parse", "timings")

    def __init__(self, model: V2Model, parse: Parse, encode: Encode[T], limits: Limits,
                 body_bytes: int) -> None:  # fmt: skip
        self.model = model
        self.parse = parse
        self.encode = encode
        self.limits = limits
        self.body_bytes = body_bytes
        self.call: InferCall | None = None
        self.inputs: dict[str, np.ndarray] | None = None
        self.timings = Timings()

    @property
    def holding(self) -> int:
        decoded = sum(a.nbytes for a in self.inputs.values()) if self.inputs is not None else 0
        return self.body_bytes + decoded

    def __call__(self, ctx: KernelContext) -> T:
        timings = self.timings
        timings.started = start = perf_counter_ns()
        try:
            if self.call is not None and self.inputs is not None:  # decoded inline, now on a thread
                call, inputs = self.call, self.inputs
            else:
                call = self.parse(ctx)
                inputs = decode_inputs(call.inputs, self.limits)
                if ctx.claims is None:  # inline: kept, should the work move to a thread
                    self.call, self.inputs = call, inputs
            timings.compute_input = (ran := perf_counter_ns()) - start
            result = self._run(call, inputs, ctx.for_format(call.answer_form))
            timings.compute_infer = (encoded := perf_counter_ns()) - ran
            answer = self.encode(call, result, ctx)
            timings.compute_output = perf_counter_ns() - encoded
            return answer
        except ServiceError as exc:  # named as on v1: `Tile-13: inputs.repeats: ...`
            exc.operator = exc.operator or self.model.label
            raise

    def _run(self, call: InferCall, inputs: dict[str, np.ndarray],
             ctx: KernelContext) -> InferResult:  # fmt: skip
        model = self.model
        wanted = [o.name for o in call.outputs] if call.outputs else None
        arrays = model.infer(inputs, call.parameters, wanted, ctx)
        asked = {o.name: o.parameters for o in call.outputs} if call.outputs else {}
        outputs = []
        for name, array in arrays.items():
            datatype = datatype_of(element_type_of(array))
            k = class_count(asked[name], name) if name in asked else 0
            if k:
                labels = model.labels(name)
                array = classify(array, k, model.max_batch_size > 0, labels, datatype)
                datatype = "BYTES"
            outputs.append(OutputTensor(name, datatype, list(array.shape), array))
        return InferResult(model.name, str(model.version), call.id, outputs)


def decode_inputs(inputs: list[InferInput], limits: Limits) -> dict[str, np.ndarray]:
    """Every input's array, by name; a name given twice is refused."""
    decoded: dict[str, np.ndarray] = {}
    for item in inputs:
        with located("inputs", item.name):
            if item.name in decoded:
                raise InvalidInput(f"input {item.name!r} is given twice")
            decoded[item.name] = decode_input(item, limits)
    return decoded


def decode_input(item: InferInput, limits: Limits) -> np.ndarray:
    """The array of one input: from its raw bytes, else from its JSON data."""
    if item.raw is not None:
        raw = item.raw if isinstance(item.raw, memoryview) else memoryview(item.raw)
        return decode_binary(from_datatype(item.datatype), item.shape, raw, limits)
    return decode_v2_json(item.datatype, item.shape, item.data, limits)
