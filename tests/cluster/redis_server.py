"""A real Redis (Debian's redis-server) on a free port in a temporary folder, for the cluster
tests: started and stopped by the tests, never a fake. With append-only persistence, so a
restart on the same port keeps what was committed (as docs/deployment.md advises)."""

import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.api.live_server import free_port


class RedisServer:
    """One redis-server process; `stop()` and `start()` again on the same port and data."""

    def __init__(self, folder: Path, port: int | None = None, *extra: str) -> None:
        self.folder = folder
        self.port = port or free_port()
        self.extra = extra  # more redis-server arguments (e.g. --requirepass)
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        argv = ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1",
                "--dir", str(self.folder), "--appendonly", "yes", "--appendfsync", "always",
                "--save", "", "--protected-mode", "no", "--loglevel", "warning",
                *self.extra]  # fmt: skip
        self.process = subprocess.Popen(argv, stdout=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2) as sock:
                    sock.sendall(b"PING\r\n")
                    if sock.recv(64).startswith(
                        (b"+PONG", b"-NOAUTH")
                    ):  # up, or up with a password
                        return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError(f"redis-server did not answer on port {self.port}")

    def stop(self, kill: bool = False) -> None:
        if self.process is None:
            return
        if kill:
            self.process.kill()
        else:
            self.process.terminate()
        self.process.wait(timeout=10)
        self.process = None


@contextmanager
def redis_server(folder: Path) -> Iterator[RedisServer]:
    """A started Redis, stopped at the end however the test ends."""
    if shutil.which("redis-server") is None:
        pytest.skip("needs Debian's redis-server (apt-get install redis-server; .ci/run does)")
    server = RedisServer(folder)
    server.start()
    try:
        yield server
    finally:
        server.stop()
