"""Triton's metric families (`nv_inference_*`, `nv_model_load_duration_secs`; labels `model` and
`version`, Triton's units), and latency histograms Triton lacks, made at scrape time from the
counts the statistics extension keeps (core/statistics.py: one source for both; nothing added
on the request path but the histograms' increments there).

Every worker's counts are in one scrape: this worker's part of its snapshot (metrics.py's
`sections`) holds its counts, and a scrape adds the other workers' last ones. Counters and
histograms of workers that died stay in the sum; gauges come from live workers only (pending
requests summed, a version's load time the longest of any worker's load).
"""

from collections.abc import Callable, Iterator
from itertools import accumulate
from typing import Any

from prometheus_client.core import GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.metrics_core import Metric

from service.core.statistics import HISTOGRAMS, PHASES, REASONS, Statistics
from service.telemetry import exposition
from service.telemetry.metrics import Metrics, alive

SECTION = "triton"
LABELS = ["model", "version"]
# a row's counters after (model, version): success, the fail reasons, inferences, executions,
# then ns of success (request), queue, compute_input, compute_infer, compute_output, then the
# response cache's hits, their ns, misses, their ns
_SUCCESS, _FIRST_REASON = 0, 1
_INFERENCES = _FIRST_REASON + len(REASONS)
_EXECUTIONS, _REQUEST_NS = _INFERENCES + 1, _INFERENCES + 2
_CACHE = _REQUEST_NS + 1 + len(PHASES)
_COUNTERS = _CACHE + 4
_DURATIONS = [("request", "requests spend from arrival to their answer (end to end)"),
              ("queue", "requests spend waiting in the scheduling queue"),
              ("compute_input", "requests spend processing inference inputs"),
              ("compute_infer", "requests spend executing the inference model"),
              ("compute_output", "requests spend processing inference outputs")]  # fmt: skip
Row = list[Any]  # model, version, the counters, then each histogram's counts per bucket


class TritonMetrics:
    """A collector over `stats` (this worker's) and `repository()` (None: no repository)."""

    def __init__(self, metrics: Metrics, stats: Statistics,
                 repository: Callable[[], Any]) -> None:  # fmt: skip
        self.metrics, self.stats, self.repository = metrics, stats, repository
        metrics.sections[SECTION] = self.totals
        metrics.texts.append(self.text)

    def text(self) -> bytes:
        """The families in Prometheus' text format, counters under Triton's names."""
        return exposition.text(self.collect())

    def totals(self) -> dict[str, Any]:
        """This worker's counts and gauges, as its snapshot shares them."""
        rows = []
        for (name, version), counts in self.stats.models.items():
            row: Row = [name, version, counts.success[0], *counts.fail_reasons,
                        counts.inference_count, counts.execution_count, counts.success[1],
                        *(pair[1] for pair in counts.pairs), *counts.cache_hits,
                        *counts.cache_misses]  # fmt: skip
            for histogram in counts.histograms:
                row.extend(histogram)
            rows.append(row)
        pending, loads = [], []
        repository = self.repository()
        for name in repository.names() if repository is not None else ():
            for number, entry in repository.versions(name).items():
                if entry.ready:
                    loads.append([name, str(number), entry.load_seconds])
                    # its dynamic batcher's queue: what waits for an execution to take it
                    pending.append([name, str(number), entry.batcher.queued if entry.batcher
                                    else 0])  # fmt: skip
        return {"buckets": list(self.stats.buckets), "rows": rows, "pending": pending,
                "load": loads}  # fmt: skip

    def collect(self) -> Iterator[Metric]:
        mine = self.totals()
        width = _COUNTERS + len(HISTOGRAMS) * (len(mine["buckets"]) + 1)
        rows: dict[tuple[str, str], list[float]] = {}
        pending: dict[tuple[str, str], float] = {}
        loads: dict[tuple[str, str], float] = {}
        for pid, snapshot in [(0, {SECTION: mine}), *self.metrics.others()]:
            part = snapshot.get(SECTION)
            if part is None or part["buckets"] != mine["buckets"]:
                continue  # not (yet) sharing these counts, or another server's buckets
            for row in part["rows"]:
                total = rows.setdefault((row[0], row[1]), [0] * width)
                for i, value in enumerate(row[2:]):
                    total[i] += value
            if pid == 0 or alive(pid):
                for name, version, queued in part["pending"]:
                    pending[name, version] = pending.get((name, version), 0) + queued
                for name, version, seconds in part["load"]:
                    loads[name, version] = max(loads.get((name, version), 0), seconds)
        yield from _counters(rows)
        yield from _histograms(rows, mine["buckets"])
        yield _gauge("nv_inference_pending_request_count", "Instantaneous number of pending "
                     "requests awaiting execution per-model (its dynamic batcher's queue)", pending)  # fmt: skip
        yield _gauge("nv_model_load_duration_secs", "Model load time in seconds", loads)


