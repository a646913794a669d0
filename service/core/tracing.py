"""Triton's trace extension: which requests are traced, and their records. The data plane asks
`Tracing.on` once per request (the only cost to an untraced one) and, when it is on, runs the
request through `traced`; the settings are core/trace_settings.py's, the record form
trace_records.py's, the files trace_files.py's.

A trace's timestamps are Triton's names: the door's (core/trace_context.py: HTTP_RECV_START
... HTTP_SEND_END, or gRPC's), then the core's, taken from the request's Timings
(core/statistics.py) and the clock around the core's work: REQUEST_START and QUEUE_START when
the core takes the request, COMPUTE_START when its work starts, COMPUTE_INPUT_END and
COMPUTE_OUTPUT_START around the model's run, COMPUTE_END once its answer is encoded,
REQUEST_END when the core is done; a cached model's CACHE_LOOKUP_START/END and, on a miss,
CACHE_INSERT_START/END (core/response_cache.py; a hit has no COMPUTE_* stamps, as Triton's)."""

import itertools
import os
from collections.abc import Awaitable, Callable, Mapping
from functools import partial
from time import perf_counter_ns
from typing import TYPE_CHECKING, Any, TypeVar

import orjson

from service.core.inference import InferWork
from service.core.model import V2Model
from service.core.trace_context import Stamps, TraceContext
from service.core.trace_files import TraceFile
from service.core.trace_records import core_stamps, head, stamp_objects, tensor_objects
from service.core.trace_settings import Fields, TraceSettings
from service.errors import InvalidInput, NotFound
from service.settings import Settings

if TYPE_CHECKING:  # the SDK and its exporter take 0.4 s to import: only in their mode
    from service.core.trace_otel import OtelExport

T = TypeVar("T")


class Sampler:
    """One setting's sampling and records (Triton's TraceSetting): every `trace_rate`-th
    request while `trace_count` lasts; made anew (its counts from zero) when it changes."""

    def __init__(self, fields: Fields, file: TraceFile | None) -> None:
        self.fields = fields
        self.level: tuple[str, ...] = fields["trace_level"]
        self.rate: int = fields["trace_rate"]
        self.count: int = fields["trace_count"]  # left to take; -1: no end
        self.frequency: int = fields["log_frequency"]
        self.file = file
        self.seen = 0
        self.kept: list[bytes] = []  # records not written yet (a log_frequency group)

    @property
    def valid(self) -> bool:
        return bool(self.level) and self.rate > 0 and self.count != 0

    def sample(self, forced: bool) -> bool:
        """Whether this request is traced (`forced`: a caller's trace context asks for it)."""
        if not self.valid:
            return forced
        self.seen += 1
        if self.seen % self.rate:
            return forced
        if self.count > 0:
            self.count -= 1
        return True

    def write(self, record: bytes) -> None:
        """A trace's record: to the file as it comes, or in groups of log_frequency."""
        if self.file is None:
            return
        if not self.frequency:
            self.file.append(record)
            return
        self.kept.append(record)
        if len(self.kept) >= min(self.frequency, MAX_KEPT):
            self.flush()

    def flush(self) -> None:
        """What is kept, to a file of its own (`<trace_file>.<n>`)."""
        if self.kept and self.file is not None:
            self.file.save_group(self.kept)
        self.kept = []


MAX_KEPT = 10_000
"""Records kept for one log_frequency group at most (a larger group is written in parts):
the setting comes from the network, the memory must not."""


