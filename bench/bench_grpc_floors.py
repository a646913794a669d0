"""What gRPC itself costs per unary call in Python: grpcio's asyncio server (the one the
service's gRPC door runs on, `bench/floor_grpc_app.py`) against grpcio's synchronous server
(a thread pool), each parsing the bench's ModelInfer request and answering fixed bytes, loaded
in turn by bench_http's gRPC client (16 calls at once on one channel); CPU per call from the
server's /proc times, the floors alternated over `--rounds`.

    python bench/bench_grpc_floors.py --rounds 2 --duration 4

Why: issue 14 asks that a gRPC call cost no more than a V2 HTTP request; this shows what the
cheapest server grpcio offers costs before any work (docs/v2.md, "How fast").
"""

import argparse
import os
import statistics
import subprocess
import sys
import time
from concurrent import futures
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.bench_http import UVICORN_FLAGS, _cpu_seconds, free_port, run_grpc, start_server  # noqa: E402


def serve_sync(port: int, threads: int) -> None:
    """grpcio's synchronous server with the floor's ModelInfer handler, until killed."""
    import grpc
    from tritonclient.grpc import service_pb2 as pb

    from bench.floor_grpc_app import RESPONSE

    def answer(request: bytes, context: object) -> bytes:
        pb.ModelInferRequest.FromString(request)
        return RESPONSE

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=threads))
    server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler(
        "inference.GRPCInferenceService",
        {"ModelInfer": grpc.unary_unary_rpc_method_handler(answer)})])  # fmt: skip
    server.add_insecure_port(f"127.0.0.1:{port}")
    server.start()
    server.wait_for_termination()


def _start(kind: str, port: int, core: int, threads: int) -> subprocess.Popen[bytes]:
    if kind == "aio":
        return start_server("bench.floor_grpc_app:app", free_port(), core, UVICORN_FLAGS,
                            {"OPSERVE_GRPC_PORT": str(port)}, check=False)  # fmt: skip
    command = ["taskset", "-c", str(core), sys.executable, __file__, "--serve-sync", str(port),
               "--threads", str(threads)]  # fmt: skip
    server = subprocess.Popen(command, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    time.sleep(1.5)  # listening by then (the load's warm-up fails loudly otherwise)
    return server


def measure(kind: str, args: argparse.Namespace) -> tuple[float, float]:
    """(calls/s, CPU us per call) of one floor."""
    port = free_port()
    server = _start(kind, port, args.server_core, args.threads)
    try:
        run_grpc(port, 1.0, args.connections, args.client_core)  # warm-up
        before = _cpu_seconds(server.pid)
        result = run_grpc(port, args.duration, args.connections, args.client_core)
        used = _cpu_seconds(server.pid) - before
        if result.errors:
            raise RuntimeError(f"{kind}: {result.errors} calls failed")
        return result.rps, used / (result.rps * args.duration) * 1e6
    finally:
        server.terminate()
        server.wait(timeout=10)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=float, default=4.0)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--connections", type=int, default=16)
    parser.add_argument("--threads", type=int, default=4, help="the sync server's pool")
    parser.add_argument("--server-core", type=int, default=1)
    parser.add_argument("--client-core", type=int, default=0)
    parser.add_argument("--serve-sync", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_sync:
        serve_sync(args.serve_sync, args.threads)
        return
    found: dict[str, list[tuple[float, float]]] = {"aio": [], "sync": []}
    for _ in range(args.rounds):
        for kind in found:
            found[kind].append(measure(kind, args))
    for kind, runs in found.items():
        rps = statistics.median(r for r, _ in runs)
        cpu = statistics.median(c for _, c in runs)
        print(f"grpc {kind:5s} floor: {rps:8.0f} calls/s, {cpu:6.1f} us of CPU per call "
              f"(rounds: {', '.join(f'{c:.1f}' for _, c in runs)})")  # fmt: skip


if __name__ == "__main__":
    main()
