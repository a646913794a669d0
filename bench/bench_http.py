"""Requests per second and latency of the small Tile-13 request over HTTP, v1 and V2, and over
gRPC, each against its floor, and optionally against the service at another git revision, all
in one run.

    python bench/bench_http.py [--duration 10] [--connections 16] [--baseline REV]

The request: Tile-13 of a 2x3 float32 tensor by repeats [2, 2], as `POST /v1/ops/Tile/13` (v1),
as `POST /v2/models/Tile/versions/13/infer` (V2 JSON), and as a gRPC ModelInfer call with raw
contents (grpc). `--baseline REV` checks REV out into a temporary git worktree and measures its
service too, in the same rounds ("before" and "after" on the same machine at the same time);
`--lanes v1`, `--lanes v2` or `--lanes grpc` measures those lanes only; `v2-binary` is the V2
call as tritonclient.http sends it by default (binary inputs and outputs, Triton's binary
tensor data extension).

The gRPC lane has a floor of its own (bench/floor_grpc_app.py: a raw grpc.aio server on
uvicorn's loop, as the service's, that parses the request and answers the service's very
bytes) and its own load client: `connections` concurrent calls on one grpc.aio channel from
this process (pinned to the client core), each sending the serialized request and checking the
answer's bytes. Its rows' "ratio" and "by cpu" are to the gRPC floor; "to V2" compares its CPU
per request with V2 HTTP's, the bar of issue 14 (no more than V2 HTTP's). A unary call's
comparison is printed but not judged when the unary floor alone, grpc.aio doing nothing but
parse the request, costs more than V2 HTTP's whole request: no code of the service's could
then meet it.

The floor (bench/floor_app.py: a raw ASGI app that reads the body, parses it with orjson and
answers fixed bytes) and the service run in turn under the same uvicorn settings: uvloop,
httptools, one worker, uvicorn's access log off, the server pinned to one core. The service
keeps its own access log (JSON lines, its default OPSERVE_ACCESS_LOG=true, to /dev/null),
request ids and Prometheus metrics on (totals shared through OPSERVE_METRICS_DIR as under
`opserve`). The load comes from wrk (Debian package `wrk`), pinned to another core, with a Lua
script for the POST body; without wrk, from an asyncio client in this process (pinned the same
way; it saturates sooner, so figures are lower).
Each run is preceded by a 2 s warm-up; floor and service alternate for --rounds rounds and the
medians are compared (the machine may be shared: the floor's own p99 shows its noise). The
server's CPU time per request ("cpu us", from /proc) and the ratio it gives ("by cpu": floor's
over the service's) stay meaningful when other processes take the core's time. The "best"
rows give each target's round of least CPU per request: on a VM whose neighbours take cache
and cycles unevenly, a median of a few rounds follows them, the least follows the code.
Targets (HTTP lanes): at least 0.30x the floor's requests/s, and a p99 under 4 ms, at 16 connections.

With 16 connections a request waits for the 15 before it, so its latency is about 16 times the
time per request, and the p99 adds whatever the machine's own pauses are at that pace. `--twin`
tells the two apart: after each HTTP lane it measures a raw app burning that lane's CPU per
request of the round (bench/floor_twin_app.py), and prints both p99s. On a slow VM the 4 ms bar
asks for a speed per request, not just a tight tail.
"""

import argparse
import asyncio
import dataclasses
import json
import os
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import numpy as np
from tritonclient.grpc import service_pb2 as pb

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # bench.floor_grpc_app, whatever the directory it is run from
PATH = "/v1/ops/Tile/13"
BODY = json.dumps({
    "inputs": {"input": {"dtype": "float", "shape": [2, 3], "data": [1, 2, 3, 4, 5, 6]},
               "repeats": {"dtype": "int64", "shape": [2], "data": [2, 2]}},
}).encode()  # fmt: skip
V2_PATH = "/v2/models/Tile/versions/13/infer"
V2_BODY = json.dumps({"inputs": [
    {"name": "input", "shape": [2, 3], "datatype": "FP32", "data": [1, 2, 3, 4, 5, 6]},
    {"name": "repeats", "shape": [2], "datatype": "INT64", "data": [2, 2]},
]}).encode()  # fmt: skip
V2_BINARY_HEAD = json.dumps({"inputs": [
    {"name": "input", "shape": [2, 3], "datatype": "FP32", "parameters": {"binary_data_size": 24}},
    {"name": "repeats", "shape": [2], "datatype": "INT64", "parameters": {"binary_data_size": 16}},
], "parameters": {"binary_data_output": True}}, separators=(",", ":")).encode()  # fmt: skip
V2_BINARY_BODY = (V2_BINARY_HEAD + np.arange(1, 7, dtype=np.float32).tobytes()
                  + np.array([2, 2], dtype=np.int64).tobytes())  # fmt: skip
