"""Finding 1 of issue 9: stalled uploads must not block large requests; body reads have a
deadline (408). Against a live server under its default settings, RSS from /proc."""

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

STALLED = request_bytes("/v1/ops/Shape/25", b"{", length=1_000_000)
CHUNKED_STALL = (b"POST /v1/ops/Shape/25 HTTP/1.1\r\nHost: x\r\nContent-Type: application/json"
                 b"\r\nTransfer-Encoding: chunked\r\n\r\n1\r\n{\r\n")  # fmt: skip


def test_stalled_uploads_do_not_block_large_requests() -> None:
    with serve() as server, sockets(server, 12) as stalls:
        idle = server.rss_bytes()
        for i, sock in enumerate(stalls):  # Content-Length stalls and chunked stalls
            sock.sendall(STALLED if i % 2 else CHUNKED_STALL)
        time.sleep(0.3)
        with watching(server) as watch, httpx.Client(timeout=10) as client:
            # large answers (8 MiB of doubles as JSON, as in the issue): three at least, and for
            # a second at least, so that the watcher samples the server while they run
            count, until = 0, time.monotonic() + 1.0
            while count < 3 or time.monotonic() < until:
                count += 1
                start = time.perf_counter()
                answer = client.post(f"{server.url}/v1/ops/ConstantOfShape/25", content=fill_request(1_000_000).split(b"\r\n\r\n", 1)[1],
                                     headers={"content-type": "application/json"})  # fmt: skip
                assert answer.status_code == 200, answer.text
                assert len(answer.json()["outputs"]["output"]["data"]) == 1_000_000
                assert time.perf_counter() - start < 5
        assert watch.samples >= 3, watch.samples
        watch.answered_within(1.0)
        assert watch.peak_rss < idle + DEFAULT_BUDGET


def test_a_stalled_body_gets_408_and_loses_its_connection() -> None:
    with serve(body_timeout_seconds="1") as server, sockets(server, 2) as (plain, chunked):
        start = time.monotonic()
        plain.sendall(STALLED)
        chunked.sendall(CHUNKED_STALL)
        for sock in (plain, chunked):
            assert read_status(sock, timeout=5) == 408
            sock.settimeout(5)
            while sock.recv(65536):  # the server closes the connection after the answer
                pass
        assert time.monotonic() - start < 4


def test_a_trickling_body_gets_408_at_the_deadline() -> None:
    """A client that sends a byte now and then, never stalling long, still meets the deadline
    of the whole body."""
    with serve(body_timeout_seconds="1") as server, sockets(server, 1) as (sock,):
        sock.sendall(request_bytes("/v1/ops/Shape/25", b"", length=100))
        start = time.monotonic()
        status = None
        while time.monotonic() - start < 5:
            try:
                sock.sendall(b" ")
            except OSError:
                break
            sock.settimeout(0.2)
            try:
                status = read_status(sock, timeout=0.2)
                break
            except TimeoutError:
                continue
        assert status == 408
        assert time.monotonic() - start < 3
