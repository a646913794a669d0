"""The trace extension's OpenTelemetry mode: a traced request as Triton's spans, exported over
OTLP/HTTP (the OpenTelemetry SDK's batch processor: its own thread, so the request never waits
for the collector) to OPSERVE_TRACE_OTEL_URL. An "InferRequest" span from its first stamp (the
door's receive) to its last (the door's send), a child of the caller's W3C traceparent when it
sent one, with Triton's timestamp names as its events, and a "compute" span within it
(COMPUTE_START to COMPUTE_END). A cached model's span has the cache's stamps as events and the
attribute `opserve.cache_hit` (Triton's has neither)."""

from time import perf_counter_ns, time_ns

from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import SERVICE_NAME, Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.trace import get_current_span, set_span_in_context
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

MAX_TRACEPARENT = 128  # W3C's version 00 is 55 characters; a longer header is not read


class OtelExport:
    """Spans of traced requests, to one collector."""

    def __init__(self, url: str, service_name: str) -> None:
        self.provider = TracerProvider(resource=Resource.create({SERVICE_NAME: service_name}))
        self.provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=url)))
        self.tracer = self.provider.get_tracer("opserve")
        self.propagator = TraceContextTextMapPropagator()
        # the stamps are the monotonic clock's; spans take wall-clock times
        self.offset = time_ns() - perf_counter_ns()

    def follows(self, traceparent: str) -> bool:
        """Whether a caller's traceparent names a span (a request that sends one is always
        traced: Triton's forced sample)."""
        if len(traceparent) > MAX_TRACEPARENT:
            return False
        found = self.propagator.extract({"traceparent": traceparent})
        return bool(get_current_span(found).get_span_context().is_valid)

    def export(
        self, model: str, version: str, stamps: list[tuple[str, int]], traceparent: str | None
    ) -> None:
        """One request's spans from its stamps (Triton's names and perf_counter_ns times, in
        order)."""
        parent = None if traceparent is None else self.propagator.extract(
            {"traceparent": traceparent})  # fmt: skip
        times = {name: ns + self.offset for name, ns in stamps}
        span = self.tracer.start_span("InferRequest", context=parent,
                                      start_time=min(times.values()))  # fmt: skip
        span.set_attribute("triton.model_name", model)
        span.set_attribute("triton.model_version", version)
        if "CACHE_LOOKUP_START" in times:
            span.set_attribute("opserve.cache_hit", "COMPUTE_START" not in times)
        for name, ns in times.items():
            span.add_event(name, timestamp=ns)
        if "COMPUTE_START" in times:
            compute = self.tracer.start_span("compute", context=set_span_in_context(span),
                                             start_time=times["COMPUTE_START"])  # fmt: skip
            compute.set_attribute("triton.model_name", model)
            compute.end(end_time=times["COMPUTE_END"])
        span.end(end_time=max(times.values()))

    def close(self) -> None:
        """Export what is left, then stop."""
        self.provider.shutdown()