"""The same call as tritonclient.http sends it by default: binary inputs, binary outputs."""
JSON_HEADERS = {"Content-Type": "application/json"}
HEADERS = {
    V2_BINARY_BODY: {
        "Content-Type": "application/octet-stream",
        "Inference-Header-Content-Length": str(len(V2_BINARY_HEAD)),
    }
}
"""The HTTP headers a body is sent with (JSON_HEADERS unless named here)."""
GRPC_METHOD = "/inference.GRPCInferenceService/ModelInfer"
GRPC_REQUEST = pb.ModelInferRequest(
    model_name="Tile", model_version="13",
    inputs=[pb.ModelInferRequest.InferInputTensor(name="input", datatype="FP32", shape=[2, 3]),
            pb.ModelInferRequest.InferInputTensor(name="repeats", datatype="INT64", shape=[2])],
    raw_input_contents=[np.arange(1, 7, dtype=np.float32).tobytes(),
                        np.array([2, 2], dtype=np.int64).tobytes()],
).SerializeToString()  # fmt: skip
GRPC_STREAM = "/inference.GRPCInferenceService/ModelStreamInfer"
LANES = {"v1": (PATH, BODY), "v2": (V2_PATH, V2_BODY), "v2-binary": (V2_PATH, V2_BINARY_BODY),
         "grpc": (GRPC_METHOD, GRPC_REQUEST), "grpc-stream": (GRPC_STREAM, GRPC_REQUEST)}  # fmt: skip
FLOORS = {"v1": "floor", "v2": "floor", "v2-binary": "floor", "grpc": "grpc floor",
          "grpc-stream": "stream floor"}  # fmt: skip
"""The floor each lane's ratios are to."""
TARGET_RATIO = 0.30  # issue 15: v1 and V2 at 0.30x the floor, telemetry on
TARGET_P99_MS = 4.0
HTTP_LANES = ("v1", "v2", "v2-binary")
"""The lanes held to TARGET_RATIO and TARGET_P99_MS; the gRPC lanes are held to V2's CPU per
request instead (issue 14), the unary one not at all when its floor alone costs more."""
# uvicorn's own access log stays off for both: the service writes its own (OPSERVE_ACCESS_LOG,
# on by default, service/telemetry/access_log.py), and the floor is the floor.
UVICORN_FLAGS = ["--loop", "uvloop", "--http", "httptools", "--workers", "1", "--log-level", "info",
                 "--no-access-log"]  # fmt: skip


@dataclass(frozen=True)
class Result:
    rps: float
    p50_ms: float
    p99_ms: float
    errors: int
    cpu_us: float = 0.0  # the server's CPU time per request: steady even on a busy machine


def _summary(latencies: list[float], elapsed: float, errors: int) -> Result:
    """Requests per second, p50 and p99 (ms) of a load client's run."""
    latencies.sort()
    pick = lambda q: latencies[min(len(latencies) - 1, int(q * len(latencies)))] * 1e3  # noqa: E731
    return Result(len(latencies) / elapsed, pick(0.50), pick(0.99), errors)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def start_server(app: str, port: int, core: int | None, flags: list[str], env: dict[str, str],
                 check: bool = True, root: Path = ROOT) -> subprocess.Popen[bytes]:  # fmt: skip
    """uvicorn serving `app` from the tree `root`, pinned to `core` (None: on any core, as the
    server it is measured against); `check` also runs the bench request once."""
    command = [sys.executable, "-m", "uvicorn", app, "--host", "127.0.0.1", "--port", str(port),
               *flags]  # fmt: skip
    if core is not None:
        command = ["taskset", "-c", str(core), *command]
    env = {**os.environ, "PYTHONPATH": str(root), **env}
    server = subprocess.Popen(command, cwd=root, env=env, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)  # fmt: skip
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            return _check(server, port) if check else _listening(server, port)
        except OSError:
            time.sleep(0.1)
    server.kill()
    raise TimeoutError(f"{app} did not start on port {port}")


