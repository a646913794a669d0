"""Issue 16, item 7: clients that dribble their headers do not lock others out. Against a
live server: 2,000 connections send a request's headers a byte at a time; a normal client is
answered within a second throughout, the dribblers get 408 at the header deadline, and a
connection past OPSERVE_MAX_CONNECTIONS gets a clear 503."""

import contextlib
import http.client
import resource
import socket
import time
from collections.abc import Iterator

import httpx
import pytest

from tests.api.live_server import Server, serve
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


@pytest.fixture(scope="module")
def bounded() -> Iterator[Server]:
    """A server with room for 50 connections, closing one idle for a second."""
    with serve(max_connections="50", keep_alive_seconds="1") as server:
        yield server


def test_connections_past_the_bound_are_refused_at_once(bounded: Server) -> None:
    held = _connect(bounded.port, 50)
    try:
        extra = socket.create_connection(("127.0.0.1", bounded.port), timeout=5)
        extra.settimeout(5)
        answer = extra.recv(256)
        extra.close()
        assert answer.startswith(b"HTTP/1.1 503") and b"OPSERVE_MAX_CONNECTIONS" in answer
        assert b"retry-after: 1" in answer
    finally:
        for sock in held:
            sock.close()
    time.sleep(0.2)
    assert httpx.post(f"{bounded.url}/v1/ops/Tile/13", json=SMALL).status_code == 200


def test_an_idle_kept_alive_connection_is_closed_after_its_setting(bounded: Server) -> None:
    """OPSERVE_KEEP_ALIVE_SECONDS reaches uvicorn: a connection kept alive after its answer is
    closed once idle for the setting (1 s here), not uvicorn's 5 s; a busier one stays."""
    connection = http.client.HTTPConnection("127.0.0.1", bounded.port, timeout=10)
    try:
        sockets = set()
        for pause in (0.5, 0.5, 0.5, 0.5, 0):  # each pause below the setting: kept open
            connection.request("GET", "/v2/health/live")
            sockets.add(connection.sock)
            answer = connection.getresponse()
            assert (answer.status, answer.read()) == (200, b'{"live":true}')
            assert answer.getheader("connection") != "close"
            time.sleep(pause)
        sock = connection.sock
        assert sock is not None and sockets == {sock}  # http.client would reconnect silently
        idle = time.monotonic()
        assert sock.recv(4096) == b""  # the server closed it (a 10 s timeout otherwise)
        closed_after = time.monotonic() - idle
    finally:
        connection.close()
    assert 0.9 <= closed_after < 4.5, closed_after
