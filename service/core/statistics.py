"""Per model version inference statistics, as Triton's statistics extension reports them.

Counted on the event loop only (execution.py records when a request's work is done), so no
lock is needed. Per process: with OPSERVE_WORKERS > 1 each worker answers its own counts
(docs/v2.md). What the phases mean here:
- queue: from the request's arrival at the core to the start of its work (waiting for the
  memory budget and for a kernel thread);
- compute_input: parsing the body and decoding the inputs;
- compute_infer: running the model (on onnxruntime: its session run alone, the service's
  checks around it counted as input and output: runtime/engine_time.py);
- compute_output: encoding the answer.
`fail` counts requests refused or failed once their model was found (bad inputs included, as
Triton counts only failures after queueing: ours is the stricter count; docs/v2.md), each also
under its reason (REASONS, Triton's `nv_inference_request_failure` label: `failure_reason`).
Request, queue and compute_infer times also fill histograms (`bounds`, OPSERVE_METRICS_BUCKETS)
that telemetry/triton_metrics.py exports: one bisect and one increment each per request.
"""

import time
from bisect import bisect_left
from typing import Any, Protocol

from service.errors import Overloaded, RunCancelled, ServiceError, Unavailable, Unsupported

PHASES = ("queue", "compute_input", "compute_infer", "compute_output")
REASONS = ("REJECTED", "CANCELED", "BACKEND", "OTHER")
REJECTED, CANCELED, BACKEND, OTHER = range(4)
# seconds: a small model's request takes ~0.1 ms, a large one seconds
DEFAULT_BUCKETS: tuple[float, ...] = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01,
                                      0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)  # fmt: skip
HISTOGRAMS = ("request", "queue", "compute_infer")


def bounds_ns(buckets: tuple[float, ...]) -> tuple[int, ...]:
    """Bucket upper bounds in seconds as the nanoseconds the counts compare against."""
    return tuple(round(bound * 1e9) for bound in buckets)


class Timings:
    """The phase times of one request's work, in nanoseconds (set by the work as it goes)."""

    __slots__ = ("batch", "batched", "compute_infer", "compute_input", "compute_output",
                 "started")  # fmt: skip

    def __init__(self) -> None:
        self.started = 0  # perf_counter_ns when the (last attempt of the) work began
        self.compute_input = self.compute_infer = self.compute_output = 0
        self.batch = 1  # inferences in the request (its batch size for a batching model)
        # ran in a dynamic batch (core/batcher.py), whose execution is counted once for all
        # its requests (ModelStatistics.executed)
        self.batched = False


