"""Helpers of the resilience suite: raw sockets to a live server, and a watcher that samples
the server's RSS and a small request's latency while hostile clients do their worst."""

import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import httpx

from tests.api.live_server import Server

MiB = 1024 * 1024
DEFAULT_BUDGET = 512 * MiB  # Settings().memory_budget_bytes
SMALL = {"inputs": {"input": {"dtype": "float", "shape": [2, 3], "data": [1, 2, 3, 4, 5, 6]},
                    "repeats": {"dtype": "int64", "data": [2, 2]}}}  # fmt: skip


def request_bytes(path: str, body: bytes, *headers: str, length: int | None = None) -> bytes:
    """An HTTP/1.1 POST as bytes; `length` overrides the Content-Length (a body to come)."""
    head = [f"POST {path} HTTP/1.1", "Host: x", "Content-Type: application/json",
            f"Content-Length: {len(body) if length is None else length}", *headers]  # fmt: skip
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


def fill_request(count: int, dtype: str = "double", value: str = "0", fmt: str = "json") -> bytes:
    """A ~200-byte ConstantOfShape request whose answer holds `count` elements."""
    body = ('{"inputs":{"input":{"dtype":"int64","data":[' + str(count) + ']}},'
            '"attributes":{"value":{"dtype":"' + dtype + '","shape":[1],"data":[' + value + ']}},'
            '"output_format":"' + fmt + '"}').encode()  # fmt: skip
    return request_bytes("/v1/ops/ConstantOfShape/25", body)


@contextmanager
def sockets(server: Server, count: int) -> Iterator[list[socket.socket]]:
    """`count` connections to the server with small receive buffers, all closed at the end."""
    opened: list[socket.socket] = []
    try:
        for _ in range(count):
            sock = socket.socket()
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16 * 1024)
            sock.settimeout(30)
            sock.connect(("127.0.0.1", server.port))
            opened.append(sock)
        yield opened
    finally:
        for sock in opened:
            sock.close()


def read_status(sock: socket.socket, timeout: float = 10.0) -> int:
    """The status code of the next answer on `sock` (reads only its first bytes)."""
    sock.settimeout(timeout)
    head = sock.recv(64)
    return int(head.split(b" ", 2)[1])


def small_latency(server: Server, client: httpx.Client) -> float:
    """Seconds a small Tile request takes; it must answer 200."""
    start = time.perf_counter()
    answer = client.post(f"{server.url}/v1/ops/Tile/13", json=SMALL)
    assert answer.status_code == 200, answer.text
    return time.perf_counter() - start


@dataclass
class Watch:
    """Peak RSS and the slowest small request seen while the block ran, and the slowest in
    half a second before it (`before`: how busy the host is, judged in the same test)."""

    server: Server
    peak_rss: int = 0
    slowest: float = 0.0
    samples: int = 0
    errors: list[str] = field(default_factory=list)
    before: float = 0.0

    def allowed(self, seconds: float) -> float:
        """How slow a small request may be: `seconds`, or 4 x the slowest before on a busy
        host (CI runs beside other jobs)."""
        return max(seconds, 4 * self.before)

    def answered_within(self, seconds: float) -> None:
        """Every small request answered, the slowest within `allowed(seconds)`."""
        allowed = self.allowed(seconds)
        assert not self.errors and self.slowest < allowed, (self.errors[:3], self.slowest, allowed)


@contextmanager
def watching(server: Server, every: float = 0.1) -> Iterator[Watch]:
    """Sample the server's RSS and a small request's latency every `every` seconds, for half a
    second before the block (`before`) and while it runs."""
    watch = Watch(server)

    def sample(stop: threading.Event) -> None:
        with httpx.Client(timeout=10) as client:
            while not stop.is_set():
                watch.peak_rss = max(watch.peak_rss, server.rss_bytes())
                try:
                    watch.slowest = max(watch.slowest, small_latency(server, client))
                except (AssertionError, httpx.HTTPError) as exc:
                    watch.errors.append(repr(exc))
                watch.samples += 1
                stop.wait(every)

    with in_background(sample):
        time.sleep(0.5)
    watch.before, watch.slowest, watch.samples = watch.slowest, 0.0, 0
    with in_background(sample):
        yield watch


@contextmanager
def in_background(loop: Callable[[threading.Event], None]) -> Iterator[None]:
    """Run `loop(stop)` on a thread of its own while the block runs; `stop` is set when the
    block ends, and the thread joined (a watcher's sampling loop, whatever door it calls)."""
    stop = threading.Event()
    thread = threading.Thread(target=loop, args=(stop,), daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(15)
