"""Triton's metric families on /metrics (parsed with prometheus_client's parser) after a known mix
of successes and failures over HTTP and gRPC, summed over two worker processes: the counts
exact, the durations present and consistent with the histograms; at a dynamic batcher, a client
that left (CANCELED), a full queue (REJECTED) and the requests waiting (pending); histogram
buckets placed by OPSERVE_METRICS_BUCKETS and added up across two replicas; failure reasons by
error."""

import json
import socket
import time
import warnings
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from pathlib import Path

import httpx
import numpy as np
import pytest
from onnx import TensorProto, helper
from prometheus_client.parser import text_string_to_metric_families

from service.core.statistics import (
    DEFAULT_BUCKETS,
    REASONS,
    ModelStatistics,
    Timings,
    failure_reason,
)
from service.errors import (
    BadRequest,
    InvalidInput,
    ModelNotReady,
    NotFound,
    Overloaded,
    PayloadTooLarge,
    RunCancelled,
    RunTimeout,
    ServiceError,
    Unavailable,
    Unsupported,
    WorkerDied,
    WorkerOutOfMemory,
)  # fmt: skip
from service.settings import Settings, metric_buckets
from tests.api.live_server import free_port, serve
from tests.runtime.models import model
from tests.runtime.models import value as tensor_value
from tests.triton_examples import write_repository

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException

SIMPLE = ("simple", "1")
Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def scrape(url: str) -> Samples:
    """Every sample of `url`/metrics: (sample name, sorted labels) -> value."""
    text = httpx.get(f"{url}/metrics", timeout=10).text
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}  # fmt: skip


def value(samples: Samples, name: str, **labels: str) -> float:
    """One sample (the parser names a counter's samples `<name>_total`)."""
    return samples[
        name, tuple(sorted({"model": SIMPLE[0], "version": SIMPLE[1], **labels}.items()))
    ]


def _simple_body(batch: int, good: bool = True) -> dict:
    data = list(range(16)) * batch
    names = ("INPUT0", "INPUT1") if good else ("INPUT0", "WRONG")
    return {"inputs": [{"name": n, "shape": [batch, 16], "datatype": "INT32", "data": data}
                       for n in names]}  # fmt: skip


def _grpc_infer(target: str, batch: int, good: bool) -> bool:
    client = grpcclient.InferenceServerClient(target)
    try:
        inputs = []
        for name in ("INPUT0", "INPUT1" if good else "WRONG"):
            tensor = grpcclient.InferInput(name, [batch, 16], "INT32")
            tensor.set_data_from_numpy(np.arange(16 * batch, dtype=np.int32).reshape(batch, 16))
            inputs.append(tensor)
        try:
            client.infer("simple", inputs)
        except InferenceServerException:
            return False
        return True
    finally:
        client.close()


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str, Path]]:
    root = write_repository(tmp_path_factory.mktemp("models"), ["simple"])
    shared = tmp_path_factory.mktemp("metrics")
    grpc_port = free_port()
    with serve(model_repository=str(root), workers="2", grpc_port=str(grpc_port),
               metrics_dir=str(shared), access_log="false") as server:  # fmt: skip
        yield server.url, f"127.0.0.1:{grpc_port}", shared