class ModelStatistics:
    """The counts of one model version."""

    __slots__ = ("batches", "bounds", "cache_hits", "cache_misses", "execution_count", "fail",
                 "fail_reasons", "histograms", "inference_count", "last_inference", "pairs", "phases", "success")  # fmt: skip

    def __init__(self, bounds: tuple[int, ...] = bounds_ns(DEFAULT_BUCKETS)) -> None:
        self.last_inference = 0  # milliseconds since the epoch
        self.inference_count = self.execution_count = 0
        self.success = [0, 0]  # count, ns
        self.fail = [0, 0]
        self.phases = {phase: [0, 0] for phase in PHASES}
        self.pairs = tuple(self.phases[phase] for phase in PHASES)  # the same lists, in order
        self.batches: dict[int, list[int]] = {}  # batch size -> count, input, infer, output ns
        self.fail_reasons = [0] * len(REASONS)
        self.bounds = bounds  # histogram bucket upper bounds, ns (+Inf is the last count)
        # per bucket (not cumulative): request, queue and compute_infer times (HISTOGRAMS)
        self.histograms = tuple([0] * (len(bounds) + 1) for _ in HISTOGRAMS)
        self.cache_hits = [0, 0]  # the response cache (core/response_cache.py)
        self.cache_misses = [0, 0]

    def succeeded(self, arrived: int, timings: Timings) -> None:
        """Count a request that arrived at `arrived` (perf_counter_ns) and was answered. (On
        every request: written out, not looped over the phases.)"""
        now = time.perf_counter_ns()
        self.last_inference = time.time_ns() // 1_000_000
        self.inference_count += timings.batch
        # each (count, ns) pair added to in place, written out: a call per pair cost 0.5 us
        success, (queue, compute_input, compute_infer, compute_output) = self.success, self.pairs
        request_ns, queue_ns = now - arrived, max(timings.started - arrived, 0)
        success[0] += 1
        success[1] += request_ns
        queue[0] += 1
        queue[1] += queue_ns
        compute_input[0] += 1
        compute_input[1] += timings.compute_input
        compute_infer[0] += 1
        compute_infer[1] += timings.compute_infer
        compute_output[0] += 1
        compute_output[1] += timings.compute_output
        bounds, (requests, queued, infers) = self.bounds, self.histograms
        requests[bisect_left(bounds, request_ns)] += 1  # the bucket whose bound is >= the time
        queued[bisect_left(bounds, queue_ns)] += 1
        infers[bisect_left(bounds, timings.compute_infer)] += 1
        if not timings.batched:  # else counted with its batch
            self.executed(timings.batch, timings.compute_input, timings.compute_infer,
                          timings.compute_output)  # fmt: skip

    def executed(self, size: int, compute_input: int, compute_infer: int,
                 compute_output: int) -> None:  # fmt: skip
        """Count one execution of the model on a batch of `size` inferences (Triton's
        execution_count and batch_stats): a request alone, or a dynamic batch."""
        self.execution_count += 1
        batch = self.batches.get(size)
        if batch is None:
            batch = self.batches[size] = [0, 0, 0, 0]
        batch[0] += 1
        batch[1] += compute_input
        batch[2] += compute_infer
        batch[3] += compute_output

    def cache_hit(self, arrived: int, ns: int) -> None:
        """Count a request answered from the response cache, `ns` of it looking up and encoding
        (as Triton: a success with no compute phases, inference or execution)."""
        self.last_inference = time.time_ns() // 1_000_000
        _add(self.success, time.perf_counter_ns() - arrived)
        _add(self.cache_hits, ns)

    def cache_miss(self, ns: int) -> None:
        """Count the cache's part of a request answered (and counted) without it: `ns` looking
        up and storing."""
        _add(self.cache_misses, ns)

    def failed(self, arrived: int, error: BaseException) -> None:
        """Count a request that was refused or failed with `error` (its reason: failure_reason)."""
        self.last_inference = time.time_ns() // 1_000_000
        _add(self.fail, time.perf_counter_ns() - arrived)
        self.fail_reasons[failure_reason(error)] += 1

    def report(self, name: str, version: str) -> dict[str, Any]:
        """Triton's `model_stats` entry (key order as Triton writes it)."""
        duration = lambda pair: {"count": pair[0], "ns": pair[1]}  # noqa: E731
        stats = {"success": duration(self.success), "fail": duration(self.fail),
                 **{phase: duration(self.phases[phase]) for phase in PHASES},
                 "cache_hit": duration(self.cache_hits),
                 "cache_miss": duration(self.cache_misses)}  # fmt: skip
        batches = [
            {"batch_size": size, "compute_input": duration((n, i)),
             "compute_infer": duration((n, f)), "compute_output": duration((n, o))}
            for size, (n, i, f, o) in sorted(self.batches.items())
        ]  # fmt: skip
        return {"name": name, "version": version, "last_inference": self.last_inference,
                "inference_count": self.inference_count,
                "execution_count": self.execution_count, "inference_stats": stats,
                "response_stats": {}, "batch_stats": batches, "memory_usage": []}  # fmt: skip


class Statistics:
    """Every model version's counts, kept from its first request."""

    def __init__(self) -> None:
        self.models: dict[tuple[str, str], ModelStatistics] = {}
        self.buckets = DEFAULT_BUCKETS  # seconds; set before the first request (use_buckets)
        self.bounds = bounds_ns(DEFAULT_BUCKETS)

    def use_buckets(self, buckets: tuple[float, ...]) -> None:
        """Histogram buckets (seconds) of the versions counted from now on."""
        self.buckets, self.bounds = buckets, bounds_ns(buckets)

    def of(self, name: str, version: str) -> ModelStatistics:
        """The counts of one model version (made on first use)."""
        key = (name, version)
        found = self.models.get(key)
        if found is None:
            found = self.models[key] = ModelStatistics(self.bounds)
        return found

    def report(self, name: str, version: str) -> dict[str, Any]:
        """The `model_stats` entry of one version (zeros when it has had no request)."""
        found = self.models.get((name, version))
        return (found or ModelStatistics()).report(name, version)


class SharedStatistics(Protocol):
    """Reports summed beyond this process, for the stats call (cluster mode: the sum over the
    cluster's live replicas, service/cluster/statistics.py, handed to the data plane by the
    app)."""

    async def reports(self, versions: list[tuple[str, str]]) -> list[dict[str, Any]]:
        """The `model_stats` entry of each (name, version)."""
        ...


def failure_reason(error: BaseException | None) -> int:
    """Triton's failure reason (an index of REASONS) of a request's error: REJECTED, refused for
    room (a full queue, the memory budget, a queue timeout: Overloaded, Unavailable); CANCELED,
    its client left (RunCancelled); BACKEND, its run failed (a 5xx: an engine error, a worker
    that died, a run timeout, anything not a ServiceError); OTHER, the request itself was refused
    (a 4xx: bad inputs, too large, not ready; or 501, a feature not offered)."""
    if isinstance(error, RunCancelled):
        return CANCELED
    if isinstance(error, Overloaded | Unavailable):
        return REJECTED
    if error is None or isinstance(error, Unsupported):
        return OTHER
    if isinstance(error, ServiceError) and error.status_code < 500:
        return OTHER
    return BACKEND


def _add(pair: list[int], ns: int) -> None:
    pair[0] += 1
    pair[1] += ns