def _listening(server: subprocess.Popen[bytes], port: int) -> subprocess.Popen[bytes]:
    if server.poll() is not None:
        raise RuntimeError(f"the server exited with {server.returncode}")
    socket.create_connection(("127.0.0.1", port), timeout=1).close()
    return server


def _check(server: subprocess.Popen[bytes], port: int) -> subprocess.Popen[bytes]:
    """Real requests: the server is up and answers each lane's bench request with a 200."""
    if server.poll() is not None:
        raise RuntimeError(f"the server exited with {server.returncode}")
    for path, body in (LANES["v1"], LANES["v2"]):
        request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=body,
                                         headers={"content-type": "application/json"})  # fmt: skip
        with urllib.request.urlopen(request, timeout=2) as answer:
            assert answer.status == 200, answer.status
            outputs = json.load(answer)["outputs"]
            output = outputs["output"] if isinstance(outputs, dict) else outputs[0]
            assert output["shape"] == [4, 6], output
    return server


WRK_SCRIPT = """wrk.method = "POST"
wrk.body = "{body}"
{headers}
"""


def _lua_string(body: bytes) -> str:
    """`body` as the inside of a Lua string literal: every byte a decimal escape (binary safe)."""
    return "".join(f"\\{byte:03d}" for byte in body)


_UNITS = {"us": 1e-3, "ms": 1.0, "s": 1e3}


def run_wrk(
    port: int, seconds: float, connections: int, core: int, path: str = PATH, body: bytes = BODY
) -> Result:
    with tempfile.NamedTemporaryFile("w", suffix=".lua", delete=False) as script:
        headers = "\n".join(f'wrk.headers["{name}"] = "{value}"'
                            for name, value in HEADERS.get(body, JSON_HEADERS).items())  # fmt: skip
        script.write(WRK_SCRIPT.format(body=_lua_string(body), headers=headers))
    command = ["taskset", "-c", str(core), "wrk", "-t1", f"-c{connections}",
               f"-d{max(1, round(seconds))}s", "--latency", "-s", script.name,
               f"http://127.0.0.1:{port}{path}"]  # fmt: skip
    try:
        out = subprocess.run(command, capture_output=True, text=True, check=True).stdout
    finally:
        os.unlink(script.name)
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))  # type: ignore[union-attr]
    latency = {pct: float(v) * _UNITS[unit]
               for pct, v, unit in re.findall(r"\s(50|99)%\s+([\d.]+)(us|ms|s)\b", out)}  # fmt: skip
    non_2xx = re.search(r"Non-2xx or 3xx responses:\s+(\d+)", out)
    socket_errors = re.search(r"Socket errors:.*", out)
    errors = int(non_2xx.group(1)) if non_2xx else 0
    if socket_errors:
        errors += sum(int(n) for n in re.findall(r"\d+", socket_errors.group(0)))
    return Result(rps, latency["50"], latency["99"], errors)


async def _client(port: int, until: float, latencies: list[float], errors: list[int],
                  path: str, body: bytes) -> None:  # fmt: skip
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    headers = "".join(f"{k}: {v}\r\n" for k, v in HEADERS.get(body, JSON_HEADERS).items())
    request = (f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n{headers}"
               f"Content-Length: {len(body)}\r\n\r\n").encode() + body  # fmt: skip
    while time.perf_counter() < until:
        started = time.perf_counter()
        writer.write(request)
        head = await reader.readuntil(b"\r\n\r\n")
        length = int(re.search(rb"content-length: (\d+)", head, re.I).group(1))  # type: ignore[union-attr]
        await reader.readexactly(length)
        latencies.append(time.perf_counter() - started)
        if not head.startswith(b"HTTP/1.1 200"):
            errors.append(1)
    writer.close()


def run_asyncio(
    port: int, seconds: float, connections: int, core: int, path: str = PATH, body: bytes = BODY
) -> Result:
    """The fallback load: `connections` keep-alive clients in one event loop on `core`."""
    os.sched_setaffinity(0, {core})
    latencies: list[float] = []
    errors: list[int] = []

    async def main() -> float:
        started = time.perf_counter()
        until = started + seconds
        await asyncio.gather(*(_client(port, until, latencies, errors, path, body)
                               for _ in range(connections)))  # fmt: skip
        return time.perf_counter() - started

    return _summary(latencies, asyncio.run(main()), len(errors))