def test_counts_of_a_known_mix_over_both_doors_and_two_workers(
    served: tuple[str, str, Path],
) -> None:
    url, target, shared = served
    # both workers answering something first (which one takes a connection is the kernel's
    # choice, and on a busy host one may take a whole burst): calls to an operator, which
    # leave simple's counts alone
    deadline = time.monotonic() + 30
    while len(list(shared.glob("*.json"))) < 2 and time.monotonic() < deadline:
        with ThreadPoolExecutor(4) as pool:
            list(pool.map(lambda _: httpx.get(f"{url}/v2/models/Shape/versions/15", timeout=10),
                          range(8)))  # fmt: skip
        time.sleep(0.3)
    http_batches, grpc_batches = [1, 2, 4, 8] * 6, [1, 3] * 5
    http_bad, grpc_bad = 7, 4
    with ThreadPoolExecutor(8) as pool:  # concurrent clients: both workers answer some
        ok = list(pool.map(lambda b: httpx.post(f"{url}/v2/models/simple/infer", timeout=30,
                                                json=_simple_body(b)).status_code, http_batches))  # fmt: skip
        bad = list(pool.map(lambda b: httpx.post(f"{url}/v2/models/simple/infer", timeout=30,
                                                 json=_simple_body(1, False)).status_code,
                            range(http_bad)))  # fmt: skip
        grpc_ok = list(pool.map(lambda b: _grpc_infer(target, b, True), grpc_batches))
        grpc_failed = list(pool.map(lambda b: _grpc_infer(target, 1, False), range(grpc_bad)))
    assert ok == [200] * len(ok) and bad == [400] * http_bad
    assert all(grpc_ok) and not any(grpc_failed)
    successes = len(http_batches) + len(grpc_batches)
    deadline = time.monotonic() + 15
    while True:  # another worker's counts arrive with its next share (0.5 s)
        samples = scrape(url)
        done = (
            value(samples, "nv_inference_request_success_total") == successes
            and value(samples, "nv_inference_request_failure_total", reason="OTHER")
            == http_bad + grpc_bad
        )
        if done or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert len(list(shared.glob("*.json"))) == 2  # both workers shared their counts
    assert value(samples, "nv_inference_request_success_total") == successes
    failures = {r: value(samples, "nv_inference_request_failure_total", reason=r) for r in REASONS}
    assert failures == {"REJECTED": 0, "CANCELED": 0, "BACKEND": 0, "OTHER": http_bad + grpc_bad}
    assert value(samples, "nv_inference_count_total") == sum(http_batches) + sum(grpc_batches)
    assert value(samples, "nv_inference_exec_count_total") == successes  # no dynamic batching
    request_us = value(samples, "nv_inference_request_duration_us_total")
    parts = [value(samples, f"nv_inference_{phase}_duration_us_total")
             for phase in ("queue", "compute_input", "compute_infer", "compute_output")]  # fmt: skip
    assert request_us >= sum(parts) - 4 and min(parts[1:]) > 0  # rounding: whole us per phase
    for name in ("request", "queue", "compute_infer"):
        histogram = f"opserve_inference_{name}_duration_seconds"
        assert value(samples, f"{histogram}_count") == successes
        assert value(samples, f"{histogram}_bucket", le="+Inf") == successes
    seconds = value(samples, "opserve_inference_request_duration_seconds_sum")
    assert abs(seconds * 1e6 - request_us) <= 1  # one source: the same nanoseconds
    assert value(samples, "nv_inference_pending_request_count") == 0
    assert 0 < value(samples, "nv_model_load_duration_secs") < 60


def test_histograms_add_up_across_two_replicas(tmp_path: Path) -> None:
    """Every request takes more than 100 ns and less than 60 s: each replica's counts land in
    the middle bucket, and the replicas' buckets add up to every request sent."""
    root = write_repository(tmp_path, ["simple"])
    sent = [5, 8]
    totals: dict[str, float] = {}
    with ExitStack() as replicas:
        urls = [replicas.enter_context(serve(model_repository=str(root), access_log="false",
                                             metrics_buckets="0.0000001,60,120")).url
                for _ in sent]  # fmt: skip
        for url, count in zip(urls, sent, strict=True):
            for _ in range(count):
                answer = httpx.post(f"{url}/v2/models/simple/infer", json=_simple_body(1))
                assert answer.status_code == 200
            samples = scrape(url)
            for le in ("1e-07", "60.0", "120.0", "+Inf"):
                got = value(samples, "opserve_inference_request_duration_seconds_bucket", le=le)
                totals[le] = totals.get(le, 0) + got
    everything = sum(sent)
    assert totals == {"1e-07": 0, "60.0": everything, "120.0": everything, "+Inf": everything}


QUEUED = (
    'max_batch_size: 8\ninput [{name: "X" data_type: TYPE_FP32 dims: [4]}]\n'
    'output [{name: "Y" data_type: TYPE_FP32 dims: [4]}]\n'
    "dynamic_batching {preferred_batch_size: [8] max_queue_delay_microseconds: 8000000"
    " default_queue_policy {max_queue_size: 2}}\n"
)
X = {"inputs": [{"name": "X", "shape": [1, 4], "datatype": "FP32", "data": [1, 2, 3, 4]}]}


def _until(url: str, done: Callable[[Samples], bool], seconds: float = 6) -> Samples:
    """Scrapes until `done` says so or `seconds` pass; the last scrape."""
    deadline = time.monotonic() + seconds
    while not done(samples := scrape(url)) and time.monotonic() < deadline:
        time.sleep(0.1)
    return samples


