"""Issue 31's bar for a client's model: a model in the isolated workers, after its first call,
within the wire plus 0.5 ms of the same model run in the server's process. In one run, over
tritonclient.http (binary tensors) and tritonclient.grpc, each model served twice from one
repository: as the operator's (in process) and with `isolated: "true"` (the workers, as a
`file:` load or a posted model runs); the calls taken in turns (bench_engines._medians_ms).

    python bench/bench_isolated.py [--repeats 105] [--models simple,mlp] [--against DIR]

The difference is the worker's hop: the run's message over a socket to the worker and its
answer back (a small request's awaited on the event loop; a large one's inputs through shared
memory, waited for on a kernel thread). `--against DIR` serves the same repository from a
second tree too (another checkout, e.g. `git archive <commit> | tar -x -C DIR`), its calls
taken in the same turns, so a change's before and after see the same moments of the host.

Then the issue's case itself, over HTTP JSON (the posted route's form): the model posted to
`POST /v1/models/run` with `"engine": "onnxruntime"` (a client's model: the workers, its
session cached by digest after the first call) against the same model from the repository
(`POST /v1/models/{name}/run`, in process), the same inputs; "wire" is what the model's
bytes add to a request: the posted body sent to the repository route (which refuses the field
`model`, 422, after reading and parsing the whole body) less the repository body with an empty
`model` field, refused the same way. The bar: posted within wire + 0.5 ms of the repository
call, the wire being what the posted body costs over the repository's body.
"""

import argparse
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import httpx
import numpy as np
import onnx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.bench_engines import MODELS, RNG, _medians_ms
from tests.api import live_server
from tests.api.live_server import Server, free_port, serve
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


@contextmanager
def _server(tree: Path, root: Path, grpc_port: int) -> Iterator[Server]:
    """The repository `root` served by the service of `tree` (its folder on PYTHONPATH)."""
    mine, live_server.ROOT = live_server.ROOT, tree
    try:
        with serve(model_repository=str(root), grpc_port=str(grpc_port), access_log="false",
                   default_max_batch_size="0", wait_path="/v2/health/live") as server:  # fmt: skip
            live_server.ROOT = mine
            _ready(server.url, 300)  # the loads, each opened by a probe first
            yield server
    finally:
        live_server.ROOT = mine