def run_grpc(port: int, seconds: float, connections: int, core: int, path: str = GRPC_METHOD,
             body: bytes = GRPC_REQUEST) -> Result:  # fmt: skip
    """The gRPC load: `connections` concurrent calls on one grpc.aio channel, from `core`; an
    answer other than the floor's bytes counts as an error."""
    from bench.floor_grpc_app import RESPONSE

    RAW = pb.ModelInferResponse.FromString(RESPONSE).raw_output_contents[0]

    os.sched_setaffinity(0, {core})
    latencies: list[float] = []
    errors: list[int] = []

    async def worker(call: Any, until: float) -> None:
        while time.perf_counter() < until:
            started = time.perf_counter()
            try:
                if await call(body, timeout=10) != RESPONSE:
                    errors.append(1)
            except grpc.RpcError:
                errors.append(1)
            latencies.append(time.perf_counter() - started)

    async def streamer(call: Any, until: float) -> None:
        """One stream, one request at a time on it (as a unary worker)."""
        stream = call()
        while time.perf_counter() < until:
            started = time.perf_counter()
            await stream.write(body)
            answer = pb.ModelStreamInferResponse.FromString(await stream.read())
            if answer.error_message or answer.infer_response.raw_output_contents[0] != RAW:
                errors.append(1)
            latencies.append(time.perf_counter() - started)
        await stream.done_writing()

    async def main() -> float:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            streams = path == GRPC_STREAM
            call = (channel.stream_stream if streams else channel.unary_unary)(path)  # bytes
            started = time.perf_counter()
            await asyncio.gather(*((streamer if streams else worker)(call, started + seconds)
                                   for _ in range(connections)))  # fmt: skip
            return time.perf_counter() - started

    return _summary(latencies, asyncio.run(main()), len(errors))


@dataclass(frozen=True)
class Target:
    """One thing measured: a server (a floor, or the service from a tree), a lane, and the
    floor its ratios are to."""

    name: str
    app: str
    path: str
    body: bytes
    root: Path = ROOT
    floor: str = "floor"
    twin_of: str | None = None  # a floor_twin_app burning this target's CPU per request

    @property
    def grpc(self) -> bool:
        return self.path in (GRPC_METHOD, GRPC_STREAM)


def measure(target: Target, args: argparse.Namespace, spin_us: float = 0.0) -> Result:
    port, grpc_port = free_port(), free_port()
    access_log = "false" if args.no_access_log else "true"
    metrics = tempfile.mkdtemp(prefix="bench-metrics-")
    env = {"OPSERVE_ACCESS_LOG": access_log, "OPSERVE_METRICS_DIR": metrics,
           "OPSERVE_GRPC_PORT": str(grpc_port if target.grpc else 0),
           "BENCH_SPIN_US": f"{spin_us:.1f}"}  # fmt: skip
    server = start_server(target.app, port, args.server_core, UVICORN_FLAGS, env,
                          check=not target.grpc, root=target.root)  # fmt: skip
    load = run_wrk if shutil.which("wrk") and not args.asyncio else run_asyncio
    if target.grpc:
        load, port = run_grpc, grpc_port
    try:
        load(port, 2.0, args.connections, args.client_core, target.path, target.body)  # warm-up
        before = _cpu_seconds(server.pid)
        result = load(port, args.duration, args.connections, args.client_core, target.path,
                      target.body)  # fmt: skip
        used = _cpu_seconds(server.pid) - before
        return dataclasses.replace(result, cpu_us=used / (result.rps * args.duration) * 1e6)
    finally:
        server.terminate()
        server.wait(timeout=10)
        shutil.rmtree(metrics, ignore_errors=True)


@contextmanager
def worktree(revision: str | None) -> Iterator[Path | None]:
    """A temporary git worktree of `revision` (None: nothing), removed afterwards."""
    if revision is None:
        yield None
        return
    folder = Path(tempfile.mkdtemp(prefix="opserve-baseline-"))
    subprocess.run(["git", "worktree", "add", "--detach", str(folder), revision], cwd=ROOT,
                   check=True, capture_output=True)  # fmt: skip
    try:
        yield folder
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", str(folder)], cwd=ROOT,
                       check=False, capture_output=True)  # fmt: skip
        shutil.rmtree(folder, ignore_errors=True)


