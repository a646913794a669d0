"""The trace extension's OpenTelemetry mode (core/trace_otel.py): a server whose trace level is
OFF traces exactly the requests that carry a W3C traceparent, over both doors, and exports
their spans over OTLP/HTTP to a collector, here a small HTTP server in the test that decodes
what it receives with OpenTelemetry's own protobuf messages."""

import os
import secrets
import threading
import time
import warnings
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from tests.api.test_trace_summary import write_cached
from tests.grpc.conftest import Served, repository, serve_grpc

STAMPS = ["REQUEST_START", "QUEUE_START", "COMPUTE_START", "COMPUTE_INPUT_END",
          "COMPUTE_OUTPUT_START", "COMPUTE_END", "REQUEST_END"]  # fmt: skip
FRONT = {"http": (["HTTP_RECV_START", "HTTP_RECV_END"], ["HTTP_SEND_START", "HTTP_SEND_END"]),
         "grpc": (["GRPC_WAITREAD_START", "GRPC_WAITREAD_END"],
                  ["GRPC_SEND_START", "GRPC_SEND_END"])}  # fmt: skip


class Collector:
    """An OTLP/HTTP traces endpoint on 127.0.0.1 keeping every span it is sent."""

    def __init__(self) -> None:
        self.spans: list[Any] = []
        self.paths: list[str] = []
        spans, paths = self.spans, self.paths

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["content-length"]))
                request = ExportTraceServiceRequest.FromString(body)
                paths.append(self.path)
                for resource in request.resource_spans:
                    for scope in resource.scope_spans:
                        spans.extend(scope.spans)
                self.send_response(200)
                self.send_header("content-type", "application/x-protobuf")
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/v1/traces"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Served, Collector]]:
    collector = Collector()
    os.environ["OTEL_BSP_SCHEDULE_DELAY"] = "100"  # the SDK's batch, sent within 0.1 s
    try:
        root = tmp_path_factory.mktemp("otel")
        settings = repository(root)
        write_cached(root)
        with serve_grpc(trace_mode="opentelemetry", trace_otel_url=collector.url,
                        response_cache_bytes=str(1 << 20), **settings) as running:  # fmt: skip
            yield running, collector
    finally:
        del os.environ["OTEL_BSP_SCHEDULE_DELAY"]
        collector.close()


def _infer(client: Any, module: Any, headers: dict[str, str] | None) -> None:
    inputs = [module.InferInput(name, [1, 16], "INT32") for name in ("INPUT0", "INPUT1")]
    for tensor in inputs:
        tensor.set_data_from_numpy(np.arange(16, dtype=np.int32).reshape(1, 16))
    client.infer("simple", inputs, headers=headers)


def _spans_of(collector: Collector, trace_id: bytes, count: int) -> list[Any]:
    deadline = time.monotonic() + 15
    while True:
        found = [span for span in collector.spans if span.trace_id == trace_id]
        if len(found) >= count or time.monotonic() > deadline:
            return found
        time.sleep(0.05)


def test_settings_answer_the_mode_and_the_collector(served) -> None:  # type: ignore[no-untyped-def]
    server, collector = served
    with httpclient.InferenceServerClient(f"127.0.0.1:{server.http.port}") as http:
        assert http.get_trace_settings() == {
            "trace_level": ["OFF"], "trace_rate": "1000", "trace_count": "-1",
            "url": collector.url, "trace_mode": "opentelemetry"}  # fmt: skip


