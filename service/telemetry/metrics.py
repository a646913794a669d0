"""Prometheus metrics, summed over the worker processes of one server.

prometheus-client's multiprocess mode writes an mmap'ed value under a lock for every counter
increment and histogram bucket: about 9 us per request for the metrics below, a tenth of a small
operator call. Here a request only appends to a list in its own process (added to the
totals in batches); every 0.5 s each worker (recorder.SHARE_SECONDS) writes its totals to
`<directory>/<pid>.json`, from a thread of its own so the event loop never waits on the disk, and
`GET /metrics` sums those files with its own live totals and renders them with prometheus-client.
Counters of workers that died stay in the sum (counters never go back); their gauges do not.
Another worker's figures are at most one flush interval old. Other collectors share through the
same files: `sections` adds their part to this worker's snapshot, `others()` reads the other
workers', and `texts` adds what they render to the scrape (telemetry/triton_metrics.py).
"""

import logging
import os
import threading
from bisect import bisect_left
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from itertools import accumulate
from pathlib import Path
from typing import Any

import orjson
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.metrics_core import Metric

# Seconds; a small operator call takes ~0.1 ms, a large one up to seconds.
BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
# route template, method, model, operator, version, status: each part from a bounded set
Key = tuple[str, str, str, str, str, int]
# per key: requests, bytes in, bytes out, seconds, then one count per bucket and +Inf
_REQUESTS, _IN, _OUT, _SECONDS, _FIRST_BUCKET = range(5)
_WIDTH = _FIRST_BUCKET + len(BUCKETS) + 1
_LABELS = ["route", "method", "model", "operator", "version"]
_N = len(_LABELS)
# Requests are recorded as they are and added to the totals in batches: at each share (every
# SHARE_SECONDS), each scrape, or once this many wait. One list append per request instead of
# a dict lookup and six additions; the adding then runs in one loop (docs/api.md, Throughput:
# about 1.5% of a small request's CPU on the server, within that run's noise). A small batch:
# a batch of 1,024 took 0.5-0.9 ms, a pause for every request in flight (their p99).
MAX_PENDING = 64
log = logging.getLogger("opserve")