class Tracing:
    """The trace settings of this process and the requests they trace."""

    def __init__(self, settings: Settings, model_ready: Callable[[str, str | None], bool]) -> None:
        self.settings = settings
        self.model_ready = model_ready
        self.store = TraceSettings(settings)
        path = settings.trace_file
        if path and settings.workers > 1:  # one file per worker process
            path = f"{path}.{os.getpid()}"
        self.file = TraceFile(path) if path and settings.trace_mode == "triton" else None
        self.otel: OtelExport | None = None
        if settings.trace_mode == "opentelemetry":
            from service.core import trace_otel

            self.otel = trace_otel.OtelExport(settings.trace_otel_url, settings.server_name)
        self.ids = itertools.count(1)
        self.samplers: dict[str | None, Sampler] = {}
        self.on = False  # any setting traces, or a caller's context may ask (OpenTelemetry)
        self._rebuild(all_models=True)

    def report(self, model: str | None) -> dict[str, Any]:
        """The settings in Triton's JSON form (strings; the count left to take)."""
        self._check(model)
        sampler = self._sampler(model)
        level = list(sampler.level) or ["OFF"]
        found: dict[str, Any] = {"trace_level": level, "trace_rate": str(sampler.rate),
                                 "trace_count": str(sampler.count)}  # fmt: skip
        if self.settings.trace_mode == "triton":
            found |= {"log_frequency": str(sampler.frequency),
                      "trace_file": self.settings.trace_file}  # fmt: skip
        else:
            found["url"] = self.settings.trace_otel_url
        return found | {"trace_mode": self.settings.trace_mode}

    def update(self, model: str | None, changes: Mapping[str, Any]) -> dict[str, Any]:
        """Change the global settings or a model's (None clears one); the settings after."""
        self._check(model)
        self.store.update(model, changes)
        self._rebuild(all_models=model is None, model=model)
        return self.report(model)

    def close(self) -> None:
        """Shutting down: every group kept is written, the file closed."""
        for sampler in self.samplers.values():
            sampler.flush()
        if self.file is not None:
            self.file.close()
        if self.otel is not None:
            self.otel.close()

    async def traced(self, model: V2Model, work: InferWork[Any], trace: TraceContext | None,
                     run: Awaitable[T]) -> T:  # fmt: skip
        """`run` (the request's `work`), traced when its model's setting samples it, or (in
        OpenTelemetry mode) when the caller sent a trace context (W3C traceparent). Its record
        is written when the door closes `trace` (at once without one)."""
        sampler = self._sampler(model.name)
        context = trace.traceparent if trace is not None else None
        forced = context is not None and self.otel is not None and self.otel.follows(context)
        if not sampler.sample(forced):
            return await run
        trace = work.trace = trace if trace is not None else TraceContext()
        trace_id = next(self.ids)  # in the order requests came, as Triton numbers them
        start = perf_counter_ns()
        try:
            return await run
        finally:
            stamps = core_stamps(work.timings, start, perf_counter_ns(), trace.steps)
            trace.finish = partial(self._finish, trace_id, sampler, model, work, trace, stamps)
            if trace.door is None:
                trace.close()

    def _finish(self, trace_id: int, sampler: Sampler, model: V2Model, work: InferWork[Any],
                trace: TraceContext, stamps: Stamps, sent: Stamps) -> None:  # fmt: skip
        """A traced request's record, once the door has sent its answer (`sent`: its stamps)."""
        stamps = [*trace.front(), *stamps, *sent]
        if self.otel is not None:
            self.otel.export(model.name, str(model.version), stamps, trace.traceparent)
            return
        parts: list[bytes] = []
        timestamps = "TIMESTAMPS" in sampler.level
        if timestamps:
            at = len(trace.front())
            request_id = work.call.id if work.call is not None else None
            parts += stamp_objects(trace_id, stamps[:at])
            parts.append(orjson.dumps(head(trace_id, model.name, str(model.version), request_id)))
            parts += stamp_objects(trace_id, stamps[at : at + 2])  # REQUEST_ and QUEUE_START
        if "TENSORS" in sampler.level:
            limit = self.settings.trace_tensor_bytes
            parts += tensor_objects(trace_id, "TENSOR_QUEUE_INPUT", work.inputs, limit)
            answered = work.produced if work.produced is not None else work.outputs
            parts += tensor_objects(trace_id, "TENSOR_BACKEND_OUTPUT", answered, limit)
        if timestamps:
            parts += stamp_objects(trace_id, stamps[at + 2 :])
        if parts:
            sampler.write(b",".join(parts))

    def _sampler(self, model: str | None) -> Sampler:
        found = self.samplers.get(model)
        return found if found is not None else self.samplers[None]

    def _check(self, model: str | None) -> None:
        if model is None:
            return
        try:
            ready = self.model_ready(model, None)
        except NotFound:
            ready = False
        if not ready:
            raise InvalidInput(f"Request for unknown model : {model[:100]}")  # Triton's

    def _rebuild(self, all_models: bool, model: str | None = None) -> None:
        """New samplers for what changed (Triton starts their counts anew); the old ones'
        kept groups written first."""
        names = [None, *self.store.models] if all_models else [model]
        for name in names:
            old = self.samplers.pop(name, None)
            if old is not None:
                old.flush()
            if name is None or name in self.store.models:
                self.samplers[name] = Sampler(self.store.effective(name), self.file)
        forced = self.settings.trace_mode == "opentelemetry"
        self.on = forced or any(sampler.valid for sampler in self.samplers.values())
