"""Workers versus replicas: requests/s of the small Tile request (bench_http.py's) served by

    one server with 1 worker, one server with N workers (OPSERVE_WORKERS=N), and
    N one-worker servers behind nginx (deploy/nginx/nginx.conf's proxy settings)

    python bench/bench_scaling.py [--workers 2] [--duration 5] [--rounds 2]

The load is wrk (Debian package `wrk`, 16 connections, one thread); nginx is the host's
(Debian package `nginx-light`). Everything shares the machine's cores with the load client,
so compare the rows with one another, not with bench_http.py's pinned figures.
"""

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.bench_http import free_port, run_wrk

ROOT = Path(__file__).resolve().parents[1]
NGINX = """worker_processes 1; pid {dir}/nginx.pid; error_log {dir}/error.log warn; daemon off;
events {{ worker_connections 1024; }}
http {{
  access_log off;
  client_body_temp_path {dir}; proxy_temp_path {dir};
  upstream opserve {{ {servers} keepalive 64; }}
  server {{ listen 127.0.0.1:{port};
    location / {{ proxy_pass http://opserve; proxy_http_version 1.1;
      proxy_set_header Connection ""; proxy_next_upstream error timeout non_idempotent; }} }}
}}
"""


@contextmanager
def opserve(workers: int) -> Iterator[int]:
    """`python -m service` with `workers` workers; yields its port once it answers."""
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OPSERVE_HOST": "127.0.0.1",
           "OPSERVE_PORT": str(port), "OPSERVE_WORKERS": str(workers),
           "OPSERVE_LOG_LEVEL": "warning"}  # fmt: skip
    server = subprocess.Popen([sys.executable, "-m", "service"], cwd=ROOT, env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    try:
        _wait(port)
        yield port
    finally:
        server.terminate()
        server.wait(timeout=30)


@contextmanager
def behind_nginx(replicas: int) -> Iterator[int]:
    """`replicas` one-worker servers behind the host's nginx; yields nginx's port."""
    with ExitStack() as stack, tempfile.TemporaryDirectory() as scratch:
        ports = [stack.enter_context(opserve(1)) for _ in range(replicas)]
        port = free_port()
        servers = " ".join(f"server 127.0.0.1:{p};" for p in ports)
        conf = Path(scratch) / "nginx.conf"
        conf.write_text(NGINX.format(dir=scratch, servers=servers, port=port))
        nginx = subprocess.Popen(["nginx", "-c", str(conf), "-e", f"{scratch}/error.log"],
                                 stderr=subprocess.DEVNULL)  # fmt: skip
        try:
            _wait(port)
            yield port
        finally:
            nginx.terminate()
            nginx.wait(timeout=10)


def _wait(port: int) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/health/ready", timeout=1):
                return
        except OSError:
            time.sleep(0.2)
    raise TimeoutError(f"nothing ready on port {port}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--duration", type=float, default=5.0)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    if not (shutil.which("wrk") and shutil.which("nginx")):
        print("needs wrk and nginx (Debian packages wrk, nginx-light)")
        return 1
    n = args.workers
    setups = {"1 worker": lambda: opserve(1), f"{n} workers": lambda: opserve(n),
              f"{n} replicas + nginx": lambda: behind_nginx(n)}  # fmt: skip
    results: dict[str, list[float]] = {name: [] for name in setups}
    for _ in range(args.rounds):  # interleaved: a busy moment of the machine hits every setup
        for name, setup in setups.items():
            with setup() as port:
                run_wrk(port, 2.0, 16, 0)  # warm-up
                results[name].append(run_wrk(port, args.duration, 16, 0).rps)
    print(f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.2f}, wrk -t1 -c16,"
          f" {args.duration:.0f} s x {args.rounds} rounds, medians")  # fmt: skip
    base = statistics.median(results["1 worker"])
    for name, values in results.items():
        rps = statistics.median(values)
        print(f"{name:22} {rps:9.0f} req/s  {rps / base:5.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