@pytest.mark.slow  # a batcher that holds its requests for 8 s
def test_canceled_rejected_and_pending_at_a_dynamic_batcher(tmp_path: Path) -> None:
    """A batcher holding two requests for 8 s (its queue's size): a client that leaves counts
    CANCELED, the two waiting are pending, a third is refused (REJECTED), and the two then run
    as one execution."""
    (tmp_path / "queued" / "1").mkdir(parents=True)
    graph = model([helper.make_node("Identity", ["X"], ["Y"])],
                  [tensor_value("X", TensorProto.FLOAT, ["n", 4])],
                  [tensor_value("Y", TensorProto.FLOAT, ["n", 4])])  # fmt: skip
    (tmp_path / "queued" / "1" / "model.onnx").write_bytes(graph.SerializeToString())
    (tmp_path / "queued" / "config.pbtxt").write_text(QUEUED)
    body = json.dumps(X).encode()
    with serve(model_repository=str(tmp_path), access_log="false") as server:
        labels = {"model": "queued", "version": "1"}
        key = lambda name, **more: (name, tuple(sorted({**labels, **more}.items())))  # noqa: E731
        canceled = key("nv_inference_request_failure_total", reason="CANCELED")
        with socket.create_connection(("127.0.0.1", server.port)) as gone:
            gone.sendall(b"POST /v2/models/queued/infer HTTP/1.1\r\nHost: x\r\n"
                         b"Content-Type: application/json\r\n"
                         + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)  # fmt: skip
            time.sleep(0.3)  # queued: its batch waits for the delay
        assert _until(server.url, lambda s: s.get(canceled) == 1)[canceled] == 1
        with ThreadPoolExecutor(2) as pool:
            waiting = [pool.submit(httpx.post, f"{server.url}/v2/models/queued/infer", json=X,
                                   timeout=60) for _ in range(2)]  # fmt: skip
            pending = key("nv_inference_pending_request_count")
            assert _until(server.url, lambda s: s.get(pending) == 2)[pending] == 2
            refused = httpx.post(f"{server.url}/v2/models/queued/infer", json=X, timeout=10)
            assert refused.status_code == 503 and "Exceeds maximum queue size" in refused.text
            assert [f.result().status_code for f in waiting] == [200, 200]
        samples = scrape(server.url)
    failures = {r: samples[key("nv_inference_request_failure_total", reason=r)] for r in REASONS}
    assert failures == {"REJECTED": 1, "CANCELED": 1, "BACKEND": 0, "OTHER": 0}
    assert samples[key("nv_inference_request_success_total")] == 2
    assert samples[key("nv_inference_count_total")] == 2
    assert samples[key("nv_inference_exec_count_total")] == 1  # one batch of both
    assert samples[pending] == 0
    # the two waited for the batch: their queue time is in the histogram's upper buckets
    assert samples[key("opserve_inference_queue_duration_seconds_bucket", le="0.1")] == 0


def test_the_buckets_setting_is_checked() -> None:
    assert metric_buckets(Settings().metrics_buckets) == DEFAULT_BUCKETS  # one default
    with pytest.raises(ValueError, match="OPSERVE_METRICS_BUCKETS"):
        Settings(metrics_buckets="0.5,0.1")


@pytest.mark.parametrize(("error", "reason"), [
    (Overloaded("the server is busy"), "REJECTED"),
    (Unavailable("Exceeds maximum queue size"), "REJECTED"),
    (Unavailable("Request timeout expired"), "REJECTED"),
    (RunCancelled("the client closed the connection"), "CANCELED"),
    (RunTimeout("still running"), "BACKEND"), (WorkerDied("died"), "BACKEND"),
    (WorkerOutOfMemory("killed"), "BACKEND"), (ServiceError("output too odd"), "BACKEND"),
    (RuntimeError("an engine's error"), "BACKEND"),
    (InvalidInput("bad"), "OTHER"), (BadRequest("bad"), "OTHER"), (NotFound("no"), "OTHER"),
    (PayloadTooLarge("large"), "OTHER"), (ModelNotReady("not"), "OTHER"),
    (Unsupported("cuda"), "OTHER"),
])  # fmt: skip
def test_failure_reasons(error: BaseException, reason: str) -> None:
    assert REASONS[failure_reason(error)] == reason
    counts = ModelStatistics()
    counts.failed(0, error)
    assert counts.fail[0] == 1 and counts.fail_reasons[REASONS.index(reason)] == 1


def test_histogram_buckets_by_hand() -> None:
    """Bounds 1 ms and 1 s: a request of 10 ms waits 2 ms and computes 500 ns."""
    counts = ModelStatistics(bounds=(1_000_000, 1_000_000_000))
    timings = Timings()
    arrived = time.perf_counter_ns() - 10_000_000
    timings.started, timings.compute_infer = arrived + 2_000_000, 500
    counts.succeeded(arrived, timings)
    request, queue, infer = counts.histograms
    assert (request, queue, infer) == ([0, 1, 0], [0, 1, 0], [1, 0, 0])
