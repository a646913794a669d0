"""Memory of concurrent large and compressed gRPC messages: the server's peak RSS over idle
against its memory budget, the statuses, a small call's slowest latency meanwhile, and the RSS
left a few seconds after (the gRPC sibling of bench_memory.py).

    python bench/bench_grpc_memory.py [--budget-mib 512] [--calls 16] [--mib 40]

The service (python -m service, one worker) gets, all at once, --calls ModelInfer calls whose
raw_input_contents hold --mib MiB (Shape/25: the answer is tiny, so what the server holds is
the request's), then the same number of gzip calls that inflate to 1.5 x --mib MiB of zeros,
then the same number of ModelStreamInfer streams with one large message each. Its RSS is
sampled every 50 ms, and a small Tile call is timed from another connection every 50 ms. The
target: peak over idle within the budget plus a fixed margin (two messages of
OPSERVE_MAX_REQUEST_BYTES, the free reads), and RSS back near idle after.
"""

import argparse
import os
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import grpc
import numpy as np
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc

ROOT = Path(__file__).resolve().parents[1]
MiB = 1024 * 1024
SERVICE = "/inference.GRPCInferenceService"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise LookupError("VmRSS")


def shape_request(data: bytes) -> pb.ModelInferRequest:
    request = pb.ModelInferRequest(model_name="Shape", model_version="25")
    request.inputs.add(name="data", datatype="UINT8", shape=[len(data)])
    request.raw_input_contents.append(data)
    return request


def tile_request() -> pb.ModelInferRequest:
    request = pb.ModelInferRequest(model_name="Tile", model_version="13")
    request.inputs.add(name="input", datatype="FP32", shape=[2, 3])
    request.inputs.add(name="repeats", datatype="INT64", shape=[2])
    request.raw_input_contents.extend([np.ones(6, np.float32).tobytes(),
                                       np.array([2, 1], np.int64).tobytes()])  # fmt: skip
    return request


def channel(target: str) -> grpc.Channel:
    """A channel on a connection of its own; its stubs send serialized messages (bytes) as
    they are, so that the client's serialization does not pace the calls."""
    return grpc.insecure_channel(target, options=[("grpc.use_local_subchannel_pool", 1),
                                                  ("grpc.max_send_message_length", -1)])  # fmt: skip


def unary(target: str, data: bytes, calls: int,
          compression: grpc.Compression | None) -> list[str]:  # fmt: skip
    """The statuses of `calls` concurrent ModelInfer calls, each from a client and connection
    of its own, all sent at once."""

    def call(chan: grpc.Channel) -> str:
        infer = chan.unary_unary(f"{SERVICE}/ModelInfer")  # bytes in and out
        try:
            infer(data, timeout=60, compression=compression)
        except grpc.RpcError as exc:
            return _status(exc)
        return "OK"

    return _at_once(target, calls, call)


def streams(target: str, data: bytes, calls: int) -> list[str]:
    """The answers' statuses of `calls` concurrent streams of one message each, each from a
    client and connection of its own."""

    def call(chan: grpc.Channel) -> str:
        infer = chan.stream_stream(f"{SERVICE}/ModelStreamInfer")  # bytes in and out
        try:
            answers = list(infer(iter([data]), timeout=60))
        except grpc.RpcError as exc:
            return _status(exc)
        if not answers:
            return "none"
        message = pb.ModelStreamInferResponse.FromString(answers[0]).error_message
        return message[:60] or "OK"

    return _at_once(target, calls, call)


def _at_once(target: str, calls: int, call: Callable[[grpc.Channel], str]) -> list[str]:
    """`call` on `calls` connections, from threads started together."""
    channels = [channel(target) for _ in range(calls)]
    for chan in channels:
        grpc.channel_ready_future(chan).result(timeout=10)
    found: list[str] = []
    threads = [threading.Thread(target=lambda c=chan: found.append(call(c))) for chan in channels]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for chan in channels:
        chan.close()
    return found


def _status(error: BaseException | None) -> str:
    return "OK" if error is None else str(error.code().name)  # type: ignore[attr-defined]


def measure(pid: int, target: str, load: Callable[[], list[str]]) -> dict[str, object]:
    """Peak RSS and the slowest small call while `load` runs; RSS 3 s after."""
    peak, slowest, failed, stop = 0, 0.0, 0, threading.Event()

    def watch() -> None:
        nonlocal peak, slowest, failed
        with channel(target) as chan:
            stub = service_pb2_grpc.GRPCInferenceServiceStub(chan)
            small = tile_request()
            while not stop.is_set():
                peak = max(peak, rss(pid))
                started = time.perf_counter()
                try:
                    stub.ModelInfer(small, timeout=10)
                except grpc.RpcError:
                    failed += 1
                slowest = max(slowest, time.perf_counter() - started)
                stop.wait(0.05)

    idle = rss(pid)
    watcher = threading.Thread(target=watch)
    watcher.start()
    statuses = load()
    stop.set()
    watcher.join()
    time.sleep(3)
    return {"idle": idle, "peak": peak, "after": rss(pid), "statuses": Counter(statuses),
            "slowest": slowest, "small_failed": failed}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget-mib", type=int, default=512)
    parser.add_argument("--calls", type=int, default=16)
    parser.add_argument("--mib", type=int, default=40)
    args = parser.parse_args()
    port, grpc_port = free_port(), free_port()
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OPSERVE_HOST": "127.0.0.1",
           "OPSERVE_PORT": str(port), "OPSERVE_GRPC_PORT": str(grpc_port),
           "OPSERVE_LOG_LEVEL": "warning", "OPSERVE_ACCESS_LOG": "false",
           "OPSERVE_MEMORY_BUDGET_BYTES": str(args.budget_mib * MiB)}  # fmt: skip
    server = subprocess.Popen([sys.executable, "-m", "service"], cwd=ROOT, env=env)
    target = f"127.0.0.1:{grpc_port}"
    try:
        grpc.channel_ready_future(grpc.insecure_channel(target)).result(timeout=30)
        time.sleep(1)
        raw = shape_request(np.random.default_rng(0).bytes(args.mib * MiB)).SerializeToString()
        zeros = shape_request(bytes(args.mib * MiB * 3 // 2)).SerializeToString()
        cases = {
            f"{args.calls} x ModelInfer of {args.mib} MiB":
                lambda: unary(target, raw, args.calls, None),
            f"{args.calls} x gzip ModelInfer ({args.mib * 3 // 2} MiB inflated)":
                lambda: unary(target, zeros, args.calls, grpc.Compression.Gzip),
            f"{args.calls} x ModelStreamInfer of one {args.mib} MiB message":
                lambda: streams(target, raw, args.calls),
        }  # fmt: skip
        print(f"budget {args.budget_mib} MiB; peak and after are RSS over idle")
        for name, load in cases.items():
            found = measure(server.pid, target, load)
            idle = int(found["idle"])  # type: ignore[call-overload]
            print(f"{name}: peak +{(int(found['peak']) - idle) / MiB:.0f} MiB, "  # type: ignore[call-overload]
                  f"after +{(int(found['after']) - idle) / MiB:.0f} MiB (idle "  # type: ignore[call-overload]
                  f"{idle / MiB:.0f} MiB); {dict(found['statuses'])}; small call slowest "  # type: ignore[call-overload]
                  f"{found['slowest']:.2f} s, failed {found['small_failed']}")  # fmt: skip
    finally:
        server.terminate()
        server.wait(10)


if __name__ == "__main__":
    main()
