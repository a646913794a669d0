"""Trace files as Triton's tools read them: what Triton's qa/common/trace_summary.py computes
(tests/trace_reading.py, re-derived from it) over a file a real server wrote for
tritonclient.http and .grpc calls finds every request with its door's figures; each record's stamps are in order from the door's
receive to its send; a cached model's second request shows the hit (lookup stamps, no
COMPUTE_*); the TENSORS level writes each input and output in Triton's form, checked against
numpy and cut at OPSERVE_TRACE_TENSOR_BYTES."""

import json
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from onnx import TensorProto, helper

from tests.grpc.conftest import Served, repository, serve_grpc
from tests.trace_reading import summaries, tensor_array

CORE = ["REQUEST_START", "QUEUE_START", "COMPUTE_START", "COMPUTE_INPUT_END",
        "COMPUTE_OUTPUT_START", "COMPUTE_END", "REQUEST_END"]  # fmt: skip
FRONT = {"HTTP": (["HTTP_RECV_START", "HTTP_RECV_END"], ["HTTP_SEND_START", "HTTP_SEND_END"]),
         "GRPC": (["GRPC_WAITREAD_START", "GRPC_WAITREAD_END"],
                  ["GRPC_SEND_START", "GRPC_SEND_END"])}  # fmt: skip
TENSOR_BYTES = 256
CACHE_MISS = ["CACHE_LOOKUP_START", "CACHE_LOOKUP_END", "CACHE_INSERT_START", "CACHE_INSERT_END"]


def write_cached(models: Path) -> None:
    """A Transpose model named "cached" whose answers the response cache keeps, in `models`."""
    x = helper.make_tensor_value_info("X", TensorProto.FLOAT, ["a", "b"])
    y = helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["b", "a"])
    graph = helper.make_graph([helper.make_node("Transpose", ["X"], ["Y"])], "g", [x], [y])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    (models / "cached" / "1").mkdir(parents=True)
    onnx.save(model, models / "cached" / "1" / "model.onnx")
    (models / "cached" / "config.pbtxt").write_text(
        'name: "cached"\nmax_batch_size: 0\nresponse_cache { enable: true }\n')  # fmt: skip


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Served, Path]]:
    root = tmp_path_factory.mktemp("trace_summary")
    settings = repository(root / "models")
    write_cached(root / "models")
    trace_file = root / "trace.json"
    with serve_grpc(trace_file=str(trace_file), trace_level="TIMESTAMPS", trace_rate="1",
                    response_cache_bytes=str(1 << 20), trace_tensor_bytes=str(TENSOR_BYTES),
                    **settings) as running:  # fmt: skip
        yield running, trace_file


@pytest.fixture(scope="module")
def clients(served: tuple[Served, Path]) -> Iterator[dict[str, Any]]:
    server = served[0]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        made = {"HTTP": httpclient.InferenceServerClient(f"127.0.0.1:{server.http.port}"),
                "GRPC": grpcclient.InferenceServerClient(server.target)}  # fmt: skip
    yield made
    for client in made.values():
        client.close()


def _module(door: str) -> Any:
    return httpclient if door == "HTTP" else grpcclient


def _simple(client: Any, door: str, a: np.ndarray, b: np.ndarray) -> Any:
    inputs = [_module(door).InferInput(name, [1, 16], "INT32") for name in ("INPUT0", "INPUT1")]
    for tensor, array in zip(inputs, (a, b), strict=True):
        tensor.set_data_from_numpy(array)
    return client.infer("simple", inputs)


def _cached(client: Any, door: str, x: np.ndarray) -> np.ndarray:
    tensor = _module(door).InferInput("X", list(x.shape), "FP32")
    tensor.set_data_from_numpy(x)
    return client.infer("cached", [tensor]).as_numpy("Y")


def _objects(path: Path) -> list[dict[str, Any]]:
    """The file's objects in their order (a whole array once the writer is between writes)."""
    for _ in range(100):
        try:
            return json.loads(path.read_bytes()) if path.exists() else []
        except ValueError:  # caught in the middle of an append
            time.sleep(0.02)
    raise AssertionError(f"{path} never held a whole JSON array")


