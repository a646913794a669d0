"""Issue 27's table: repository models on opserve's onnxruntime engine, over tritonclient.http
(binary tensors) and tritonclient.grpc, against the same models in an in-process onnxruntime
session with onnxruntime's default options (every core, spinning threads, its arena; "ort*":
the service's options with every core, what a lone run on the server gets), in one run;
medians of `--repeats` calls after a warm-up.

    python bench/bench_engines.py [--repeats 105] [--models cnn64 cnn224] [--seconds 1]

The models: `simple` (Triton's example, INT32 [1,16]), an MLP (3 x MatMul 256x256 + Add +
Relu, FP32 [8,256]), a small CNN (2 x Conv 3x3 16 ch + Relu + GlobalAveragePool, [1,3,64,64]),
a CNN at 224 (4 x Conv 3x3 32 ch, the first stride 2, + Relu + pool, [1,3,224,224]) and a
larger one (8 x Conv 3x3 64 ch, two of stride 2, [1,3,224,224]). The wire cost is a small
operator call (Tile over [2,3]) over the same clients; "sent" is Shape-15 of the model's
largest input (a small answer), the wire cost with that input's transfer. The bar (issue 27):
for the CNNs, opserve within 1.25 x in-process onnxruntime + the wire cost, the wire being
"sent" (the in-process session is handed its input; a request must carry it: 600 KB for the
224x224 CNN, 1.4 ms more than the small call's over HTTP); for the small
models, within 2 x the small operator call.

Then, for the CNNs, runs per second with CLIENTS calls in flight at once: CLIENTS threads over
tritonclient.http (one client each) against CLIENTS threads calling one in-process session,
taken in turns of `--seconds` each (five turns), with the CPU a run took: in the server and in
its client for the calls over HTTP, in this process for the in-process session's; a
`prepared` row makes the same calls with a request serialized once (`prepared`: as Triton's
perf_analyzer sends its inputs), so that tritonclient's own CPU for building each 600 KB body
does not share the 2 cores with the server. The bar (issue 31): at least 0.9 x in process for
the 224x224 CNN; the small CNN's figure is recorded (its per-request cost dominates).

The CNNs are also served with the operator's spinning pool (parameter
session.intra_op.allow_spinning: "1"): their lone calls in the same turns ("spinning" rows),
and what it costs another client: the small CNN's calls while one client calls the 224x224
CNN back to back, spinning or not.
"""

import argparse
import http.client
import json
import os
import statistics
import sys
import tempfile
import threading
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.bench_http import UVICORN_FLAGS, _cpu_seconds, start_server
from service.engines.onnxruntime.session import SPINNING, cores, session_options
from tests.api.live_server import free_port, serve
from tests.triton_examples import write_repository

F = TensorProto.FLOAT
CLIENTS = 4
SETTLE_SECONDS = 0.1
"""A pause before each turn: onnxruntime's default threads spin on after a run (measured: 17.6 ms
of CPU per 5.3 ms run of the 224x224 CNN, spinning for tens of ms after a turn), and a turn
that follows the in-process session's would share the cores with its spinning threads."""
TURNS = 5
RNG = np.random.default_rng(0)


def _weights(name: str, *shape: int) -> onnx.TensorProto:
    return numpy_helper.from_array((RNG.standard_normal(shape) * 0.05).astype(np.float32), name)


def mlp() -> onnx.ModelProto:
    nodes, inits, x = [], [], "x"
    for i in range(3):
        inits += [_weights(f"w{i}", 256, 256), _weights(f"b{i}", 256)]
        nodes += [helper.make_node("MatMul", [x, f"w{i}"], [f"m{i}"]),
                  helper.make_node("Add", [f"m{i}", f"b{i}"], [f"a{i}"]),
                  helper.make_node("Relu", [f"a{i}"], [f"r{i}"])]  # fmt: skip
        x = f"r{i}"
    nodes.append(helper.make_node("Identity", [x], ["y"]))
    return _model(nodes, inits, [8, 256], [8, 256])


