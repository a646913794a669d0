"""The response cache (core/response_cache.py) on a real server, through tritonclient's HTTP and
gRPC clients: equal requests hit, whatever form they are answered in; the same bytes in another
shape or datatype miss; a model without the switch, or with a random operator, never hits; the
statistics' cache_hit / cache_miss, success and execution counts exact. Answers are checked
against numpy (the oracle: a transpose)."""

import warnings
from collections.abc import Iterator
from typing import Any

import httpx
import numpy as np
import onnx
import pytest
import tritonclient.grpc as grpcclient
from onnx import TensorProto, helper
from prometheus_client.parser import text_string_to_metric_families

from tests.api.live_server import Server, free_port, serve

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    import tritonclient.http as httpclient
    from tritonclient.utils import InferenceServerException

GRPC_PORT = free_port()
CACHED = "response_cache { enable: true }"


def _graph(op: str) -> bytes:
    """Y = op(X) on FP32 X of any 2-D shape."""
    x = helper.make_tensor_value_info("X", TensorProto.FLOAT, ["a", "b"])
    y = helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["c", "d"])
    node = helper.make_node(op, ["X"], ["Y"], **({"seed": 1.0} if op.startswith("Random") else {}))
    graph = helper.make_graph([node], "g", [x], [y])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(model)
    return model.SerializeToString()


MODELS = {"cached": ("Transpose", CACHED), "plain": ("Transpose", ""),
          "random": ("RandomUniformLike", CACHED)}  # fmt: skip


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    root = tmp_path_factory.mktemp("models")
    for name, (op, config) in MODELS.items():
        (root / name / "1").mkdir(parents=True)
        (root / name / "1" / "model.onnx").write_bytes(_graph(op))
        (root / name / "config.pbtxt").write_text(f'name: "{name}"\nmax_batch_size: 0\n{config}')
    with serve(model_repository=str(root), grpc_port=str(GRPC_PORT),
               response_cache_bytes=str(1 << 20)) as running:  # fmt: skip
        yield running


def _http(server: Server) -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return httpclient.InferenceServerClient(f"127.0.0.1:{server.port}")


def _infer(client: Any, model: str, array: np.ndarray, binary: bool = True,
           datatype: str = "FP32") -> np.ndarray:  # fmt: skip
    tensor = httpclient.InferInput("X", list(array.shape), datatype)
    tensor.set_data_from_numpy(array, binary_data=binary)
    wanted = [httpclient.InferRequestedOutput("Y", binary_data=binary)]
    return client.infer(model, [tensor], outputs=wanted).as_numpy("Y")


def _counts(stats: dict[str, Any]) -> dict[str, int]:
    (entry,) = stats["model_stats"]
    inference = entry["inference_stats"]
    counts = {k: int(inference[k]["count"]) for k in ("success", "fail", "cache_hit",
                                                      "cache_miss", "compute_infer")}  # fmt: skip
    counts["executions"] = int(entry["execution_count"])
    return counts


