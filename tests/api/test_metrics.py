"""GET /metrics: counters that match a known mix of requests exactly, summed over two worker
processes; bounded labels; a dead worker's counters kept and its gauges dropped."""

import asyncio
import json
import os
import re
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from service.api.observe import observe
from service.main import create_app
from service.settings import Settings
from service.telemetry import recorder
from service.telemetry.metrics import MAX_PENDING, Metrics
from service.telemetry.recorder import Telemetry
from tests.api.live_server import serve

TILE = json.dumps({"inputs": {"input": {"dtype": "float", "shape": [2], "data": [1, 2]},
                              "repeats": {"dtype": "int64", "shape": [1], "data": [3]}}}).encode()  # fmt: skip
LIMIT = 4096
OPS = "/v1/ops/{op_type}/{version}"
# (path, body, status) and how many of each: successes, unknown operator, too large, invalid
MIX = [("/v1/ops/Tile/13", TILE, 200, 23), ("/v1/ops/Nope/13", TILE, 404, 7),
       ("/v1/ops/Tile/13", b"[" * 3 + b" " * 2 * LIMIT, 413, 5),
       ("/v1/ops/Tile/13", b'{"inputs": {}}', 422, 9)]  # fmt: skip
SAMPLE = re.compile(r"^(\w+)(?:\{(.*)\})? (\S+)$")


