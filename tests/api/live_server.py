"""A real uvicorn server on 127.0.0.1 in a subprocess, for tests that need sockets."""

import os
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


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


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
           **{f"OPSERVE_{k.upper()}": v for k, v in settings.items()}}  # fmt: skip
    if "--port" in argv:
        port = int(argv[argv.index("--port") + 1])
    log = None if log_to is None else log_to.open("ab")
    if log is not None:  # lines in the file as they are written, for a test to read them
        env["PYTHONUNBUFFERED"] = "1"
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
