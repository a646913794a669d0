"""Dynamic batching's worth (issue 34), ratios in one run.

    python bench/bench_batching.py [--seconds 6] [--rounds 3] [--clients 16]

1. In process, onnxruntime alone: the model's cost per row in a batch of 8 against a lone
   row's. The model (three MatMuls by 2048 x 2048 weights: a run reads 48 MB of weights
   whatever its rows) is one where batching pays, which the bench checks first: a row in a
   batch of 8 must cost at most a third of a lone run.
2. Served: the same model twice in one repository, `batched` with `dynamic_batching {}` and
   `alone` without, each hammered by `--clients` concurrent tritonclient.http clients (one
   single-row request at a time each, binary tensors, keep-alive) for `--seconds`; rounds
   alternate between the two so both see the same machine. Throughput (requests/s), median
   and p99 latency, and batched over alone. The bar: at least 1.5x the throughput.
"""

import argparse
import statistics
import sys
import tempfile
import threading
import time
import warnings
from pathlib import Path

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import tritonclient.http as httpclient

from tests.api.live_server import serve
from tests.runtime.models import model, value

WIDTH, DEPTH = 2048, 3
IO = (f'input [{{name: "X" data_type: TYPE_FP32 dims: [{WIDTH}]}}]\n'
      f'output [{{name: "Y" data_type: TYPE_FP32 dims: [{WIDTH}]}}]\n')  # fmt: skip
CONFIGS = {"batched": f"max_batch_size: 8\n{IO}dynamic_batching {{}}\n",
           "alone": f"max_batch_size: 8\n{IO}"}  # fmt: skip


def mlp() -> bytes:
    rng = np.random.default_rng(0)
    weights = {f"w{i}": (rng.standard_normal((WIDTH, WIDTH)) / 45).astype(np.float32)
               for i in range(DEPTH)}  # fmt: skip
    nodes = [helper.make_node("MatMul", ["X" if i == 0 else f"h{i}", f"w{i}"],
                              ["Y" if i == DEPTH - 1 else f"h{i + 1}"]) for i in range(DEPTH)]  # fmt: skip
    return model(nodes, [value("X", TensorProto.FLOAT, ["n", WIDTH])],
                 [value("Y", TensorProto.FLOAT, ["n", WIDTH])], weights,
                 opset=17).SerializeToString()  # fmt: skip


def per_row(data: bytes) -> tuple[float, float]:
    """Seconds per row: a lone row, a row of a batch of 8 (medians of 200 runs each)."""
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(data, options, providers=["CPUExecutionProvider"])
    found = []
    for rows in (1, 8):
        x = np.ones((rows, WIDTH), np.float32)
        times = []
        for _ in range(200):
            began = time.perf_counter()
            session.run(None, {"X": x})
            times.append(time.perf_counter() - began)
        found.append(statistics.median(times) / rows)
    return found[0], found[1]


def hammer(port: int, name: str, clients: int, seconds: float) -> tuple[int, list[float]]:
    """Answers in `seconds` from `clients` threads, and every latency."""
    latencies: list[float] = []
    lock = threading.Lock()
    stop = time.monotonic() + seconds
    failures: list[str] = []

    def client() -> None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            triton = httpclient.InferenceServerClient(f"127.0.0.1:{port}")
        x = np.random.default_rng().standard_normal((1, WIDTH)).astype(np.float32)
        tensor = httpclient.InferInput("X", [1, WIDTH], "FP32")
        tensor.set_data_from_numpy(x, binary_data=True)
        mine = []
        while time.monotonic() < stop:
            began = time.perf_counter()
            try:
                triton.infer(name, [tensor])
            except Exception as exc:  # counted, and the first shown
                failures.append(str(exc)[:200])
                continue
            mine.append(time.perf_counter() - began)
        triton.close()
        with lock:
            latencies.extend(mine)

    threads = [threading.Thread(target=client) for _ in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if failures:
        raise SystemExit(f"{len(failures)} failures, e.g. {failures[0]}")
    return len(latencies), latencies


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=6)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--clients", type=int, default=16)
    args = parser.parse_args()
    data = mlp()
    lone, batched_row = per_row(data)
    print(f"in process: a lone row {lone * 1e3:.3f} ms, a row of a batch of 8 "
          f"{batched_row * 1e3:.3f} ms ({batched_row / lone:.2f} of a lone run; the model "
          f"{'qualifies' if batched_row <= lone / 3 else 'does NOT qualify'}: <= 1/3)")  # fmt: skip
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        for name, config in CONFIGS.items():
            (root / name / "1").mkdir(parents=True)
            (root / name / "1" / "model.onnx").write_bytes(data)
            (root / name / "config.pbtxt").write_text(f'name: "{name}"\n{config}')
        with serve(model_repository=str(root), grpc_port="0", access_log="false") as server:
            for name in CONFIGS:  # warm both: sessions, the inline gate, connections
                hammer(server.port, name, 2, 1.0)
            results: dict[str, list[tuple[int, list[float]]]] = {n: [] for n in CONFIGS}
            for _ in range(args.rounds):
                for name in CONFIGS:
                    results[name].append(hammer(server.port, name, args.clients, args.seconds))
    rates = {}
    for name, rounds in results.items():
        rate = statistics.median(count / args.seconds for count, _ in rounds)
        latencies = sorted(t for _, times in rounds for t in times)
        p50 = latencies[len(latencies) // 2]
        p99 = latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))]
        rates[name] = rate
        print(f"{name:8s} {rate:8.1f} req/s  p50 {p50 * 1e3:7.2f} ms  p99 {p99 * 1e3:7.2f} ms "
              f"({args.clients} clients, {args.rounds} rounds of {args.seconds:g} s)")  # fmt: skip
    ratio = rates["batched"] / rates["alone"]
    print(f"batched / alone throughput: x{ratio:.2f} (bar: >= 1.5)")


if __name__ == "__main__":
    main()
