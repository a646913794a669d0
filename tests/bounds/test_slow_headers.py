"""Issue 16, item 7: clients that dribble their headers do not lock others out. Against a
live server: 2,000 connections send a request's headers a byte at a time; a normal client is
answered within a second throughout, the dribblers get 408 at the header deadline, and a
connection past OPSERVE_MAX_CONNECTIONS gets a clear 503."""

import contextlib
import resource
import socket
import time

import httpx
import pytest

from tests.api.live_server import serve
from tests.api.resilience import SMALL

HEAD = b"POST /v1/ops/Tile/13 HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
DRIBBLERS = 2000


@pytest.fixture(autouse=True)
def _enough_files() -> None:
    """The test holds 2,000 sockets (the server inherits the limit and raises its own)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = min(hard, 3 * DRIBBLERS)
    if soft < wanted:
        resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
    if resource.getrlimit(resource.RLIMIT_NOFILE)[0] < 2 * DRIBBLERS + 100:
        pytest.skip("the file-descriptor limit is too low for 2,000 connections")


def _connect(port: int, count: int) -> list[socket.socket]:
    opened = []
    for _ in range(count):
        sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        sock.setblocking(False)
        opened.append(sock)
    return opened


def test_dribbled_headers_lock_no_one_out() -> None:
    with serve(header_timeout_seconds="4") as server:
        dribblers = _connect(server.port, DRIBBLERS)
        slowest, sent, start = 0.0, 0, time.monotonic()
        with httpx.Client(timeout=10) as client:
            while time.monotonic() - start < 6:  # past the header deadline
                for sock in dribblers:
                    with contextlib.suppress(OSError):  # closed by the server at its deadline
                        sock.send(HEAD[sent % len(HEAD) : sent % len(HEAD) + 1])
                sent += 1
                began = time.perf_counter()
                answer = client.post(f"{server.url}/v1/ops/Tile/13", json=SMALL)
                slowest = max(slowest, time.perf_counter() - began)
                assert answer.status_code == 200
                time.sleep(0.2)
        refused = 0
        for sock in dribblers:
            sock.setblocking(True)
            sock.settimeout(5)
            with contextlib.suppress(OSError):
                refused += sock.recv(64).startswith(b"HTTP/1.1 408")
            sock.close()
        assert slowest < 1.0, slowest
        assert refused == DRIBBLERS, refused


def test_connections_past_the_bound_are_refused_at_once() -> None:
    with serve(max_connections="50") as server:
        held = _connect(server.port, 50)
        try:
            extra = socket.create_connection(("127.0.0.1", server.port), timeout=5)
            extra.settimeout(5)
            answer = extra.recv(256)
            extra.close()
            assert answer.startswith(b"HTTP/1.1 503") and b"OPSERVE_MAX_CONNECTIONS" in answer
            assert b"retry-after: 1" in answer
        finally:
            for sock in held:
                sock.close()
        time.sleep(0.2)
        assert httpx.post(f"{server.url}/v1/ops/Tile/13", json=SMALL).status_code == 200
