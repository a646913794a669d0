"""KServe V2 throughput against a raw-ASGI floor answering the same bytes, in the same run.

    python bench/bench_v2.py [--reps 7] [--duration 8] [--rounds 3] [--connections 16]

1. Large: one inference producing a 16 MiB float32 output (Tile-13 of a 64x64 random float32
   tensor by [32, 32] -> 2048x2048), answered through V2 JSON, through the binary tensor data
   extension and through the v1 `tensor_proto` form. Each is timed over --reps sequential
   requests on one keep-alive connection (median), as MB/s of tensor data (16 MiB / time) and
   as a ratio to the floor answering the same response bytes.
2. Small: the Tile-13 2x3 request of bench_http.py on V2 JSON
   (`POST /v2/models/Tile/versions/13/infer`) under wrk, against the floor's requests/s.

The service and the floor (bench/floor_v2_app.py) run under the uvicorn settings of
bench_http.py, pinned to --server-core; the client runs on --client-core. The floor answers
the bytes the service answered, recorded at the start of the run.
"""

import argparse
import http.client
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.bench_http import (
    UVICORN_FLAGS,
    Result,
    free_port,
    run_asyncio,
    run_wrk,
    start_server,
)  # fmt: skip

MIB = 1024 * 1024
TARGET_SMALL_RATIO = 0.25
SMALL_PATH = "/v2/models/Tile/versions/13/infer"
SMALL = json.dumps({"inputs": [
    {"name": "input", "shape": [2, 3], "datatype": "FP32", "data": [1, 2, 3, 4, 5, 6]},
    {"name": "repeats", "shape": [2], "datatype": "INT64", "data": [2, 2]},
]}).encode()  # fmt: skip

_X = np.random.default_rng(0).random((64, 64), dtype=np.float32)
_V2_INPUTS = [{"name": "input", "shape": [64, 64], "datatype": "FP32", "data": _X.ravel().tolist()},
              {"name": "repeats", "shape": [2], "datatype": "INT64", "data": [32, 32]}]  # fmt: skip
LARGE: dict[str, tuple[str, bytes]] = {
    "v2-json": (SMALL_PATH, json.dumps({"inputs": _V2_INPUTS}).encode()),
    "v2-binary": (SMALL_PATH, json.dumps({"inputs": _V2_INPUTS,
                                          "parameters": {"binary_data_output": True}}).encode()),
    "v1-tensor_proto": ("/v1/ops/Tile/13", json.dumps({
        "inputs": {"input": {"dtype": "float", "shape": [64, 64], "data": _X.ravel().tolist()},
                   "repeats": {"dtype": "int64", "shape": [2], "data": [32, 32]}},
        "output_format": "tensor_proto"}).encode()),
}  # fmt: skip
OUTPUT_BYTES = 2048 * 2048 * 4
_KEPT = ("content-type", "inference-header-content-length")


def _post(conn: http.client.HTTPConnection, path: str, body: bytes) -> tuple[dict, bytes]:
    conn.request("POST", path, body, {"Content-Type": "application/json"})
    answer = conn.getresponse()
    content = answer.read()
    if answer.status != 200:
        raise RuntimeError(f"{path}: {answer.status} {content[:200]!r}")
    return {k: v for k, v in answer.getheaders() if k.lower() in _KEPT}, content