def _repository(names: list[str]) -> Path:
    """Each model twice: as the operator's (in process) and `isolated` (the workers)."""
    root = Path(tempfile.mkdtemp(prefix="bench-isolated-"))
    if "simple" in names:
        write_repository(root, ["simple"])
        (root / "simple_isolated" / "1").mkdir(parents=True)
        (root / "simple_isolated" / "1" / "model.onnx").write_bytes(
            (root / "simple" / "1" / "model.onnx").read_bytes()
        )
        (root / "simple_isolated" / "config.pbtxt").write_text(
            (root / "simple" / "config.pbtxt").read_text().replace('"simple"', '"simple_isolated"')
            + ISOLATED
        )
    for name in names:
        if name == "simple":
            continue
        for folder, config in ((name, ""), (f"{name}_isolated", ISOLATED)):
            (root / folder / "1").mkdir(parents=True)
            onnx.save(MODELS[name], root / folder / "1" / "model.onnx")
            (root / folder / "config.pbtxt").write_text(config)
    return root


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=105)
    parser.add_argument("--models", default="simple,mlp,cnn64,cnn224")
    parser.add_argument("--against", type=Path, help="a second tree, served beside this one")
    args = parser.parse_args()
    import tritonclient.grpc as grpcclient
    import tritonclient.http as httpclient

    inputs = {"simple": {"INPUT0": np.arange(16, dtype=np.int32).reshape(1, 16),
                         "INPUT1": np.ones((1, 16), np.int32)},
              "mlp": {"x": RNG.standard_normal((8, 256)).astype(np.float32)},
              "cnn64": {"x": RNG.standard_normal((1, 3, 64, 64)).astype(np.float32)},
              "cnn224": {"x": RNG.standard_normal((1, 3, 224, 224)).astype(np.float32)}}  # fmt: skip
    names = args.models.split(",")
    root = _repository(names)
    trees = {"": live_server.ROOT, **({"before ": args.against} if args.against else {})}
    with ExitStack() as stack, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        clients = {}
        urls = {}
        for label, tree in trees.items():
            grpc_port = free_port()
            server = stack.enter_context(_server(tree, root, grpc_port))
            urls[label] = stack.enter_context(httpx.Client(base_url=server.url, timeout=60))
            clients[label] = {
                "http": (httpclient.InferenceServerClient(f"127.0.0.1:{server.port}"), httpclient),
                "grpc": (grpcclient.InferenceServerClient(f"127.0.0.1:{grpc_port}"), grpcclient),
            }
        print("medians in ms, in process and in the workers measured in turns; bar: the")
        print(f"workers within {BAR_MS} ms of in process")
        heads = "".join(f"{label + 'in':>12}{label + 'workers':>16}{label + 'hop':>12}"
                        for label in trees)  # fmt: skip
        print(f"{'model':<10}{'client':<7}{heads}  bar")
        for name in names:
            for kind in ("http", "grpc"):
                calls = {}
                for label in trees:
                    client, module = clients[label][kind]
                    calls[f"{label}in"] = _call(client, module, name, inputs[name])
                    calls[f"{label}workers"] = _call(client, module, f"{name}_isolated",
                                                     inputs[name])  # fmt: skip
                took = _medians_ms(calls, args.repeats)
                row = ""
                for label in trees:
                    hop = took[f"{label}workers"] - took[f"{label}in"]
                    row += (f"{took[f'{label}in']:>12.3f}{took[f'{label}workers']:>16.3f}"
                            f"{hop:>12.3f}")  # fmt: skip
                hop = took["workers"] - took["in"]
                print(f"{name:<10}{kind:<7}{row}  {'ok' if hop <= BAR_MS else 'over'}")
        print()
        print("posted (/v1/models/run, onnxruntime: the workers) against the repository model")
        print("(/v1/models/{name}/run, in process), HTTP JSON, ms; wire: the posted body's extra")
        print(f"cost over the repository body's; bar: posted <= repository + wire + {BAR_MS}")
        heads = "".join(f"{label + 'repository':>18}{label + 'posted':>14}{label + 'wire':>12}"
                        f"{label + 'posted-repo':>19}" for label in trees)  # fmt: skip
        print(f"{'model':<10}{heads}  bar")
        for name in names:
            posted, body, refused = _posted_bodies(name, inputs[name], root)
            repository = f"/v1/models/{name}/run"
            calls = {}
            for label in trees:
                url = urls[label]
                calls |= {f"{label}repository": _post(url, repository, body, 200),
                          f"{label}posted": _post(url, "/v1/models/run", posted, 200),
                          f"{label}posted body to repository": _post(url, repository, posted,
                                                                     422),
                          f"{label}empty model to repository": _post(url, repository, refused,
                                                                     422)}  # fmt: skip
            took = _medians_ms(calls, args.repeats)
            row = ""
            for label in trees:
                wire = (took[f"{label}posted body to repository"]
                        - took[f"{label}empty model to repository"])  # fmt: skip
                extra = took[f"{label}posted"] - took[f"{label}repository"]
                row += (f"{took[f'{label}repository']:>18.3f}{took[f'{label}posted']:>14.3f}"
                        f"{wire:>12.3f}{extra:>19.3f}")  # fmt: skip
                if not label:
                    verdict = "ok" if extra <= wire + BAR_MS else "over"
            print(f"{name:<10}{row}  {verdict}")
        for pair in clients.values():
            for client, _module in pair.values():
                client.close()


def _post(url: httpx.Client, path: str, payload: bytes, want: int) -> Callable[[], object]:
    """A call posting the JSON `payload` to `path`, answered `want`."""

    def call() -> object:
        answer = url.post(path, content=payload, headers={"content-type": "application/json"})
        assert answer.status_code == want, answer.text[:300]
        return answer

    return call


def _posted_bodies(name: str, feeds: dict[str, np.ndarray],
                   root: Path) -> tuple[bytes, bytes, bytes]:  # fmt: skip
    """(the posted route's body, the repository route's body, the latter with an empty
    `model`) for `name` and `feeds`: the same inputs in the v1 JSON form."""
    import base64
    import json

    data = (root / name / "1" / "model.onnx").read_bytes()
    inputs = {key: {"dtype": "int32" if array.dtype == np.int32 else "float",
                    "shape": list(array.shape), "data": array.ravel().tolist()}
              for key, array in feeds.items()}  # fmt: skip
    repository = json.dumps({"inputs": inputs}).encode()
    posted = json.dumps({"model": base64.b64encode(data).decode(), "inputs": inputs,
                         "engine": "onnxruntime"}).encode()  # fmt: skip
    refused = json.dumps({"model": "", "inputs": inputs}).encode()
    return posted, repository, refused


if __name__ == "__main__":
    main()
