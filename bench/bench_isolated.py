"""Issue 31's bar for a client's model: a model in the isolated workers, after its first call,
within the wire plus 0.5 ms of the same model run in the server's process. In one run, over
tritonclient.http (binary tensors) and tritonclient.grpc, each model served twice from one
repository: as the operator's (in process) and with `isolated: "true"` (the workers, as a
`file:` load or a posted model runs); the calls taken in turns (bench_engines._medians_ms).

    python bench/bench_isolated.py [--repeats 105]

The difference is the worker's hop: the inputs written to shared memory, a message over a
socket, the answer back the same way, and the kernel thread's wait for it.
"""

import argparse
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path

import httpx
import numpy as np
import onnx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.bench_engines import MODELS, RNG, _medians_ms
from tests.api.live_server import free_port, serve
from tests.triton_examples import write_repository

ISOLATED = 'parameters { key: "isolated" value { string_value: "true" } }\n'
BAR_MS = 0.5


def _call(client: object, module: object, model: str, feeds: dict) -> Callable[[], object]:
    def call() -> object:
        sent = []
        for name, array in feeds.items():
            item = module.InferInput(name, list(array.shape),  # type: ignore[attr-defined]
                                     "INT32" if array.dtype == np.int32 else "FP32")  # fmt: skip
            if module.__name__.endswith("http"):  # type: ignore[attr-defined]
                item.set_data_from_numpy(array, binary_data=True)
            else:
                item.set_data_from_numpy(array)
            sent.append(item)
        return client.infer(model, sent)  # type: ignore[attr-defined]

    return call


def _ready(url: str, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while httpx.get(f"{url}/v2/health/ready").status_code != 200:
        if time.monotonic() > deadline:
            raise TimeoutError("the repository did not load")
        time.sleep(0.5)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=105)
    repeats = parser.parse_args().repeats
    import tritonclient.grpc as grpcclient
    import tritonclient.http as httpclient

    root = Path(tempfile.mkdtemp(prefix="bench-isolated-"))
    write_repository(root, ["simple"])
    (root / "simple_isolated" / "1").mkdir(parents=True)
    (root / "simple_isolated" / "1" / "model.onnx").write_bytes(
        (root / "simple" / "1" / "model.onnx").read_bytes()
    )
    (root / "simple_isolated" / "config.pbtxt").write_text(
        (root / "simple" / "config.pbtxt").read_text().replace('"simple"', '"simple_isolated"')
        + ISOLATED
    )
    models = {"mlp": MODELS["mlp"], "cnn64": MODELS["cnn64"], "cnn224": MODELS["cnn224"]}
    for name, built in models.items():
        for folder, config in ((name, ""), (f"{name}_isolated", ISOLATED)):
            (root / folder / "1").mkdir(parents=True)
            onnx.save(built, root / folder / "1" / "model.onnx")
            (root / folder / "config.pbtxt").write_text(config)
    inputs = {"simple": {"INPUT0": np.arange(16, dtype=np.int32).reshape(1, 16),
                         "INPUT1": np.ones((1, 16), np.int32)},
              "mlp": {"x": RNG.standard_normal((8, 256)).astype(np.float32)},
              "cnn64": {"x": RNG.standard_normal((1, 3, 64, 64)).astype(np.float32)},
              "cnn224": {"x": RNG.standard_normal((1, 3, 224, 224)).astype(np.float32)}}  # fmt: skip
    grpc_port = free_port()
    with serve(model_repository=str(root), grpc_port=str(grpc_port), access_log="false",
               default_max_batch_size="0", wait_path="/v2/health/live") as server, \
            warnings.catch_warnings():  # fmt: skip
        warnings.simplefilter("ignore")
        _ready(server.url, 300)  # eight loads, each opened by a probe first
        http = httpclient.InferenceServerClient(f"127.0.0.1:{server.port}")
        grpc = grpcclient.InferenceServerClient(f"127.0.0.1:{grpc_port}")
        print("medians in ms, in process and in the workers measured in turns; bar: the")
        print(f"workers within {BAR_MS} ms of in process")
        print(f"{'model':<10}{'client':<7}{'in process':>11}{'workers':>9}{'hop':>8}  bar")
        for name, feeds in inputs.items():
            for kind, client, module in (("http", http, httpclient),
                                         ("grpc", grpc, grpcclient)):  # fmt: skip
                calls = {
                    "in": _call(client, module, name, feeds),
                    "workers": _call(client, module, f"{name}_isolated", feeds),
                }
                took = _medians_ms(calls, repeats)
                hop = took["workers"] - took["in"]
                print(f"{name:<10}{kind:<7}{took['in']:>11.3f}{took['workers']:>9.3f}"
                      f"{hop:>8.3f}  {'ok' if hop <= BAR_MS else 'over'}")  # fmt: skip
        http.close()
        grpc.close()


if __name__ == "__main__":
    main()
