"""Whole-model runs over HTTP, this tree against another git revision in the same run: a
kernels-only model (the models guide's Tile/Shape chain) posted to `/v1/models/run`, run from
the repository on v1 and on V2, and a model with a node on onnx.reference (the fallback), all
small, so what is measured is the per-run cost around the graph.

    python bench/bench_models.py [--baseline REV] [--duration 5] [--rounds 2]

Servers and load as bench/bench_http.py (uvicorn with uvloop and httptools, one worker pinned
to one core, wrk on another; the asyncio client without wrk), both trees with
OPSERVE_REFERENCE_FALLBACK=true and the example repository. Since issue 16 a run that needs
the fallback goes whole to a worker process (service/engines/workers/pool.py): the "fallback"
row against the baseline is what that isolation costs per run; the kernels-only rows must not
get slower.

Whole models on the onnxruntime engine (issue 27's models and a larger CNN, over
tritonclient.http and gRPC, against in-process onnxruntime, with the issue's bar) are measured
by bench/bench_engines.py.
"""

import argparse
import base64
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from onnx import TensorProto, helper

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from api_schemas.models import EXAMPLE_MODEL
from bench.bench_http import (
    UVICORN_FLAGS,
    Result,
    _cpu_seconds,
    _median,
    free_port,
    run_asyncio,
    run_wrk,
    start_server,
    worktree,
)

ROOT = Path(__file__).resolve().parents[1]
X = {"dtype": "float", "shape": [1, 3], "data": [1, 2, 3]}


def _add_model() -> str:
    """y = x + x on float [3]: Add has no kernel here, so it runs on onnx.reference."""
    node = helper.make_node("Add", ["x", "x"], ["y"], name="add")
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", 1, [3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3])])  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)
    return base64.b64encode(model.SerializeToString()).decode()


LANES = {
    "posted": ("/v1/models/run", {"model": EXAMPLE_MODEL, "inputs": {"x": X}}),
    "repository": ("/v1/models/tile_shape/run", {"inputs": {"x": X}}),
    "v2": ("/v2/models/tile_shape/infer", {"inputs": [
        {"name": "x", "datatype": "FP32", "shape": [1, 3], "data": [1, 2, 3]}]}),
    "fallback": ("/v1/models/run", {"model": _add_model(),
                                    "inputs": {"x": {"dtype": "float", "data": [1, 2, 3]}}}),
}  # fmt: skip


def measure(root: Path, lane: str, args: argparse.Namespace) -> Result:
    path, body = LANES[lane]
    data = json.dumps(body).encode()
    port = free_port()
    env = {"OPSERVE_ACCESS_LOG": "false", "OPSERVE_REFERENCE_FALLBACK": "true",
           "OPSERVE_MODEL_REPOSITORY": str(ROOT / "examples" / "model_repository"),
           "OPSERVE_METRICS_DIR": tempfile.mkdtemp(prefix="bench-metrics-")}  # fmt: skip
    server = start_server("service.main:app", port, args.server_core, UVICORN_FLAGS, env,
                          check=False, root=root)  # fmt: skip
    load = run_wrk if shutil.which("wrk") and not args.asyncio else run_asyncio
    try:
        load(port, 2.0, args.connections, args.client_core, path, data)  # warm-up (workers)
        before = _cpu_seconds(server.pid)
        result = load(port, args.duration, args.connections, args.client_core, path, data)
        used = _cpu_seconds(server.pid) - before
        cpu = used / max(result.rps * args.duration, 1) * 1e6
        return Result(result.rps, result.p50_ms, result.p99_ms, result.errors, cpu)
    finally:
        server.terminate()
        server.wait(timeout=10)
        shutil.rmtree(env["OPSERVE_METRICS_DIR"], ignore_errors=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=float, default=5.0)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--connections", type=int, default=8)
    parser.add_argument("--server-core", type=int, default=1)
    parser.add_argument("--client-core", type=int, default=0)
    parser.add_argument("--lanes", default=",".join(LANES))
    parser.add_argument("--baseline", metavar="REV", help="also measure the service at REV")
    parser.add_argument("--asyncio", action="store_true", help="use the asyncio client, not wrk")
    args = parser.parse_args()
    lanes = [lane.strip() for lane in args.lanes.split(",") if lane.strip()]
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                          text=True).stdout.strip()  # fmt: skip
    print(
        f"model runs; tree at {head}"
        + (f", baseline {args.baseline}" if args.baseline else "")
        + f"; {args.connections} connections, {args.duration:g} s, {args.rounds} rounds"
    )
    print(f"{'':24} {'req/s':>8} {'p50 ms':>8} {'p99 ms':>8} {'errors':>7} {'cpu us':>8}")
    runs: dict[str, list[Result]] = {}
    with worktree(args.baseline) as baseline:
        trees = [("", ROOT)] + ([(f"@{args.baseline}"[:9], baseline)] if baseline else [])
        for number in range(1, args.rounds + 1):
            for lane in lanes:
                for suffix, root in trees:
                    name = f"{lane}{suffix}"
                    runs.setdefault(name, []).append(measure(root, lane, args))
                    _row(f"{name} #{number}", runs[name][-1])
    for name, results in runs.items():
        _row(f"{name} median", _median(results))
    if baseline is not None:
        for lane in lanes:
            now, before = (_median(runs[f"{lane}{s}"]) for s in ("", trees[1][0]))
            print(
                f"{lane}: {now.rps / before.rps:.2f}x the baseline's req/s, "
                f"{now.cpu_us - before.cpu_us:+.0f} us of server CPU per run"
            )
    return 0


def _row(name: str, r: Result) -> None:
    print(f"{name:24} {r.rps:8.0f} {r.p50_ms:8.2f} {r.p99_ms:8.2f} {r.errors:7d} {r.cpu_us:8.0f}")


if __name__ == "__main__":
    sys.exit(main())