def _counters(rows: dict[tuple[str, str], list[float]]) -> Iterator[Metric]:
    """Triton's counters, under its names (no `_total`: exposition.py)."""
    success = Metric("nv_inference_request_success", "Number of successful inference requests, "
                     "all batch sizes", "counter")  # fmt: skip
    failure = Metric("nv_inference_request_failure", "Number of failed inference requests, all "
                     "batch sizes", "counter")  # fmt: skip
    inferences = Metric("nv_inference_count", "Number of inferences performed (does not include "
                        "cached requests)", "counter")  # fmt: skip
    executions = Metric("nv_inference_exec_count", "Number of model executions performed (does "
                        "not include cached requests)", "counter")  # fmt: skip
    durations = [Metric(f"nv_inference_{name}_duration_us", f"Cumulative time {what}, in "
                        "microseconds", "counter") for name, what in _DURATIONS]  # fmt: skip
    cache = [Metric("nv_cache_num_hits_per_model", "Number of cache hits per model", "counter"),
             Metric("nv_cache_hit_duration_per_model", "Total cache hit duration per model, in "
                    "microseconds", "counter"),
             Metric("nv_cache_num_misses_per_model", "Number of cache misses per model",
                    "counter"),
             Metric("nv_cache_miss_duration_per_model", "Total cache miss (insert + lookup) "
                    "duration per model, in microseconds", "counter")]  # fmt: skip
    for (name, version), total in sorted(rows.items()):
        labels = {"model": name, "version": version}
        _add(success, labels, total[_SUCCESS])
        for i, reason in enumerate(REASONS):
            _add(failure, {**labels, "reason": reason}, total[_FIRST_REASON + i])
        _add(inferences, labels, total[_INFERENCES])
        _add(executions, labels, total[_EXECUTIONS])
        for i, family in enumerate(durations):
            _add(family, labels, total[_REQUEST_NS + i] // 1000)  # Triton's whole us
        for i, family in enumerate(cache):  # counts, then durations in whole us
            _add(family, labels, total[_CACHE + i] // (1000 if i % 2 else 1))
    yield from (success, failure, inferences, executions, *durations, *cache)


def _add(family: Metric, labels: dict[str, str], value: float) -> None:
    family.add_sample(family.name, labels, value)


def _histograms(rows: dict[tuple[str, str], list[float]], buckets: list[float]) -> Iterator[Metric]:
    """Request, queue and compute_infer times by bucket: unlike Triton's summaries, these add
    up across replicas (histogram_quantile over their sum)."""
    bounds = [*(repr(float(b)) for b in buckets), "+Inf"]
    families = [HistogramMetricFamily(f"opserve_inference_{name}_duration_seconds", f"Time "
                                      f"{what}, in seconds, by bucket (OPSERVE_METRICS_BUCKETS)", labels=LABELS)
                for name, what in _DURATIONS if name in HISTOGRAMS]  # fmt: skip
    sums = [_REQUEST_NS, _REQUEST_NS + 1, _REQUEST_NS + 1 + PHASES.index("compute_infer")]
    for (name, version), total in sorted(rows.items()):
        for i, family in enumerate(families):
            start = _COUNTERS + i * len(bounds)
            counts = accumulate(total[start : start + len(bounds)])
            family.add_metric([name, version], list(zip(bounds, counts, strict=True)),
                              total[sums[i]] / 1e9)  # fmt: skip
    yield from families


def _gauge(name: str, documentation: str, values: dict[tuple[str, str], float]) -> Metric:
    family = GaugeMetricFamily(name, documentation, labels=LABELS)
    for labels, value in sorted(values.items()):
        family.add_metric(list(labels), value)
    return family