def cnn(layers: int, channels: int, size: int, strides: tuple[int, ...]) -> onnx.ModelProto:
    nodes, inits, x, before = [], [], "x", 3
    for i in range(layers):
        stride = 2 if i in strides else 1
        inits.append(_weights(f"k{i}", channels, before, 3, 3))
        nodes += [helper.make_node("Conv", [x, f"k{i}"], [f"c{i}"], pads=[1, 1, 1, 1],
                                   strides=[stride, stride]),
                  helper.make_node("Relu", [f"c{i}"], [f"r{i}"])]  # fmt: skip
        x, before = f"r{i}", channels
    nodes += [helper.make_node("GlobalAveragePool", [x], ["p"]),
              helper.make_node("Flatten", ["p"], ["y"])]  # fmt: skip
    return _model(nodes, inits, [1, 3, size, size], [1, channels])


def _model(nodes: list, inits: list, shape: list[int], out: list[int]) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", F, shape)],
                              [helper.make_tensor_value_info("y", F, out)], inits)  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)


MODELS = {
    "mlp": mlp(),
    "cnn64": cnn(2, 16, 64, ()),
    "cnn224": cnn(4, 32, 224, (0,)),
    "cnn224_large": cnn(8, 64, 224, (0, 3)),
}
SPINNING_ROWS = ("cnn64", "cnn224")  # served a second time with the operator's spinning pool


def _medians_ms(calls: dict[str, Callable[[], object]], repeats: int, block: int = 8,
                settle: float = SETTLE_SECONDS) -> dict[str, float]:  # fmt: skip
    """Each call's median over `repeats` timed calls, the calls taken in turns of `block`
    (a x8, b x8, c x8, a x8, ...), the first of each turn untimed: the host's speed drifts (a
    shared VM's, by 2x within a minute), and calls measured in turn see the same drift, so
    their ratios hold where medians taken one after the other would not; a turn's first call
    runs on caches the other calls have just used, and is left out as a warm-up."""
    times: dict[str, list[float]] = {name: [] for name in calls}
    while min(len(taken) for taken in times.values()) < repeats:
        for name, call in calls.items():
            time.sleep(settle)
            call()
            for _ in range(block - 1):
                start = time.perf_counter()
                call()
                times[name].append(time.perf_counter() - start)
    return {name: statistics.median(taken) * 1000 for name, taken in times.items()}


def _per_second(calls: dict[str, Callable[[], Callable[[], object]]], seconds: float,
                servers: dict[str, int]) -> dict[str, tuple[float, float, float]]:  # fmt: skip
    """Calls per second with CLIENTS threads calling at once, each kind for `seconds` in turn,
    TURNS times (the host's drift falls on every kind alike), and the CPU a call took in its
    server process (`servers`: the pid by kind; none for the in-process session) and in this
    one (the client's, or the in-process session's run), in ms. Each thread makes its own call
    with `make()` (a tritonclient.http client stays on the thread that made it) and calls it
    once untimed before the threads start together."""
    done = dict.fromkeys(calls, 0)
    took = dict.fromkeys(calls, 0.0)
    cpu = {name: [0.0, 0.0] for name in calls}  # server, this process
    for _ in range(TURNS):
        for name, make in calls.items():
            counts = [0] * CLIENTS
            ready = threading.Barrier(CLIENTS + 1)
            until = [0.0]

            def loop(i: int, make: Callable = make, counts: list = counts,
                     ready: threading.Barrier = ready, until: list = until) -> None:  # fmt: skip
                call = make()
                call()
                ready.wait()
                while time.perf_counter() < until[0]:
                    call()
                    counts[i] += 1

            threads = [threading.Thread(target=loop, args=(i,)) for i in range(CLIENTS)]
            time.sleep(SETTLE_SECONDS)
            for thread in threads:
                thread.start()
            start = time.perf_counter()
            until[0] = start + seconds
            ready.wait()
            server = servers.get(name)
            server_cpu, own = _cpu_seconds(server) if server else 0.0, os.times()
            for thread in threads:
                thread.join()
            took[name] += time.perf_counter() - start
            done[name] += sum(counts)
            ended = os.times()
            cpu[name][0] += _cpu_seconds(server) - server_cpu if server else 0.0
            cpu[name][1] += ended.user + ended.system - own.user - own.system
    return {name: (done[name] / took[name], *(1000 * spent / max(done[name], 1)
                                               for spent in cpu[name]))
            for name in calls}  # fmt: skip


def infer_inputs(module: Any, feeds: dict) -> list:
    """tritonclient's InferInput of each feed (`module`: tritonclient.http, binary data, or
    tritonclient.grpc)."""
    sent = []
    for name, array in feeds.items():
        item = module.InferInput(name, list(array.shape),
                                 "INT32" if array.dtype == np.int32 else "FP32")  # fmt: skip
        if module.__name__ == "tritonclient.http":
            item.set_data_from_numpy(array, binary_data=True)
        else:
            item.set_data_from_numpy(array)
        sent.append(item)
    return sent