def _post(url: str, body: bytes) -> int:
    request = urllib.request.Request(url, data=body, headers={"content-type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            answer.read()
            return answer.status  # type: ignore[no-any-return]
    except urllib.error.HTTPError as error:
        return error.code
    except ConnectionError:  # a 413 may close the connection while the body is still going out
        return 413


def samples(text: str, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    """`{labels: value}` of one metric in a Prometheus text exposition."""
    found = {}
    for line in text.splitlines():
        if (match := SAMPLE.match(line)) and match[1] == name:
            labels = tuple(sorted(re.findall(r'(\w+)="([^"]*)"', match[2] or "")))
            found[labels] = float(match[3])
    return found


def _expected(rounds: int) -> dict[tuple[tuple[str, str], ...], float]:
    expected: dict[tuple[tuple[str, str], ...], float] = {}
    for path, _, status, count in MIX:
        operator, version = ("Tile", "13") if "Tile" in path else ("unknown", "unknown")
        labels = (("method", "POST"), ("model", operator), ("operator", operator),
                  ("route", OPS), ("status", str(status)), ("version", version))  # fmt: skip
        expected[labels] = expected.get(labels, 0) + count * rounds
    return expected


def test_counters_match_a_known_mix_across_two_workers(tmp_path: Path) -> None:
    (tmp_path / "12345.json").write_text('{"series": [["/x", "GET", "", "", "", 200, 9]]}')  # stale
    calls = [(p, body, status) for p, body, status, n in MIX for _ in range(n)]
    with serve(workers="2", max_request_bytes=str(LIMIT), metrics_dir=str(tmp_path)) as server:
        rounds = 0
        with ThreadPoolExecutor(8) as pool:  # concurrent clients: both workers get some
            while rounds < 20 and (rounds == 0 or len(list(tmp_path.glob("*.json"))) < 2):
                statuses = list(pool.map(lambda c: _post(f"{server.url}{c[0]}", c[1]), calls))
                assert statuses == [status for _, _, status in calls]
                rounds += 1
                time.sleep(0.2)  # a worker writes its totals within 50 ms
        assert len(list(tmp_path.glob("*.json"))) == 2  # both workers answered and shared
        deadline = time.monotonic() + 10
        while True:  # another worker's totals arrive within its next flush
            text = httpx.get(f"{server.url}/metrics").text
            requests = samples(text, "opserve_requests_total")
            ops = {k: v for k, v in requests.items() if ("route", OPS) in k}
            if ops == _expected(rounds) or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        assert ops == _expected(rounds)
        assert ("route", "/x") not in {label for key in requests for label in key}
        durations = samples(text, "opserve_request_duration_seconds_count")
        tile = (("method", "POST"), ("model", "Tile"), ("operator", "Tile"), ("route", OPS),
                ("version", "13"))  # fmt: skip
        assert durations[tile] == (23 + 5 + 9) * rounds
        assert (
            samples(text, "opserve_request_bytes_total")[tile] >= (23 * len(TILE) + 9 * 14) * rounds
        )
        assert samples(text, "opserve_response_bytes_total")[tile] > 0
        assert samples(text, "opserve_requests_in_flight")[()] == 1  # this scrape
        assert samples(text, "opserve_models_loaded")[()] == 0


def test_labels_stay_bounded_whatever_the_paths() -> None:
    app = create_app(Settings())
    transport = httpx.ASGITransport(app=app)

    async def scenario() -> str:
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            for n in range(50):
                await client.post(f"/v1/ops/Op{n}/{n}", content=b"{}")
                await client.get(f"/nowhere/{n}")
                await client.request(f"VERB{n}", "/v2/health/live")
            return (await client.get("/metrics")).text

    requests = samples(asyncio.run(scenario()), "opserve_requests_total")
    assert len(requests) == 3  # unknown operator, unmatched path, other method
    assert all(v == 50 for v in requests.values())


def test_a_dead_workers_counters_stay_and_its_gauges_go(tmp_path: Path) -> None:
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True).stdout.strip()  # fmt: skip
    row = ["/v1/ops/{op_type}", "POST", "Shape", "Shape", "15", 200, 4, 40, 80, 0.004, 4] + [0] * 14
    for pid in (dead, str(os.getppid())):
        snapshot = {"series": [row], "in_flight": 2, "models": 3}
        (tmp_path / f"{pid}.json").write_text(json.dumps(snapshot))
    text = Metrics(str(tmp_path), lambda: 1).render().decode()
    requests = samples(text, "opserve_requests_total")
    assert list(requests.values()) == [8]
    assert samples(text, "opserve_requests_in_flight")[()] == 2  # the living one's only
    assert samples(text, "opserve_models_loaded")[()] == 3
    buckets = samples(text, "opserve_request_duration_seconds_bucket")
    assert {dict(k)["le"]: v for k, v in buckets.items()}["0.0005"] == 8


def test_a_slow_request_reaches_the_shared_totals(tmp_path: Path) -> None:
    observer = Telemetry(None, Metrics(str(tmp_path), lambda: 0))

    async def slow(scope, receive, send):  # type: ignore[no-untyped-def]
        await asyncio.sleep(recorder.SHARE_SECONDS * 2)  # totals are shared while it is in flight
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    async def sent(message):  # type: ignore[no-untyped-def]
        return None

    scope = {"type": "http", "method": "GET", "path": "/slow", "headers": []}

    async def scenario() -> None:
        await observe(observer, slow, scope, None, sent, "/slow")  # type: ignore[arg-type]
        await asyncio.sleep(recorder.SHARE_SECONDS * 2)

    asyncio.run(scenario())
    (snapshot,) = [json.loads(p.read_text()) for p in tmp_path.glob("*.json")]
    (row,) = snapshot["series"]
    assert row[:7] == ["/slow", "GET", "", "", "", 200, 1] and snapshot["in_flight"] == 0


def test_requests_recorded_in_batches_are_all_in_the_totals(tmp_path: Path) -> None:
    """Recorded requests wait in a bounded list; a scrape and a flush both count every one."""
    metrics = Metrics(str(tmp_path), lambda: 0)
    key = ("/v1/ops/{op_type}/{version}", "POST", "Tile", "Tile", "13", 200)
    for n in range(2500):
        metrics.record(key, 0.002 if n % 2 else 0.0002, 10, 20)
        assert len(metrics.pending) < MAX_PENDING  # never more than a batch waits
    rendered = metrics.render().decode().splitlines()

    def value(start: str) -> float:
        (line,) = [line for line in rendered if line.startswith(start)]
        return float(line.rpartition(" ")[2])

    assert value("opserve_requests_total{") == 2500
    assert value("opserve_request_bytes_total{") == 25000
    # the 0.0002 s half in the first bucket (0.5 ms), all of them by the 2.5 ms one
    assert value('opserve_request_duration_seconds_bucket{le="0.0005"') == 1250
    assert value('opserve_request_duration_seconds_bucket{le="0.0025"') == 2500
    metrics.record(key, 0.0002, 10, 20)
    metrics.flush()  # what the other workers read has it too
    (shared,) = json.loads((tmp_path / f"{os.getpid()}.json").read_text())["series"]
    assert shared[6] == 2501


def test_shares_write_the_file_off_the_event_loop_and_never_go_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A share (twice a second) writes its file on a thread of its own, not on the loop that
    serves requests; the shutdown's flush waits for a share still writing and writes last, so
    the file ends with every request counted."""
    metrics = Metrics(str(tmp_path), lambda: 0)
    key = ("/v1/ops/{op_type}/{version}", "POST", "Tile", "Tile", "13", 200)
    writers: list[str] = []
    release = threading.Event()
    write_bytes = Path.write_bytes

    def held_write(path: Path, data: bytes) -> int:
        writers.append(threading.current_thread().name)
        if threading.current_thread().name.startswith("opserve-metrics"):
            assert release.wait(10)  # the share's write is slow: the disk is busy
        return write_bytes(path, data)

    monkeypatch.setattr(Path, "write_bytes", held_write)
    metrics.record(key, 0.001, 10, 20)
    metrics.share()  # returns at once, its write held on the thread
    metrics.record(key, 0.001, 10, 20)
    flushing = threading.Thread(target=metrics.flush)
    flushing.start()
    time.sleep(0.2)
    assert flushing.is_alive()  # the flush waits for the share's write
    release.set()
    flushing.join(10)
    assert writers == [writers[0], flushing.name] and writers[0].startswith("opserve-metrics")
    (snapshot,) = [json.loads(p.read_text()) for p in tmp_path.glob("*.json")]
    (row,) = snapshot["series"]
    assert row[6] == 2  # both requests: the older snapshot did not land last