def record(port: int, folder: Path) -> None:
    """Save the service's answers for the floor to replay."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    for name, (path, body) in {"small": (SMALL_PATH, SMALL), **LARGE}.items():
        headers, content = _post(conn, path, body)
        (folder / f"{name}.body").write_bytes(content)
        (folder / f"{name}.json").write_text(json.dumps({k.lower(): v for k, v in headers.items()}))
    conn.close()


def time_large(port: int, name: str, reps: int, floor: bool) -> float:
    """Median seconds of one large request (after one warm-up)."""
    path, body = LARGE[name]
    path = f"/floor/{name}" if floor else path
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    times = []
    for _ in range(reps + 1):
        start = time.perf_counter()
        _post(conn, path, body)
        times.append(time.perf_counter() - start)
    conn.close()
    return statistics.median(times[1:])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("--duration", type=float, default=8.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--connections", type=int, default=16)
    parser.add_argument("--server-core", type=int, default=1)
    parser.add_argument("--client-core", type=int, default=0)
    parser.add_argument("--asyncio", action="store_true", help="use the asyncio client, not wrk")
    args = parser.parse_args()
    os.sched_setaffinity(0, {args.client_core})
    folder = Path(tempfile.mkdtemp(prefix="opserve-bench-v2-"))
    env = {"OPSERVE_ACCESS_LOG": "true"}
    service_port, floor_port = free_port(), free_port()
    service = start_server("service.main:app", service_port, args.server_core, UVICORN_FLAGS, env,
                           check=False)  # fmt: skip
    floor = None
    try:
        record(service_port, folder)
        floor = start_server("bench.floor_v2_app:app", floor_port, args.server_core, UVICORN_FLAGS,
                             {"OPSERVE_BENCH_FLOOR_DIR": str(folder)}, check=False)  # fmt: skip
        print(f"{os.cpu_count()} cores, Python {sys.version.split()[0]}, load average "
              f"{os.getloadavg()[0]:.2f}; servers on core {args.server_core}, client on core "
              f"{args.client_core}; uvicorn {' '.join(UVICORN_FLAGS)}")  # fmt: skip
        print(f"\n16 MiB float32 output (Tile-13 64x64 -> 2048x2048), median of {args.reps}:")
        print(
            f"{'form':16} {'bytes':>10} {'service ms':>11} {'MB/s':>7} {'floor ms':>9} {'ratio':>6}"
        )
        for name in LARGE:
            size = (folder / f"{name}.body").stat().st_size
            served = time_large(service_port, name, args.reps, floor=False)
            floor_s = time_large(floor_port, name, args.reps, floor=True)
            print(f"{name:16} {size:10d} {served * 1e3:11.1f} {OUTPUT_BYTES / MIB / served:7.0f}"
                  f" {floor_s * 1e3:9.1f} {floor_s / served:6.2f}")  # fmt: skip
        return _small(args, service_port, floor_port)
    finally:
        for server in (service, floor):
            if server is not None:
                server.terminate()
                server.wait(timeout=10)
        shutil.rmtree(folder, ignore_errors=True)


def _small(args: argparse.Namespace, service_port: int, floor_port: int) -> int:
    load = run_wrk if shutil.which("wrk") and not args.asyncio else run_asyncio
    print(f"\nsmall Tile-13 on V2 JSON ({len(SMALL)}-byte body), {args.connections} connections, "
          f"{args.duration:.0f} s per run after a 2 s warm-up, {args.rounds} rounds:")  # fmt: skip
    print(f"{'':16} {'req/s':>9} {'p50 ms':>8} {'p99 ms':>8} {'errors':>7}")
    floors, services = [], []
    for _ in range(args.rounds):
        for port, path, kept in ((floor_port, "/floor/small", floors),
                                 (service_port, SMALL_PATH, services)):  # fmt: skip
            load(port, 2.0, args.connections, args.client_core, path, SMALL)
            kept.append(load(port, args.duration, args.connections, args.client_core, path, SMALL))
    floor, service = (Result(*(statistics.median(getattr(r, f) for r in runs)
                               for f in ("rps", "p50_ms", "p99_ms")),
                             sum(r.errors for r in runs)) for runs in (floors, services))  # fmt: skip
    for name, r in (("floor median", floor), ("service median", service)):
        print(f"{name:16} {r.rps:9.0f} {r.p50_ms:8.2f} {r.p99_ms:8.2f} {r.errors:7d}")
    ratio = service.rps / floor.rps
    ok = ratio >= TARGET_SMALL_RATIO and service.errors == 0
    print(f"ratio {ratio:.2f}: target >= {TARGET_SMALL_RATIO} {'met' if ok else 'MISSED'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
