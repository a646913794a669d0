"""Findings 3 and 4 of issue 9: JSON bodies that amplify in memory are bounded by what they
cost (the body pre-scan), and non-finite floats encode at the speed of finite ones without
holding the event loop. Against a live server under its default settings."""

import threading
import time

import httpx

from tests.api.live_server import serve
from tests.api.resilience import (
    DEFAULT_BUDGET,
    fill_request,
    read_status,
    request_bytes,
    sockets,
    watching,
)


def test_amplifying_json_bodies_are_refused_without_taking_memory() -> None:
    """Two 62 MB bodies of one-element lists at once: 3.3 GiB of RSS each on the old decoder."""
    lists = b'{"inputs":{"data":{"dtype":"float","data":[' + b",".join([b"[0]"] * 15_500_000)
    request = request_bytes("/v1/ops/Shape/25", lists + b"]}}}")
    with serve() as server:
        idle = server.rss_bytes()
        with watching(server) as watch, sockets(server, 2) as clients:
            senders = [threading.Thread(target=sock.sendall, args=(request,)) for sock in clients]
            for sender in senders:
                sender.start()
            for sender in senders:
                sender.join(30)
            statuses = [read_status(sock, timeout=30) for sock in clients]
        assert statuses == [413, 413]
        watch.answered_within(1.0)
        assert watch.peak_rss < idle + DEFAULT_BUDGET, (watch.peak_rss - idle) / 2**20


def test_a_large_json_body_within_the_budget_is_served() -> None:
    """A million values: within OPSERVE_MAX_JSON_ITEMS's default (1,048,576) and the budget."""
    body = (
        b'{"inputs":{"data":{"dtype":"float","data":[' + b",".join([b"0.5"] * 1_000_000) + b"]}}}"
    )
    with serve() as server, httpx.Client(timeout=30) as client:
        idle = server.rss_bytes()
        answer = client.post(f"{server.url}/v1/ops/Shape/25", content=body,
                             headers={"content-type": "application/json"})  # fmt: skip
        assert answer.status_code == 200, answer.text
        assert answer.json()["outputs"]["shape"]["data"] == [1_000_000]
        assert server.rss_bytes("VmHWM") < idle + DEFAULT_BUDGET


def _seconds(client: httpx.Client, url: str, request: bytes) -> float:
    start = time.perf_counter()
    answer = client.post(url, content=request.split(b"\r\n\r\n", 1)[1],
                         headers={"content-type": "application/json"})  # fmt: skip
    assert answer.status_code == 200, answer.text[:200]
    return time.perf_counter() - start


def test_non_finite_answers_encode_as_fast_as_finite_ones() -> None:
    """8Mi float NaN (48 MiB of JSON) against 8Mi float 1.5, and mixed NaN/infinities through
    Tile; small requests answer within a second meanwhile."""
    url_fill = "/v1/ops/ConstantOfShape/25"
    with serve() as server, httpx.Client(timeout=60) as client:
        url = f"{server.url}{url_fill}"
        _seconds(client, url, fill_request(1 << 20, "float", "1.5"))  # warm up
        with watching(server) as watch:
            finite = min(
                _seconds(client, url, fill_request(1 << 23, "float", "1.5")) for _ in range(2)
            )
            nan = min(
                _seconds(client, url, fill_request(1 << 23, "float", '"NaN"')) for _ in range(2)
            )
        mixed = client.post(f"{server.url}/v1/ops/Tile/13", json={
            "inputs": {"input": {"dtype": "float", "data": ["NaN", "Infinity", "-Infinity", 1.5]},
                       "repeats": {"dtype": "int64", "data": [1 << 19]}}})  # fmt: skip
        assert mixed.status_code == 200
        data = mixed.json()["outputs"]["output"]["data"]
        assert data[:8] == ["NaN", "Infinity", "-Infinity", 1.5] * 2 and len(data) == 1 << 21
    assert nan < 2 * finite + 0.5, (nan, finite)
    watch.answered_within(1.0)