def prepared(at: str, model: str, feeds: dict, version: str = "") -> Callable[[], bytes]:
    """A call whose request was serialized once, as Triton's perf_analyzer sends its inputs:
    tritonclient.http's own body (binary tensors) over one kept-alive connection, the answer
    read whole. The in-process session's threads are handed prepared inputs too, so this
    compares the server with the session; tritonclient.http builds the body again on every call
    (1.1-1.4 ms of CPU for a 600 KB input), on the bench host's 2 cores beside the server, where
    a real client's CPU is its own."""
    import tritonclient.http as httpclient

    sent = infer_inputs(httpclient, feeds)
    body, header_length = httpclient.InferenceServerClient.generate_request_body(sent)
    headers = {"Content-Type": "application/octet-stream",
               "Inference-Header-Content-Length": str(header_length)}  # fmt: skip
    host, port = at.rsplit(":", 1)
    connection = http.client.HTTPConnection(host, int(port))
    path = f"/v2/models/{model}" + (f"/versions/{version}" if version else "") + "/infer"

    def call() -> bytes:
        connection.request("POST", path, body, headers)
        answer = connection.getresponse()
        read = answer.read()
        if answer.status != 200:
            raise RuntimeError(f"{answer.status}: {read[:200]!r}")
        return read

    return call


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=105)
    parser.add_argument("--models", nargs="*", help="the rows to measure (default: all)")
    parser.add_argument("--seconds", type=float, default=1.0, help="a turn of the throughput rows")
    args = parser.parse_args()
    repeats = args.repeats
    import tritonclient.grpc as grpcclient
    import tritonclient.http as httpclient

    root = Path(tempfile.mkdtemp(prefix="bench-engines-"))
    write_repository(root, ["simple"])
    simple = onnx.load(root / "simple" / "1" / "model.onnx")
    for name, built in MODELS.items():
        (root / name / "1").mkdir(parents=True)
        onnx.save(built, root / name / "1" / "model.onnx")
    for name in SPINNING_ROWS:  # the same CNN, its lone runs on a spinning pool
        (root / f"{name}_spinning" / "1").mkdir(parents=True)
        onnx.save(MODELS[name], root / f"{name}_spinning" / "1" / "model.onnx")
        (root / f"{name}_spinning" / "config.pbtxt").write_text(
            'backend: "onnxruntime"\n'
            f'parameters {{ key: "{SPINNING}" value {{ string_value: "1" }} }}\n')  # fmt: skip
    inputs = {"simple": {"INPUT0": np.arange(16, dtype=np.int32).reshape(1, 16),
                         "INPUT1": np.ones((1, 16), np.int32)},
              "mlp": {"x": RNG.standard_normal((8, 256)).astype(np.float32)},
              "cnn64": {"x": RNG.standard_normal((1, 3, 64, 64)).astype(np.float32)},
              "cnn224": {"x": RNG.standard_normal((1, 3, 224, 224)).astype(np.float32)},
              "cnn224_large": {"x": RNG.standard_normal((1, 3, 224, 224)).astype(np.float32)}}  # fmt: skip
    protos = {name: proto for name, proto in {"simple": simple, **MODELS}.items()
              if not args.models or name in args.models}  # fmt: skip
    grpc_port = free_port()
    with serve(model_repository=str(root), grpc_port=str(grpc_port), access_log="false") as server, \
            warnings.catch_warnings():  # fmt: skip
        warnings.simplefilter("ignore")
        http_at = f"127.0.0.1:{server.port}"
        http = httpclient.InferenceServerClient(http_at)
        grpc = grpcclient.InferenceServerClient(f"127.0.0.1:{grpc_port}")

        def over(client: object, module: object, model: str, feeds: dict,
                 version: str = "") -> Callable[[], object]:  # fmt: skip
            def call() -> object:
                sent = infer_inputs(module, feeds)
                return client.infer(model, sent, model_version=version)  # type: ignore[attr-defined]

            return call

        tile = {"input": np.ones((2, 3), np.float32), "repeats": np.array([2, 2], np.int64)}

        def wire(client: object, module: object) -> Callable[[], object]:
            def call() -> object:
                a = module.InferInput("input", [2, 3], "FP32")  # type: ignore[attr-defined]
                b = module.InferInput("repeats", [2], "INT64")  # type: ignore[attr-defined]
                a.set_data_from_numpy(tile["input"])
                b.set_data_from_numpy(tile["repeats"])
                return client.infer("Tile", [a, b], model_version="13")  # type: ignore[attr-defined]

            return call

        clients = (("http", http, httpclient), ("grpc", grpc, grpcclient))
        print("each row measured in turn with the small call over each client (wire) and with")
        print("Shape-15 of the model's largest input (sent: the wire and that input's transfer)")
        print("ort: in process, onnxruntime's default options; ort*: the service's options with")
        print("every core (no spinning, no arena): what a lone run on the server runs at;")
        print(f"spinning: the same model with the parameter {SPINNING}: 1 (its lone runs'")
        print("pool threads spin, at the lowest priority, as onnxruntime's defaults do)")
        print(f"{'model':<14}{'http ms':>9}{'grpc ms':>9}{'ort ms':>9}{'ort* ms':>9}{'wire http':>11}"
              f"{'wire grpc':>11}{'sent http':>11}{'sent grpc':>11}  bar (http, grpc)")  # fmt: skip
        for name, proto in protos.items():
            session = ort.InferenceSession(proto.SerializeToString(),
                                           providers=["CPUExecutionProvider"])  # fmt: skip
            largest = max(inputs[name].values(), key=lambda array: array.nbytes)
            ours = ort.InferenceSession(proto.SerializeToString(), session_options(cores()),
                                        providers=["CPUExecutionProvider"])  # fmt: skip
            calls = {"ort": lambda s=session, n=name: s.run(None, inputs[n]),
                     "ort*": lambda s=ours, n=name: s.run(None, inputs[n])}  # fmt: skip
            for kind, client, module in clients:
                calls[kind] = over(client, module, name, inputs[name])
                if name in SPINNING_ROWS:
                    calls[f"{kind} spinning"] = over(client, module, f"{name}_spinning",
                                                     inputs[name])  # fmt: skip
                calls[f"wire {kind}"] = wire(client, module)
                calls[f"sent {kind}"] = over(client, module, "Shape", {"data": largest}, "15")
            took = _medians_ms(calls, repeats)
            small = name in ("simple", "mlp")
            bars = {kind: 2 * took[f"wire {kind}"] if small
                    else 1.25 * took["ort"] + took[f"sent {kind}"]
                    for kind in ("http", "grpc")}  # fmt: skip
            verdict = _verdict(took, bars)
            print(f"{name:<14}{took['http']:>9.3f}{took['grpc']:>9.3f}{took['ort']:>9.3f}"
                  f"{took['ort*']:>9.3f}"
                  f"{took['wire http']:>11.3f}{took['wire grpc']:>11.3f}"
                  f"{took['sent http']:>11.3f}{took['sent grpc']:>11.3f}  {verdict}")  # fmt: skip
            if name in SPINNING_ROWS:
                print(f"{'  spinning':<14}{took['http spinning']:>9.3f}"
                      f"{took['grpc spinning']:>9.3f}{'':>62}  "
                      f"{_verdict(took, bars, ' spinning')}")  # fmt: skip
        at_once = [name for name in ("cnn64", "cnn224") if name in protos]
        if at_once:
            print(f"\nruns per second, {CLIENTS} calls in flight at once; ms of CPU a run: in the")
            print("server and in its client over http, in this process for the in-process session;")
            print("floor: a raw ASGI app that reads the same calls and answers the server's bytes")
            print(f"{'model':<14}{'http /s':>9}{'ort /s':>9}{'ratio':>7}{'server':>9}{'client':>9}"
                  f"{'ort':>9}{'floor /s':>10}{'floor':>9}")  # fmt: skip
        for name in at_once:
            session = ort.InferenceSession(protos[name].SerializeToString(),
                                           providers=["CPUExecutionProvider"])  # fmt: skip
            answer = over(http, httpclient, name, inputs[name])().get_response()  # type: ignore[attr-defined]
            floor_port = free_port()
            floor = start_server("bench.floor_binary_app:app", floor_port, None, UVICORN_FLAGS,
                                 {"FLOOR_ANSWER": json.dumps(answer)}, check=False)  # fmt: skip
            try:
                rates = _per_second({
                    "http": lambda n=name: over(httpclient.InferenceServerClient(http_at),
                                                httpclient, n, inputs[n]),
                    "prepared": lambda n=name: prepared(http_at, n, inputs[n]),
                    "ort": lambda s=session, n=name: lambda: s.run(None, inputs[n]),
                    "floor": lambda n=name, at=f"127.0.0.1:{floor_port}": over(
                        httpclient.InferenceServerClient(at), httpclient, n, inputs[n]),
                    "floor prepared": lambda n=name, at=f"127.0.0.1:{floor_port}": prepared(
                        at, n, inputs[n]),
                }, args.seconds, {"http": server.process.pid, "floor": floor.pid,
                                  "prepared": server.process.pid,
                                  "floor prepared": floor.pid})  # fmt: skip
            finally:
                floor.terminate()
                floor.wait()
            http_rate, server_cpu, client_cpu = rates["http"]
            ort_rate, _, ort_cpu = rates["ort"]
            floor_rate, floor_cpu, _ = rates["floor"]
            print(f"{name:<14}{http_rate:>9.1f}{ort_rate:>9.1f}{http_rate / ort_rate:>7.2f}"
                  f"{server_cpu:>9.2f}{client_cpu:>9.2f}{ort_cpu:>9.2f}{floor_rate:>10.1f}"
                  f"{floor_cpu:>9.2f}")  # fmt: skip
            kept_rate, kept_server, kept_client = rates["prepared"]
            floor_kept, floor_kept_cpu, _ = rates["floor prepared"]
            print(f"{'  prepared':<14}{kept_rate:>9.1f}{ort_rate:>9.1f}{kept_rate / ort_rate:>7.2f}"
                  f"{kept_server:>9.2f}{kept_client:>9.2f}{ort_cpu:>9.2f}{floor_kept:>10.1f}"
                  f"{floor_kept_cpu:>9.2f}")  # fmt: skip
        if all(name in protos for name in SPINNING_ROWS):
            _beside(http_at, inputs, args.seconds)
        http.close()
        grpc.close()