def targets(lanes: list[str], baseline: Path | None, revision: str | None,
            twins: bool = False) -> list[Target]:  # fmt: skip
    """The floor, then each lane of the service (with `twins`, each HTTP lane followed by its
    twin), then each lane of the baseline's service."""
    found = [Target("floor", "bench.floor_app:app", PATH, BODY)]
    for lane, method in (("grpc", GRPC_METHOD), ("grpc-stream", GRPC_STREAM)):
        if lane in lanes:  # the gRPC floors' ratios are to themselves
            found.append(Target(FLOORS[lane], "bench.floor_grpc_app:app", method, GRPC_REQUEST,
                                floor=FLOORS[lane]))  # fmt: skip
    for lane in lanes:
        path, body = LANES[lane]
        found.append(Target(f"{lane}", "service.main:app", path, body, floor=FLOORS[lane]))
        if twins and not lane.startswith("grpc"):
            found.append(Target(f"twin of {lane}", "bench.floor_twin_app:app", PATH, BODY,
                                twin_of=lane))  # fmt: skip
    if baseline is not None:
        for lane in lanes:
            if lane.startswith("grpc") and not (baseline / "service/grpc").is_dir():
                continue  # a tree from before the gRPC door
            path, body = LANES[lane]
            found.append(Target(f"{lane}@{revision}"[:14], "service.main:app", path, body,
                                baseline, FLOORS[lane]))  # fmt: skip
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=float, default=10.0, help="seconds per measured run")
    parser.add_argument("--connections", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=3, help="rounds of every target; medians")
    parser.add_argument("--server-core", type=int, default=1)
    parser.add_argument("--client-core", type=int, default=0)
    parser.add_argument("--lanes", default="v1,v2,grpc,grpc-stream",
                        help="comma-separated: v1, v2, grpc, grpc-stream")  # fmt: skip
    parser.add_argument("--baseline", metavar="REV", help="also measure the service at REV")
    parser.add_argument("--asyncio", action="store_true", help="use the asyncio client, not wrk")
    parser.add_argument("--twin", action="store_true",
                        help="after each HTTP lane, a raw app burning its CPU per request "
                             "(bench/floor_twin_app.py): the machine's p99 at that pace")  # fmt: skip
    parser.add_argument("--no-access-log", action="store_true",
                        help="turn the service's own access log off (OPSERVE_ACCESS_LOG=false)")  # fmt: skip
    args = parser.parse_args()
    lanes = [lane.strip() for lane in args.lanes.split(",") if lane.strip()]
    client = "wrk -t1" if shutil.which("wrk") and not args.asyncio else "asyncio client"
    log = (
        "off" if args.no_access_log else "on (JSON, the default, written by the app), to /dev/null"
    )
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                          text=True).stdout.strip()  # fmt: skip
    print(f"Tile-13, 2x3 float32, repeats [2, 2]: v1 {PATH} ({len(BODY)}-byte body), "
          f"V2 {V2_PATH} ({len(V2_BODY)} bytes), gRPC ModelInfer ({len(GRPC_REQUEST)} bytes);"
          f" tree at {head or '?'}"
          + (f", baseline {args.baseline}" if args.baseline else ""))  # fmt: skip
    print(f"uvicorn {' '.join(UVICORN_FLAGS)}; service access log {log};"
          f" server on core {args.server_core}, {client} on core {args.client_core},"
          f" {args.connections} connections, {args.duration:.0f} s after 2 s warm-up,"
          f" {args.rounds} rounds; {os.cpu_count()} cores, Python {sys.version.split()[0]},"
          f" load average {os.getloadavg()[0]:.2f}")  # fmt: skip
    print(f"{'':22} {'req/s':>9} {'p50 ms':>8} {'p99 ms':>8} {'errors':>7} {'ratio':>6}"
          f" {'cpu us':>7} {'by cpu':>6}")  # fmt: skip
    with worktree(args.baseline) as baseline:
        measured = targets(lanes, baseline, args.baseline, args.twin)
        runs: dict[str, list[Result]] = {t.name: [] for t in measured}
        for number in range(1, args.rounds + 1):
            for target in measured:
                spin = 0.0
                if target.twin_of is not None:  # the lane's CPU of this round, less the floor's
                    spin = max(runs[target.twin_of][-1].cpu_us - runs["floor"][-1].cpu_us, 0)
                runs[target.name].append(measure(target, args, spin))
                _row(f"{target.name} #{number}", runs[target.name][-1],
                     runs[target.floor][-1])  # fmt: skip
    medians = {name: _median(results) for name, results in runs.items()}
    http_ok = stream_ok = True  # issue 15's bar (the HTTP lanes), issue 14's (gRPC)
    for target in measured:
        median, floor = medians[target.name], medians[target.floor]
        _row(f"{target.name} median", median, floor)
        if target.name in HTTP_LANES:  # this tree's, not a baseline's or a twin's
            http_ok &= (median.rps / floor.rps >= TARGET_RATIO
                        and median.p99_ms < TARGET_P99_MS and median.errors == 0)  # fmt: skip
    # The least disturbed round of each: on a VM shared with other jobs, the same tree ran
    # at 92 to 164 us per request from one server process to the next, and a median of 2 or
    # 3 rounds follows that noise; the least CPU per request follows the code.
    best = {name: min(results, key=lambda r: r.cpu_us) for name, results in runs.items()}
    for target in measured:
        _row(f"{target.name} best"[:22], best[target.name], best[target.floor])
    for lane in ("grpc", "grpc-stream"):  # issue 14's bar: no more CPU per request than V2
        if lane in medians and "v2" in medians:
            cpu, v2_cpu = medians[lane].cpu_us, medians["v2"].cpu_us
            print(f"{lane} vs V2 HTTP, CPU per request: {cpu:.1f} us vs {v2_cpu:.1f} us"
                  f" ({v2_cpu / cpu:.2f}x); req/s {medians[lane].rps / medians['v2'].rps:.2f}x;"
                  f" least: {best[lane].cpu_us:.1f} us vs {best['v2'].cpu_us:.1f} us")  # fmt: skip
            floor = medians[FLOORS[lane]].cpu_us
            if lane == "grpc" and floor > v2_cpu:
                # grpcio's own cost per unary call, doing nothing, is over V2's whole request:
                # reported, not judged (docs/v2.md, gRPC, How fast)
                print(f"  not judged: the unary floor alone costs {floor:.1f} us a call")
            else:
                stream_ok &= cpu <= v2_cpu and medians[lane].errors == 0
    for target in measured:
        if target.twin_of is not None:
            lane, twin = medians[target.twin_of], medians[target.name]
            print(f"{target.twin_of} against a raw app burning its CPU per request: p99"
                  f" {lane.p99_ms:.2f} ms vs {twin.p99_ms:.2f} ms, p50 {lane.p50_ms:.2f} ms vs"
                  f" {twin.p50_ms:.2f} ms (the twin at {twin.cpu_us:.1f} us per request)")  # fmt: skip
    http = [lane for lane in lanes if lane in HTTP_LANES]
    if http:
        print(f"target for {', '.join(http)} of this tree: ratio >= {TARGET_RATIO} and p99 <"
              f" {TARGET_P99_MS} ms, no errors: {'met' if http_ok else 'MISSED'} (the floor's"
              f" p99 {medians['floor'].p99_ms:.2f} ms shows the machine's own noise)")  # fmt: skip
    if "grpc-stream" in lanes and "v2" in medians:
        print(f"target for grpc-stream: no more CPU per request than V2 HTTP, no errors:"
              f" {'met' if stream_ok else 'MISSED'}")  # fmt: skip
    return 0 if http_ok and stream_ok else 1


def _cpu_seconds(pid: int) -> float:
    """User and system CPU time of a process so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _row(name: str, r: Result, floor: Result) -> None:
    print(f"{name:22} {r.rps:9.0f} {r.p50_ms:8.2f} {r.p99_ms:8.2f} {r.errors:7d}"
          f" {r.rps / floor.rps:6.2f} {r.cpu_us:7.1f} {floor.cpu_us / r.cpu_us:6.2f}")  # fmt: skip


def _median(results: list[Result]) -> Result:
    rps, p50, p99, cpu = (statistics.median(getattr(r, f) for r in results)
                          for f in ("rps", "p50_ms", "p99_ms", "cpu_us"))  # fmt: skip
    return Result(rps, p50, p99, sum(r.errors for r in results), cpu)


if __name__ == "__main__":
    sys.exit(main())