class Metrics:
    """Request totals of this process, shared with the other workers through `directory`."""

    def __init__(self, directory: str | None, models_loaded: Callable[[], int]) -> None:
        self.directory = Path(directory) if directory else None
        self.models_loaded = models_loaded
        self.series: dict[Key, list[float]] = {}
        self.pending: list[tuple[Key, float, int, int]] = []  # recorded, not yet in `series`
        self.in_flight = 0
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(self)
        self._writer: ThreadPoolExecutor | None = None  # made on the first share
        self._writing = threading.Lock()  # one write of the file at a time, the newest last
        self._taken = self._last_written = 0  # snapshots taken, the newest written
        # other collectors' parts of the snapshot: name -> their totals, read on the event loop
        self.sections: dict[str, Callable[[], Any]] = {}
        self._scraped: list[tuple[int, dict]] | None = None  # other workers', during a render
        self.texts: list[Callable[[], bytes]] = []  # rendered after the registry's families

    def record(self, key: Key, seconds: float, bytes_in: int, bytes_out: int) -> None:
        """Count one answered request: kept as it is, added to the totals in a batch."""
        pending = self.pending
        pending.append((key, seconds, bytes_in, bytes_out))
        if len(pending) >= MAX_PENDING:
            self.add_pending()

    def add_pending(self) -> None:
        """Add the requests recorded since the last time to the totals (before the totals are
        read: by flush, and by a scrape through _gather)."""
        series = self.series
        taken, self.pending = self.pending, []  # taken first: never added twice
        for key, seconds, bytes_in, bytes_out in taken:
            totals = series.get(key)
            if totals is None:
                totals = series[key] = [0] * _WIDTH
            totals[_REQUESTS] += 1
            totals[_IN] += bytes_in
            totals[_OUT] += bytes_out
            totals[_SECONDS] += seconds
            totals[_FIRST_BUCKET + bisect_left(BUCKETS, seconds)] += 1

    def share(self) -> None:
        """Write this process's totals where the other workers read them, the file written on
        a thread of its own: on ext4, renaming over the old file took 1.6-1.9 ms (its data is
        written out first), and on the event loop that stalled every request in flight twice
        a second (docs/deployment.md, Metrics)."""
        snapshot = self._snapshot()
        if snapshot is not None:
            if self._writer is None:
                self._writer = ThreadPoolExecutor(1, thread_name_prefix="opserve-metrics")
            try:
                self._writer.submit(self._write, *snapshot)
            except RuntimeError:  # the interpreter is exiting: no new thread work
                self._write(*snapshot)

    def flush(self) -> None:
        """Write this process's totals now (at shutdown), after any share still pending. On
        the thread that shares (the event loop's), or once that loop has stopped (atexit)."""
        snapshot = self._snapshot()
        if self._writer is not None:
            self._writer.shutdown(wait=True)  # a later share makes a new one
            self._writer = None
        if snapshot is not None:
            self._write(*snapshot)

    def _snapshot(self) -> tuple[int, bytes] | None:
        """The totals as the file holds them, numbered in the order taken (None: not shared)."""
        self.add_pending()
        if self.directory is None:
            return None
        self._taken += 1
        snapshot = {"series": [[*k, *v] for k, v in self.series.items()],
                    "in_flight": self.in_flight, "models": self.models_loaded(),
                    **{name: totals() for name, totals in self.sections.items()}}  # fmt: skip
        return self._taken, orjson.dumps(snapshot)

    def _write(self, number: int, content: bytes) -> None:
        """Write snapshot `number` unless a newer one was written (counters never go back)."""
        assert self.directory is not None
        pid = os.getpid()
        with self._writing:
            if number <= self._last_written:
                return
            temporary = self.directory / f"{pid}.json.tmp"
            try:
                temporary.write_bytes(content)
                temporary.replace(self.directory / f"{pid}.json")  # readers never see half a file
                self._last_written = number
            except FileNotFoundError:
                pass  # the server is stopping and removed the directory: nobody reads it any more
            except OSError as exc:  # a full disk must not fail requests
                log.warning("metrics of worker %d not shared: %s", pid, exc)

    def render(self) -> bytes:
        """The Prometheus text exposition of every worker's metrics (the other workers' files
        read once for every collector)."""
        self._scraped = list(self._snapshots())
        try:
            return b"".join([generate_latest(self.registry), *(text() for text in self.texts)])
        finally:
            self._scraped = None

    def others(self) -> list[tuple[int, dict]]:
        """(pid, last snapshot) of every other worker that shared, dead ones included."""
        return self._scraped if self._scraped is not None else list(self._snapshots())

    def describe(self) -> list[Metric]:
        return []  # no fixed description: registering must not collect

    def collect(self) -> Iterator[Metric]:
        series, in_flight, models = self._gather()
        requests = CounterMetricFamily("opserve_requests", "Requests answered, by route template, "
                                       "model, operator, version and status", labels=[*_LABELS, "status"])  # fmt: skip
        received = CounterMetricFamily("opserve_request_bytes", "Request body bytes read",
                                       labels=_LABELS)  # fmt: skip
        sent = CounterMetricFamily("opserve_response_bytes", "Response body bytes sent",
                                   labels=_LABELS)  # fmt: skip
        latency = HistogramMetricFamily("opserve_request_duration_seconds", "Time from the "
                                        "request's arrival to its last byte sent", labels=_LABELS)  # fmt: skip
        by_route: dict[tuple[str, ...], list[float]] = {}
        for key, totals in sorted(series.items()):
            labels = tuple(str(part) for part in key[:_N])
            requests.add_metric([*labels, str(key[_N])], totals[_REQUESTS])
            summed = by_route.setdefault(labels, [0] * _WIDTH)
            for i, value in enumerate(totals):
                summed[i] += value
        for labels, totals in by_route.items():
            received.add_metric(list(labels), totals[_IN])
            sent.add_metric(list(labels), totals[_OUT])
            counts = accumulate(totals[_FIRST_BUCKET:])
            bounds = [*(repr(b) for b in BUCKETS), "+Inf"]
            latency.add_metric(list(labels), list(zip(bounds, counts, strict=True)),
                               totals[_SECONDS])  # fmt: skip
        yield from (requests, received, sent, latency)
        yield GaugeMetricFamily("opserve_requests_in_flight", "Requests being answered now, "
                                "this scrape included", value=in_flight)  # fmt: skip
        yield GaugeMetricFamily("opserve_models_loaded", "Models loaded (the most any "
                                "worker holds)", value=models)  # fmt: skip

    def _gather(self) -> tuple[dict[Key, list[float]], int, int]:
        """Every worker's totals: this process's live ones, the others' last snapshots."""
        self.add_pending()
        series = {k: list(v) for k, v in self.series.items()}
        in_flight, models = self.in_flight, self.models_loaded()
        for pid, snapshot in self.others():
            for row in snapshot["series"]:
                key: Key = (row[0], row[1], row[2], row[3], row[4], row[5])
                totals = series.setdefault(key, [0] * _WIDTH)
                for i, value in enumerate(row[_N + 1 :]):
                    totals[i] += value
            if alive(pid):  # a dead worker's requests are no longer in flight
                in_flight += snapshot["in_flight"]
                models = max(models, snapshot["models"])
        return series, in_flight, models

    def _snapshots(self) -> Iterator[tuple[int, dict]]:
        if self.directory is None:
            return
        own = os.getpid()
        for path in self.directory.glob("*.json"):
            pid = int(path.stem) if path.stem.isdigit() else own
            if pid != own:
                try:
                    yield pid, orjson.loads(path.read_bytes())
                except (OSError, orjson.JSONDecodeError):
                    continue  # replaced while being read: the next scrape has it


def alive(pid: int) -> bool:
    """Whether the worker process `pid` still runs (its gauges count)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
