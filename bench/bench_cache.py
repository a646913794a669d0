"""The response cache's worth (issue 33 item 4), ratios in one run.

    python bench/bench_cache.py [--calls 300] [--rounds 3]

One server, one repository holding each model twice: `<model>_cached` with
`response_cache { enable: true }` and `<model>_plain` without (OPSERVE_RESPONSE_CACHE_BYTES on).
One tritonclient.http client (keep-alive, binary tensors) sends the same request `--calls`
times to each in turn, rounds alternating so both see the same machine: every call to the
cached model but the first is a hit. Median latency per call, and hit over plain. Two models:
`tiny` (a Transpose of 64 floats: the cache's own cost against the least a call costs) and
`mlp` (three MatMuls by 1024 x 1024 weights on a batch of 8 rows: a model worth caching).
The cache's counts are checked against the calls sent (the stats call).
"""

import argparse
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.api.live_server import serve
from tests.runtime.models import model, value

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    import tritonclient.http as httpclient

WIDTH, DEPTH, ROWS = 1024, 3, 8


def tiny() -> bytes:
    node = helper.make_node("Transpose", ["X"], ["Y"])
    return model([node], [value("X", TensorProto.FLOAT, [8, 8])],
                 [value("Y", TensorProto.FLOAT, [8, 8])], opset=17).SerializeToString()  # fmt: skip


def mlp() -> bytes:
    rng = np.random.default_rng(0)
    weights = {f"w{i}": (rng.standard_normal((WIDTH, WIDTH)) / 32).astype(np.float32)
               for i in range(DEPTH)}  # fmt: skip
    nodes = [helper.make_node("MatMul", ["X" if i == 0 else f"h{i}", f"w{i}"],
                              ["Y" if i == DEPTH - 1 else f"h{i + 1}"]) for i in range(DEPTH)]  # fmt: skip
    return model(nodes, [value("X", TensorProto.FLOAT, [ROWS, WIDTH])],
                 [value("Y", TensorProto.FLOAT, [ROWS, WIDTH])], weights,
                 opset=17).SerializeToString()  # fmt: skip


MODELS = {"tiny": (tiny, (8, 8)), "mlp": (mlp, (ROWS, WIDTH))}


def timed(client: httpclient.InferenceServerClient, name: str, x: np.ndarray, calls: int,
          expected: np.ndarray) -> list[float]:  # fmt: skip
    tensor = httpclient.InferInput("X", list(x.shape), "FP32")
    tensor.set_data_from_numpy(x, binary_data=True)
    wanted = [httpclient.InferRequestedOutput("Y", binary_data=True)]
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        answer = client.infer(name, [tensor], outputs=wanted).as_numpy("Y")
        times.append(time.perf_counter() - start)
    np.testing.assert_allclose(answer, expected, rtol=1e-4, atol=1e-4)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        for name, (make, _) in MODELS.items():
            data = make()
            for kind, extra in (("cached", "response_cache { enable: true }\n"), ("plain", "")):
                (root / f"{name}_{kind}" / "1").mkdir(parents=True)
                (root / f"{name}_{kind}" / "1" / "model.onnx").write_bytes(data)
                (root / f"{name}_{kind}" / "config.pbtxt").write_text(
                    f'name: "{name}_{kind}"\nmax_batch_size: 0\n{extra}')  # fmt: skip
        with serve(model_repository=str(root), response_cache_bytes=str(64 << 20),
                   access_log="false") as server:  # fmt: skip
            client = httpclient.InferenceServerClient(f"127.0.0.1:{server.port}")
            rng = np.random.default_rng(1)
            print(f"{args.calls} calls a model a round, {args.rounds} rounds; median per call")
            for name, (make, shape) in MODELS.items():
                x = rng.standard_normal(shape).astype(np.float32)
                expected = _oracle(name, make(), x)
                found: dict[str, list[float]] = {"cached": [], "plain": []}
                for _ in range(args.rounds):
                    for kind in ("plain", "cached"):
                        found[kind] += timed(client, f"{name}_{kind}", x, args.calls, expected)
                (entry,) = client.get_inference_statistics(f"{name}_cached")["model_stats"]
                stats = entry["inference_stats"]
                calls = args.calls * args.rounds
                assert int(stats["cache_miss"]["count"]) == 1, stats["cache_miss"]
                assert int(stats["cache_hit"]["count"]) == calls - 1, stats["cache_hit"]
                hit = statistics.median(found["cached"][1:])
                plain = statistics.median(found["plain"])
                lookup = int(stats["cache_hit"]["ns"]) / int(stats["cache_hit"]["count"]) / 1e3
                print(f"{name:5s} plain {plain * 1e6:8.0f} us   hit {hit * 1e6:8.0f} us   "
                      f"hit / plain {hit / plain:5.2f}   (server side of a hit: {lookup:.0f} "
                      f"us looking up and encoding)")  # fmt: skip
            client.close()


def _oracle(name: str, data: bytes, x: np.ndarray) -> np.ndarray:
    if name == "tiny":
        return x.T
    graph = onnx.load_from_string(data).graph
    weights = {t.name: numpy_helper.to_array(t) for t in graph.initializer}
    y = x
    for i in range(DEPTH):
        y = y @ weights[f"w{i}"]
    return y


if __name__ == "__main__":
    main()
