"""A real uvicorn server on 127.0.0.1 in a subprocess, for tests that need sockets."""

import os
import random
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).parents[2]


@dataclass(frozen=True)
class Server:
    """A uvicorn process serving the app on 127.0.0.1."""

    process: subprocess.Popen[bytes]
    port: int
    host: str = "127.0.0.1"  # "[::1]" for a server on "::" (uvicorn's is IPv6 only there)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def rss_bytes(self, field: str = "VmRSS") -> int:
        """Resident memory of the server process, from /proc/<pid>/status (VmRSS or VmHWM)."""
        for line in Path(f"/proc/{self.process.pid}/status").read_text().splitlines():
            if line.startswith(f"{field}:"):
                return int(line.split()[1]) * 1024
        raise LookupError(field)


def _ports_outside_the_ephemeral_range() -> Iterator[int]:
    """Ports for this process's servers, none of them one the kernel hands out by itself.

    A port taken with bind(0) and closed again lies in the ephemeral range, where every
    outgoing connection on the machine (any test's client, Redis's, another job's) may take it
    before the server binds it: CI failed once on just that ("Address already in use" for a
    gRPC port). Below the range, only a process that names a port can hold one. Each xdist
    worker walks its own block, from a random start (two suites on one machine), skipping a
    port that something holds."""
    low, _ = map(int, Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    floor = 10000 if low > 20000 else 1024  # a kernel with a moved range: still below it
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw-1").removeprefix("gw")
    blocks = 16
    size = (low - floor) // blocks
    start = floor + (int(worker) + 1) % blocks * size
    offset = random.randrange(size)
    for step in range(size):
        yield start + (offset + step) % size


_PORTS = _ports_outside_the_ephemeral_range()


def free_port() -> int:
    """A port on 127.0.0.1 that no one holds now, and that the kernel does not give out."""
    for port in _PORTS:
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:  # held, or in TIME_WAIT after an earlier test's server
                continue
            return port
    raise RuntimeError("this worker's block of ports is used up")


@contextmanager
def serve(*argv: str, wait_path: str = "/v2/health/ready", log_to: Path | None = None,
          module: str = "service", **settings: str) -> Iterator[Server]:  # fmt: skip
    """Run `python -m service *argv` with OPSERVE_* settings, in the project's folder; yield
    once `wait_path` says 200 (the live route for a server not meant to be ready). A `--port`
    in argv is where it listens (the flag wins). `log_to`: a file for its stdout and stderr.
    `module`: another module that runs the service (a bench's floor)."""
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OPSERVE_HOST": "127.0.0.1",
           "OPSERVE_PORT": str(port), "OPSERVE_LOG_LEVEL": "warning",
           "OPSERVE_GC_FREEZE": "true",  # as served (the tests' own process does not freeze)
           **{f"OPSERVE_{k.upper()}": v for k, v in settings.items()}}  # fmt: skip
    if "--port" in argv:
        port = int(argv[argv.index("--port") + 1])
    log = None if log_to is None else log_to.open("ab")
    if log is not None:  # lines in the file as they are written, for a test to read them
        env["PYTHONUNBUFFERED"] = "1"
    if starts := os.environ.get("OPSERVE_TEST_STARTS_LOG"):  # where the suite's time goes
        with open(starts, "a") as starts_log:
            starts_log.write(os.environ.get("PYTEST_CURRENT_TEST", "?").split(" ")[0] + "\n")
    process = subprocess.Popen([sys.executable, "-m", module, *argv], cwd=ROOT, env=env,
                               stdout=log, stderr=None if log is None else subprocess.STDOUT)  # fmt: skip
    server = Server(process, port, "[::1]" if settings.get("host") == "::" else "127.0.0.1")
    try:
        _wait_ready(server, wait_path)
        yield server
    finally:
        stop_process(process)
        if log is not None:
            log.close()


def stop_process(process: subprocess.Popen, seconds: float = 10) -> None:  # type: ignore[type-arg]
    """SIGTERM, and SIGKILL when `process` has not ended within `seconds`; reaped either way."""
    process.terminate()
    try:
        process.wait(timeout=seconds)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def _wait_ready(server: Server, path: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            raise RuntimeError(f"the server exited with {server.process.returncode}")
        try:
            with urllib.request.urlopen(f"{server.url}{path}", timeout=1) as answer:
                if answer.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.05)
    raise TimeoutError(f"the server on {server.url} was not ready within {timeout} s")