def _verdict(took: dict[str, float], bars: dict[str, float], row: str = "") -> str:
    """Each client's median for `row` (its calls' key after the client's) against its bar."""
    return ", ".join(f"{took[k + row]:.3f} {'<=' if took[k + row] <= bars[k] else '>'} "
                     f"{bars[k]:.3f}" for k in bars)  # fmt: skip


def _beside(at: str, inputs: dict, seconds: float) -> None:
    """What a spinning pool costs other clients: one client calls the small CNN (a 2 ms pause
    between calls) while another calls the 224x224 CNN back to back, spinning or not, in
    turns (TURNS of 2 x `seconds` each); the small CNN's median and 99th percentile, and the
    CNN's calls per second."""
    print("\nthe small CNN's calls while another client calls the 224x224 CNN back to back,")
    print("its pool spinning or not (ms; the CNN's calls per second)")
    print(f"{'the CNN':<14}{'median':>9}{'p99':>9}{'CNN /s':>9}")
    latencies: dict[str, list[float]] = {"cnn224": [], "cnn224_spinning": []}
    rates: dict[str, list[float]] = {name: [] for name in latencies}
    for _ in range(TURNS):
        for name in latencies:
            stop, calls = threading.Event(), [0]

            def loop(name: str = name, stop: threading.Event = stop, calls: list = calls) -> None:
                call = prepared(at, name, inputs["cnn224"])
                while not stop.is_set():
                    call()
                    calls[0] += 1

            small = prepared(at, "cnn64", inputs["cnn64"])
            small()
            time.sleep(SETTLE_SECONDS)
            other = threading.Thread(target=loop)
            other.start()
            start = time.perf_counter()
            while time.perf_counter() - start < 2 * seconds:
                began = time.perf_counter()
                small()
                latencies[name].append(time.perf_counter() - began)
                time.sleep(0.002)
            stop.set()
            other.join()
            rates[name].append(calls[0] / (time.perf_counter() - start))
    for name, took in latencies.items():
        took.sort()
        label = "spinning" if name.endswith("spinning") else "not spinning"
        print(f"{label:<14}{1000 * statistics.median(took):>9.3f}"
              f"{1000 * took[int(0.99 * (len(took) - 1))]:>9.3f}"
              f"{statistics.median(rates[name]):>9.1f}")  # fmt: skip


if __name__ == "__main__":
    main()