def _new_traces(path: Path, after: int, count: int) -> dict[int, list[dict[str, Any]]]:
    """The objects of the traces with ids past `after`, by id, once `count` traces have their
    REQUEST_END (or the door's last stamp), in the file's order."""
    deadline = time.monotonic() + 15
    while True:
        traces: dict[int, list[dict[str, Any]]] = {}
        for entry in _objects(path):
            if entry["id"] > after:
                traces.setdefault(entry["id"], []).append(entry)
        ended = [t for t in traces.values() if any(_names(o) & {"HTTP_SEND_END", "GRPC_SEND_END"}
                                                   for o in t)]  # fmt: skip
        if len(ended) >= count or time.monotonic() > deadline:
            return traces
        time.sleep(0.05)


def _names(entry: dict[str, Any]) -> set[str]:
    return {stamp["name"] for stamp in entry.get("timestamps", [])}


def _stamps(objects: list[dict[str, Any]]) -> list[tuple[str, int]]:
    return [(s["name"], s["ns"]) for o in objects for s in o.get("timestamps", [])]


def _last_id(path: Path) -> int:
    return max((entry["id"] for entry in _objects(path)), default=0)


def test_trace_summary_reads_both_doors_figures(clients, served) -> None:  # type: ignore[no-untyped-def]
    path = served[1]
    after = _last_id(path)
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    rounds = 3
    for _ in range(rounds):
        for door, client in clients.items():
            answer = _simple(client, door, a, a * 2)
            assert (answer.as_numpy("OUTPUT0") == a * 3).all()
    traces = _new_traces(path, after, 2 * rounds)
    assert len(traces) == 2 * rounds
    for objects in traces.values():
        door = "HTTP" if "HTTP_RECV_START" in _names(objects[0]) else "GRPC"
        receive, send = FRONT[door]
        stamps = _stamps(objects)
        # Triton's order: one object per stamp, the model named just before REQUEST_START
        assert [name for name, _ in stamps] == [*receive, *CORE, *send]
        assert [ns for _, ns in stamps] == sorted(ns for _, ns in stamps)
        assert objects[len(receive)] == {"id": objects[0]["id"], "model_name": "simple",
                                         "model_version": 1}  # fmt: skip
        assert all(len(o.get("timestamps", [])) <= 1 for o in objects)

    # the file as a whole, as Triton's tool reads it: each door's requests, found by its stamps
    objects = _objects(path)
    http, grpc = (summaries(objects, door)[("simple", 1)] for door in ("HTTP", "GRPC"))
    assert http["count"] >= rounds and grpc["count"] >= rounds
    http_total, receive, send = http["infer request"], http["receive"], http["send"]
    handler = http["handler"]
    assert 0 <= receive < http_total and 0 <= send < http_total and 0 < handler < http_total
    assert handler + receive + send <= http_total * 1.001
    queue, compute = http["queue"], http["compute"]
    assert queue >= 0 and 0 < compute <= handler
    parts = [http[part] for part in ("input", "infer", "output")]
    assert all(p >= 0 for p in parts) and sum(parts) <= compute * 1.001
    assert 0 <= grpc["send"] < grpc["infer request"]
    assert 0 < grpc["handler"] < grpc["infer request"]


def test_a_cache_hit_is_traced_without_compute(clients, served) -> None:  # type: ignore[no-untyped-def]
    path = served[1]
    x = np.random.default_rng(7).random((3, 5), dtype=np.float32)
    for shift, (door, client) in enumerate(clients.items()):
        after = _last_id(path)
        first = _cached(client, door, x + shift)  # new bytes for each door: a miss
        again = _cached(client, door, x + shift)
        assert (first == (x + shift).T).all() and (again == first).all()
        traces = _new_traces(path, after, 2)
        miss, hit = (dict(_stamps(traces[key])) for key in sorted(traces))
        receive, send = FRONT[door]
        assert set(CORE) <= set(miss) and set(CACHE_MISS) <= set(miss)
        assert list(hit) == [*receive, "REQUEST_START", "QUEUE_START", "CACHE_LOOKUP_START",
                             "CACHE_LOOKUP_END", "REQUEST_END", *send]  # fmt: skip
        for stamps in (miss, hit):
            assert list(stamps.values()) == sorted(stamps.values())
        assert miss["COMPUTE_END"] <= miss["CACHE_INSERT_START"]
    # Triton's tool takes the hits too (a request with no compute: no queue or compute span)
    assert ("cached", 1) in summaries(_objects(path), "HTTP")


