"""One inference from the door's parse to the door's encode, as execution.py's Work: the
inputs decoded once, the model run, classification applied, the answer encoded."""

from collections.abc import Callable
from time import perf_counter_ns
from typing import Any, Generic, TypeVar

import numpy as np

from api_schemas.v2 import Parameters
from service.codecs.dtypes import element_type_of
from service.codecs.limits import Limits
from service.codecs.v2_binary import decode_binary, encode_binary, string_decode_memory
from service.codecs.v2_json import decode_v2_json
from service.codecs.v2_types import datatype_of, from_datatype
from service.core.calls import InferCall, InferInput, InferResult, OutputTensor
from service.core.classification import class_count, classify
from service.core.model import V2Model
from service.core.offload import INLINE_BODY_BYTES
from service.core.shared_memory import (
    DISABLED,
    SharedMemoryRef,
    SharedMemoryRegions,
    output_region,
    tensor_region,
)
from service.core.statistics import Timings
from service.core.trace_context import TraceContext
from service.errors import InvalidInput, ServiceError, Unsupported, located
from service.kernels.context import KernelContext, RunOffLoop
from service.runtime import engine_time

T = TypeVar("T")
Parse = Callable[[KernelContext], InferCall]
"""The door's decoder: its body or message to the neutral call (claiming what it holds)."""
Encode = Callable[[InferCall, InferResult, KernelContext], T]
"""The door's encoder: the result to its answer (claiming what the answer holds)."""