def test_equal_requests_hit_and_other_shapes_or_datatypes_miss(server: Server) -> None:
    client = _http(server)
    before = _counts(client.get_inference_statistics("cached"))
    a = np.arange(6, dtype=np.float32).reshape(2, 3) + 0.5
    np.testing.assert_array_equal(_infer(client, "cached", a), a.T)  # miss
    np.testing.assert_array_equal(_infer(client, "cached", a), a.T)  # hit
    np.testing.assert_array_equal(_infer(client, "cached", a, binary=False), a.T)  # hit, as JSON
    same_bytes = a.reshape(3, 2)
    np.testing.assert_array_equal(_infer(client, "cached", same_bytes), same_bytes.T)  # miss
    as_int = a.view(np.int32)  # the same bytes as INT32: a miss, which the model refuses
    with pytest.raises(InferenceServerException, match=r"INT32|FP32|data type|datatype"):
        _infer(client, "cached", as_int, datatype="INT32")
    after = _counts(client.get_inference_statistics("cached"))
    delta = {k: after[k] - before[k] for k in after}
    assert delta == {"success": 4, "fail": 1, "cache_hit": 2, "cache_miss": 2,
                     "compute_infer": 2, "executions": 2}  # fmt: skip
    (entry,) = client.get_inference_statistics("cached")["model_stats"]
    assert int(entry["inference_stats"]["cache_hit"]["ns"]) > 0
    assert int(entry["inference_stats"]["cache_miss"]["ns"]) > 0
    # and Triton's cache metrics say the same as the statistics, from the same counts
    families = {f.name: f for f in text_string_to_metric_families(
        httpx.get(f"http://127.0.0.1:{server.port}/metrics").text)}  # fmt: skip

    def metric(name: str) -> float:
        (value,) = [s.value for s in families[name].samples
                    if s.labels.get("model") == "cached"]  # fmt: skip
        return value

    assert metric("nv_cache_num_hits_per_model") == after["cache_hit"]
    assert metric("nv_cache_num_misses_per_model") == after["cache_miss"]
    assert metric("nv_cache_hit_duration_per_model") == (
        int(entry["inference_stats"]["cache_hit"]["ns"]) // 1000)  # fmt: skip


def test_grpc_hits_what_http_stored(server: Server) -> None:
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{GRPC_PORT}")
    try:
        before = _counts(client.get_inference_statistics("cached", as_json=True))
        b = np.linspace(-1, 1, 12, dtype=np.float32).reshape(3, 4)
        np.testing.assert_array_equal(_infer(_http(server), "cached", b), b.T)  # miss, HTTP
        for _ in range(3):  # hits, gRPC
            tensor = grpcclient.InferInput("X", [3, 4], "FP32")
            tensor.set_data_from_numpy(b)
            answer = client.infer("cached", [tensor]).as_numpy("Y")
            np.testing.assert_array_equal(answer, b.T)
        after = _counts(client.get_inference_statistics("cached", as_json=True))
    finally:
        client.close()
    delta = {k: after[k] - before[k] for k in after}
    assert delta == {"success": 4, "fail": 0, "cache_hit": 3, "cache_miss": 1,
                     "compute_infer": 1, "executions": 1}  # fmt: skip


@pytest.mark.parametrize("model", ["plain", "random"])
def test_models_never_cached(server: Server, model: str) -> None:
    """Without the switch, or with a random operator (seeded or not), every request runs."""
    client = _http(server)
    a = np.ones((2, 2), np.float32)
    answers = [_infer(client, model, a) for _ in range(3)]
    counts = _counts(client.get_inference_statistics(model))
    assert counts["cache_hit"] == counts["cache_miss"] == 0
    assert counts["executions"] == counts["success"] >= 3
    if model == "random":  # drawn again every run: a cached answer would repeat
        assert not np.array_equal(answers[0], answers[1])
    else:
        for answer in answers:
            np.testing.assert_array_equal(answer, a.T)


def test_a_hit_answers_in_the_form_asked(server: Server) -> None:
    """The entry is the model's outputs: a hit asked for classification is classified as an
    uncached run of the same graph classifies it."""
    client = _http(server)
    c = np.array([[0.25, -3.0, 9.5], [4.0, 1.5, -0.5]], np.float32)
    np.testing.assert_array_equal(_infer(client, "cached", c), c.T)  # stored plain
    before = _counts(client.get_inference_statistics("cached"))

    def classified(model: str) -> np.ndarray:
        tensor = httpclient.InferInput("X", [2, 3], "FP32")
        tensor.set_data_from_numpy(c, binary_data=True)
        wanted = [httpclient.InferRequestedOutput("Y", binary_data=False, class_count=2)]
        return client.infer(model, [tensor], outputs=wanted).as_numpy("Y")

    hit, ran = classified("cached"), classified("plain")
    assert hit.dtype == object and hit.size > 0
    np.testing.assert_array_equal(hit, ran)
    after = _counts(client.get_inference_statistics("cached"))
    assert (after["cache_hit"] - before["cache_hit"], after["executions"]) == (
        1, before["executions"])  # fmt: skip
