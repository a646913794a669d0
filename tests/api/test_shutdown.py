"""Graceful shutdown on a real server: SIGTERM turns readiness off, stops new connections,
lets the request in flight finish with its right answer, and the process exits in time."""

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.api.live_server import ROOT, serve

BODY = json.dumps({"inputs": {"input": {"dtype": "int64", "shape": [2], "data": [5, 7]},
                              "repeats": {"dtype": "int64", "shape": [1], "data": [2]}}}).encode()  # fmt: skip


def test_sigterm_finishes_the_request_in_flight_then_exits(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TMPDIR", str(tmp_path))  # where the server makes its metrics directory
    with serve(graceful_shutdown_seconds="10") as server:
        (metrics,) = tmp_path.glob("opserve-metrics-*")  # made fresh for this start
        conn = socket.create_connection(("127.0.0.1", server.port), timeout=10)
        head = (f"POST /v1/ops/Tile/13 HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(BODY)}\r\n\r\n").encode()  # fmt: skip
        conn.sendall(head + BODY[:10])  # in flight: the rest of the body is still to come
        time.sleep(0.3)
        assert listening(server.process.pid, server.port)
        server.process.send_signal(signal.SIGTERM)
        # the listener is closed: no new request gets in (asked of the process itself: once
        # the port is free, another test's server may take it and answer a connection)
        refused, deadline = False, time.monotonic() + 5
        while not refused and time.monotonic() < deadline:  # a loaded machine may take a while
            time.sleep(0.1)
            refused = not listening(server.process.pid, server.port)
        conn.sendall(BODY[10:])
        answer = b""
        while chunk := conn.recv(65536):
            answer += chunk
        conn.close()
        assert answer.startswith(b"HTTP/1.1 200"), answer[:200]
        assert json.loads(answer.split(b"\r\n\r\n", 1)[1])["outputs"]["output"]["data"] == [
            5,
            7,
            5,
            7,
        ]
        assert refused
        assert server.process.wait(timeout=10) == 0
        assert not metrics.exists()  # removed on the way out


def listening(pid: int, port: int) -> bool:
    """Whether process `pid` holds a socket listening on TCP `port` (Linux /proc)."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            local, state, inode = fields[1], fields[3], fields[9]
            if state == "0A" and int(local.rsplit(":", 1)[1], 16) == port and inode in inodes:
                return True
    return False


READINESS = """
import os, signal
from starlette.datastructures import State
from service.api.health import unready_on_sigterm
seen = []
signal.signal(signal.SIGTERM, lambda s, f: seen.append(s))  # stands for uvicorn's handler
state = State()
state.serving = True
unready_on_sigterm(state)
os.kill(os.getpid(), signal.SIGTERM)
print(state.serving, seen == [signal.SIGTERM])
"""


def test_sigterm_reports_not_ready_before_uvicorns_handler_runs() -> None:
    out = subprocess.run([sys.executable, "-c", READINESS], cwd=ROOT, capture_output=True,
                         text=True, check=True).stdout  # fmt: skip
    assert out.split() == ["False", "True"]