class InferWork(Generic[T]):
    """One inference as execution.py's Work: parse, decode every input once, run, encode.
    Inputs decoded inline are kept when the work moves to a thread (their memory is then part
    of `holding`), so they are never decoded twice."""

    __slots__ = ("body_bytes", "call", "encode", "inputs", "limits", "model", "outputs", "parse",
                 "produced", "regions", "result", "timings", "trace", "turn")  # fmt: skip

    def __init__(self, model: V2Model, parse: Parse, encode: Encode[T], limits: Limits,
                 body_bytes: int, regions: SharedMemoryRegions | None = None) -> None:  # fmt: skip
        self.model = model
        self.parse = parse
        self.encode = encode
        self.limits = limits
        self.body_bytes = body_bytes
        self.regions = regions
        self.call: InferCall | None = None
        self.inputs: dict[str, np.ndarray] | None = None
        self.timings = Timings()
        self.turn: Any = None  # the sequence's turn (core/sequences.py), for sequence models
        # the model's outputs when a dynamic batch ran it (core/batcher.py): only encoded here
        self.produced: dict[str, np.ndarray] | None = None
        # the model's outputs when this work ran it (the response cache keeps them)
        self.outputs: dict[str, np.ndarray] | None = None
        self.trace: TraceContext | None = None  # a traced request's (core/tracing.py)
        # the result of an inline run whose answer was too long to encode on the event loop:
        # the thread encodes it, the model is not run (nor shared memory written) again
        self.result: InferResult | None = None

    @property
    def holding(self) -> int:
        decoded = sum(a.nbytes for a in self.inputs.values()) if self.inputs is not None else 0
        kept = 0 if self.result is None else sum(
            o.array.nbytes for o in self.result.outputs if o.array is not None)  # fmt: skip
        return self.body_bytes + decoded + kept

    def prepare(self, ctx: KernelContext) -> None:
        """Parse the body and decode every input, once: kept for the run."""
        if self.inputs is not None:
            return
        start = perf_counter_ns()
        try:
            call = self.parse(ctx)
            check_outputs(call)
            self.inputs = decode_inputs(call.inputs, self.limits, self.regions, ctx)
            self.call = call
        except ServiceError as exc:  # named as on v1: `Tile-13: inputs.repeats: ...`
            exc.operator = exc.operator or self.model.label
            raise
        self.timings.compute_input = perf_counter_ns() - start
        self.timings.batch = self.model.batch_size(self.inputs)

    def __call__(self, ctx: KernelContext) -> T:
        if self.result is not None:  # the thread of an inline run whose answer was long
            return self._encoded(self.result, ctx)
        if self.produced is not None:  # a batch ran it
            assert self.call is not None
            return self._encoded(self._result(self.call, self.produced), ctx)
        timings = self.timings
        timings.started = perf_counter_ns()
        fresh = self.inputs is None
        try:
            self.prepare(ctx)
            assert self.call is not None and self.inputs is not None
            call = self.call
            engine_time.take()  # an earlier run's on this thread (a v1 run records too)
            ran = perf_counter_ns()
            result = self._run(call, self.inputs, ctx.for_format(call.answer_form))
            encoded = perf_counter_ns()
            # onnxruntime's own run is compute_infer; the service's work around it goes to
            # compute_input (before) and compute_output (after), as Triton's backend counts
            span = engine_time.take()
            started, ended = span if span is not None else (ran, encoded)
            timings.compute_infer = ended - started
            timings.compute_input += started - ran  # once: this attempt's run answers
            try:
                return self.encode(call, result, ctx)
            except RunOffLoop:  # an answer too long to write (compress) on the event loop:
                self.result = result  # the thread only encodes it (and claims it: holding)
                raise
            finally:
                timings.compute_output = perf_counter_ns() - ended
        except ServiceError as exc:
            exc.operator = exc.operator or self.model.label
            raise
        except BaseException:
            # Decoded on a thread, its claims undone by this failure (NeedMemory: the work runs
            # again): decode again, claiming again. Decoded inline, it is kept for the thread.
            if fresh and ctx.claims is not None:
                self.call = self.inputs = None
            raise

    def _encoded(self, result: InferResult, ctx: KernelContext) -> T:
        """The answer of a result made before this attempt (a batch's, or an inline run's whose
        answer was long), encoded in the request's own form."""
        assert self.call is not None
        began = perf_counter_ns()
        answer = self.encode(self.call, result, ctx)
        self.timings.compute_output += perf_counter_ns() - began
        return answer

    def _run(self, call: InferCall, inputs: dict[str, np.ndarray],
             ctx: KernelContext) -> InferResult:  # fmt: skip
        wanted = [o.name for o in call.outputs] if call.outputs else None
        arrays = self.outputs = self.model.infer(inputs, call.parameters, wanted, ctx,
                                                 turn=self.turn)  # fmt: skip
        return self._result(call, arrays)

    def _result(self, call: InferCall, arrays: dict[str, np.ndarray]) -> InferResult:
        """The outputs as asked: classified, or written to their shared memory regions."""
        model = self.model
        asked = {o.name: o.parameters for o in call.outputs} if call.outputs else {}
        outputs = []
        for name, array in arrays.items():
            datatype = datatype_of(element_type_of(array))
            parameters = asked.get(name)
            if not parameters:
                outputs.append(OutputTensor(name, datatype, list(array.shape), array))
                continue
            with located("outputs", name):
                k = class_count(parameters, name)
                region = output_region(name, parameters)
                if k:
                    labels = model.labels(name)
                    array = classify(array, k, model.max_batch_size > 0, labels, datatype)
                    datatype = "BYTES"
                if region is not None:
                    outputs.append(self._to_region(name, datatype, array, region))
                else:
                    outputs.append(OutputTensor(name, datatype, list(array.shape), array))
        return InferResult(model.name, str(model.version), call.id, outputs)

    def _to_region(self, name: str, datatype: str, array: np.ndarray,
                   region: SharedMemoryRef) -> OutputTensor:  # fmt: skip
        """The output written into its shared memory region, in the binary tensor layout."""
        if self.regions is None:
            raise Unsupported(DISABLED)
        data = encode_binary(array)
        self.regions.write(*region, data, output=name)
        where: Parameters = {"shared_memory_region": region.region,
                             "shared_memory_byte_size": len(data)}  # fmt: skip
        if region.offset:
            where["shared_memory_offset"] = region.offset
        return OutputTensor(name, datatype, list(array.shape), None, where)