def test_tensors_level_writes_each_tensor_bounded(clients, served) -> None:  # type: ignore[no-untyped-def]
    path = served[1]
    http = clients["HTTP"]
    http.update_trace_settings(settings={"trace_level": ["TIMESTAMPS", "TENSORS"]})
    try:
        after = _last_id(path)
        a = np.arange(-8, 8, dtype=np.int32).reshape(1, 16)
        b = np.full((1, 16), 5, dtype=np.int32)
        _simple(http, "HTTP", a, b)
        big = np.linspace(-1, 1, 200, dtype=np.float32).reshape(4, 50)  # 800 bytes
        _cached(http, "HTTP", big)
        traces = _new_traces(path, after, 2)
    finally:
        http.update_trace_settings(settings={"trace_level": None})
    simple, cached = (traces[key] for key in sorted(traces))
    tensors = {(o["activity"], o["tensor"]["name"]): o["tensor"] for o in simple if "activity" in o}
    assert set(tensors) == {("TENSOR_QUEUE_INPUT", "INPUT0"), ("TENSOR_QUEUE_INPUT", "INPUT1"),
                            ("TENSOR_BACKEND_OUTPUT", "OUTPUT0"),
                            ("TENSOR_BACKEND_OUTPUT", "OUTPUT1")}  # fmt: skip
    expected = {"INPUT0": a, "INPUT1": b, "OUTPUT0": a + b, "OUTPUT1": a - b}
    for (_, name), tensor in tensors.items():
        assert tensor["dtype"] == "INT32" and tensor["shape"] == "1,16"
        assert (tensor_array(tensor) == expected[name]).all()
    # the TENSORS objects lie between QUEUE_START and REQUEST_END, as Triton's
    names = [o.get("activity") or o.get("timestamps", [{}])[0].get("name") for o in simple]
    assert names.index("QUEUE_START") < names.index("TENSOR_QUEUE_INPUT")
    assert names.index("TENSOR_BACKEND_OUTPUT") < names.index("REQUEST_END")
    # 800 bytes of FP32, cut at TENSOR_BYTES: its first 64 elements, marked
    (x,) = [o["tensor"] for o in cached if o.get("activity") == "TENSOR_QUEUE_INPUT"]
    (y,) = [o["tensor"] for o in cached if o.get("activity") == "TENSOR_BACKEND_OUTPUT"]
    count = TENSOR_BYTES // 4
    assert x["truncated"] is True and x["full_shape"] == "4,50" and x["shape"] == str(count)
    assert y["full_shape"] == "50,4" and len(y["data"].split(",")) == count
    assert (tensor_array(x) == big.reshape(-1)[:count]).all()
    assert (tensor_array(y) == big.T.reshape(-1)[:count]).all()
    assert len(x["data"]) < 16 * count  # no more than the elements written


def test_a_streams_requests_have_the_grpc_stamps(clients, served) -> None:  # type: ignore[no-untyped-def]
    path = served[1]
    after = _last_id(path)
    client = clients["GRPC"]
    answers: list[Any] = []
    client.start_stream(lambda result, error: answers.append(error or result))
    inputs = [grpcclient.InferInput(name, [1, 16], "INT32") for name in ("INPUT0", "INPUT1")]
    for tensor in inputs:
        tensor.set_data_from_numpy(np.ones((1, 16), dtype=np.int32))
    for _ in range(3):
        client.async_stream_infer("simple", inputs)
    client.stop_stream()
    assert len(answers) == 3 and not any(isinstance(a, Exception) for a in answers)
    traces = _new_traces(path, after, 3)
    receive, send = FRONT["GRPC"]
    for objects in traces.values():
        stamps = _stamps(objects)
        assert [name for name, _ in stamps] == [*receive, *CORE, *send]
        assert [ns for _, ns in stamps] == sorted(ns for _, ns in stamps)