@pytest.mark.parametrize("door", ["http", "grpc"])
def test_a_callers_traceparent_is_always_traced_and_followed(served, door) -> None:  # type: ignore[no-untyped-def]
    server, collector = served
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        client, module = (
            (httpclient.InferenceServerClient(f"127.0.0.1:{server.http.port}"), httpclient)
            if door == "http" else (grpcclient.InferenceServerClient(server.target), grpcclient))  # fmt: skip
    trace_id, parent_id = secrets.token_bytes(16), secrets.token_bytes(8)
    before = len(collector.spans)
    _infer(client, module, None)  # level OFF and no context: not traced
    start_ns = time.time_ns()
    _infer(client, module, {"traceparent": f"00-{trace_id.hex()}-{parent_id.hex()}-01"})
    end_ns = time.time_ns()
    client.close()
    spans = _spans_of(collector, trace_id, 2)
    assert sorted(span.name for span in spans) == ["InferRequest", "compute"]
    request = next(span for span in spans if span.name == "InferRequest")
    compute = next(span for span in spans if span.name == "compute")
    assert request.parent_span_id == parent_id  # a child of the caller's span
    assert compute.parent_span_id == request.span_id
    # the door's stamps around the core's (Triton's root span has them too)
    receive, send = FRONT[door]
    assert [event.name for event in request.events] == [*receive, *STAMPS, *send]
    times = {event.name: event.time_unix_nano for event in request.events}
    assert list(times.values()) == sorted(times.values())
    # within the client's call (the wall clock, converted from the monotonic one: 5 ms slack;
    # gRPC's send ends when the call is done, after the client has the answer)
    slack = 5_000_000
    assert start_ns - slack <= request.start_time_unix_nano <= compute.start_time_unix_nano
    assert request.start_time_unix_nano == times[receive[0]]
    assert compute.end_time_unix_nano <= times["REQUEST_END"] <= end_ns + slack
    assert request.end_time_unix_nano == times[send[1]]
    attributes = {a.key: a.value.string_value for a in request.attributes}
    assert attributes == {"triton.model_name": "simple", "triton.model_version": "1"}
    time.sleep(0.3)  # the untraced request sent nothing meanwhile
    assert len(collector.spans) == before + 2
    assert set(collector.paths) == {"/v1/traces"}


def test_a_streams_traceparent_traces_its_requests(served) -> None:  # type: ignore[no-untyped-def]
    server, collector = served
    trace_id, parent_id = secrets.token_bytes(16), secrets.token_bytes(8)
    answers: list[Any] = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        client = grpcclient.InferenceServerClient(server.target)
    client.start_stream(lambda result, error: answers.append(error or result),
                        headers={"traceparent": f"00-{trace_id.hex()}-{parent_id.hex()}-01"})  # fmt: skip
    inputs = [grpcclient.InferInput(name, [1, 16], "INT32") for name in ("INPUT0", "INPUT1")]
    for tensor in inputs:
        tensor.set_data_from_numpy(np.arange(16, dtype=np.int32).reshape(1, 16))
    for _ in range(2):
        client.async_stream_infer("simple", inputs)
    client.stop_stream()
    client.close()
    assert len(answers) == 2 and not any(isinstance(a, Exception) for a in answers)
    spans = _spans_of(collector, trace_id, 4)
    assert sorted(span.name for span in spans) == ["InferRequest"] * 2 + ["compute"] * 2
    assert {span.parent_span_id for span in spans if span.name == "InferRequest"} == {parent_id}


def test_a_cache_hit_is_marked_on_its_span(served) -> None:  # type: ignore[no-untyped-def]
    server, collector = served
    x = np.random.default_rng(3).random((2, 3), dtype=np.float32)
    ids = [secrets.token_bytes(16) for _ in range(2)]
    with httpclient.InferenceServerClient(f"127.0.0.1:{server.http.port}") as client:
        for trace_id in ids:  # a miss, then a hit
            tensor = httpclient.InferInput("X", [2, 3], "FP32")
            tensor.set_data_from_numpy(x)
            parent = f"00-{trace_id.hex()}-{secrets.token_bytes(8).hex()}-01"
            answer = client.infer("cached", [tensor], headers={"traceparent": parent})
            assert (answer.as_numpy("Y") == x.T).all()
    miss, hit = (
        _spans_of(collector, trace_id, count) for trace_id, count in zip(ids, (2, 1), strict=True)
    )
    assert sorted(span.name for span in miss) == ["InferRequest", "compute"]
    assert [span.name for span in hit] == ["InferRequest"]  # no compute span
    for spans, was_hit in ((miss, False), (hit, True)):
        request = next(span for span in spans if span.name == "InferRequest")
        events = [event.name for event in request.events]
        assert {"CACHE_LOOKUP_START", "CACHE_LOOKUP_END"} <= set(events)
        assert ("COMPUTE_START" in events) is not was_hit
        flags = {
            a.key: a.value.bool_value for a in request.attributes if a.key.startswith("opserve")
        }
        assert flags == {"opserve.cache_hit": was_hit}