class Preparing:
    """The first half of an InferWork as a Work of its own: parse and decode (a sequence's
    request is read before it waits for its turn)."""

    __slots__ = ("work",)

    def __init__(self, work: InferWork[Any]) -> None:
        self.work = work

    @property
    def holding(self) -> int:
        return self.work.holding

    @property
    def timings(self) -> Timings:
        return self.work.timings

    def __call__(self, ctx: KernelContext) -> None:
        self.work.prepare(ctx)


def check_outputs(call: InferCall) -> None:
    """Refuse an output requested twice (its two requests could ask for different forms)."""
    seen: set[str] = set()
    for output in call.outputs or ():
        if output.name in seen:  # Triton's words (InferenceRequest::AddRequestedOutput)
            raise InvalidInput(f"output '{output.name[:100]}' already exists in request",
                               loc=("outputs",))  # fmt: skip
        seen.add(output.name)


def plain_outputs(arrays: dict[str, np.ndarray]) -> list[OutputTensor]:
    """Each output as answered when it asks for nothing (no classification, no region): its
    array under its V2 datatype, as InferWork._run makes such an output (the one steps)."""
    return [OutputTensor(name, datatype_of(element_type_of(array)), list(array.shape), array)
            for name, array in arrays.items()]  # fmt: skip


def decode_inputs(inputs: list[InferInput], limits: Limits,
                  regions: SharedMemoryRegions | None = None,
                  ctx: KernelContext | None = None) -> dict[str, np.ndarray]:  # fmt: skip
    """Every input's array, by name; a name given twice is refused."""
    decoded: dict[str, np.ndarray] = {}
    for item in inputs:
        try:  # as `located`, without a context manager per input
            if item.name in decoded:
                raise InvalidInput(f"input {item.name!r} is given twice")
            decoded[item.name] = decode_input(item, limits, regions, ctx)
        except ServiceError as exc:
            exc.loc = ("inputs", item.name, *exc.loc)
            raise
    return decoded


def decode_input(item: InferInput, limits: Limits, regions: SharedMemoryRegions | None = None,
                 ctx: KernelContext | None = None) -> np.ndarray:  # fmt: skip
    """The array of one input: from its raw bytes, its shared memory region or its JSON
    data. A region's bytes are copied out (claimed first; never inline when large)."""
    raw = item.raw
    if raw is None and item.parameters:  # no parameters (most JSON inputs): no region
        region = tensor_region(item.name, item.parameters)
        if region is not None:
            raw = _read_region(region, regions, ctx)
    if raw is not None:
        return decode_raw(item.datatype, item.shape, raw, limits, ctx)
    return decode_v2_json(item.datatype, item.shape, item.data, limits)


def decode_raw(datatype: str, shape: list[int], raw: bytes | memoryview, limits: Limits,
               ctx: KernelContext | None = None) -> np.ndarray:  # fmt: skip
    """The array of one input's binary data (its raw contents, binary extension bytes or
    shared memory region)."""
    view = raw if isinstance(raw, memoryview) else memoryview(raw)
    et = from_datatype(datatype)
    count = limits.check_shape(shape)
    # a Python object per element: claimed first (data too short for `count` is refused by
    # decode_binary at once)
    if et.is_string and ctx is not None and 4 * count <= len(view):
        if ctx.claims is not None:
            ctx.claims.claim(string_decode_memory(count, view))
        elif ctx.inline_bytes is not None and count * 57 > INLINE_BODY_BYTES:
            raise RunOffLoop
    return decode_binary(et, shape, view, limits)


def _read_region(region: SharedMemoryRef, regions: SharedMemoryRegions | None,
                 ctx: KernelContext | None) -> bytes:  # fmt: skip
    if regions is None:
        raise Unsupported(DISABLED)
    if ctx is not None:
        if ctx.claims is not None:
            ctx.claims.claim(region.byte_size)
        elif ctx.inline_bytes is not None and region.byte_size > INLINE_BODY_BYTES:
            raise RunOffLoop  # a large region is read on a kernel thread, its size claimed
    return regions.read(*region)
