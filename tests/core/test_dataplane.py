"""The data plane under every door: repository models held to the answer limit and the memory
budget as operators are, a model that is not ready refused before anything is decoded, and a
repository model's inputs decoded once."""

import warnings
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import service.core.inference as inference
from service.main import create_app
from service.settings import Settings

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from starlette.testclient import TestClient

MiB = 1024 * 1024
value = helper.make_tensor_value_info


def _save(path: Path, nodes: list, inputs: list, outputs: list) -> None:
    graph = helper.make_graph(nodes, "g", inputs, outputs)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)
    path.mkdir(parents=True)
    onnx.save(model, path / "model.onnx")


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("repository")
    _save(root / "tiler" / "1", [helper.make_node("Tile", ["x", "r"], ["y"])],
          [value("x", TensorProto.FLOAT, [None, None]), value("r", TensorProto.INT64, [2])],
          [value("y", TensorProto.FLOAT, [None, None])])  # fmt: skip
    # an intermediate of 32 MiB that the answer never holds: only the budget can refuse it
    _save(root / "filler" / "1",
          [helper.make_node("ConstantOfShape", ["dims"], ["big"]),
           helper.make_node("Shape", ["big"], ["shape"])],
          [value("dims", TensorProto.INT64, [None])], [value("shape", TensorProto.INT64, [None])])  # fmt: skip
    (root / "broken" / "1").mkdir(parents=True)
    (root / "broken" / "1" / "model.onnx").write_bytes(b"not a model")
    return root


@pytest.fixture(scope="module")
def client(repository: Path) -> Iterator[TestClient]:
    # no autofilled batching: the filler's dims [n] are one vector, not a batch of scalars
    settings = Settings(model_repository=repository, max_answer_bytes=4096,
                        memory_budget_bytes=16 * MiB, memory_wait_seconds=0.2,
                        default_max_batch_size=0)  # fmt: skip
    with TestClient(create_app(settings), raise_server_exceptions=False) as test_client:
        yield test_client


def _tile(name: str, repeats: list[int]) -> dict:
    return {"inputs": [
        {"name": "x" if name == "tiler" else "input", "shape": [2, 3], "datatype": "FP32",
         "data": [1, 2, 3, 4, 5, 6]},
        {"name": "r" if name == "tiler" else "repeats", "shape": [2], "datatype": "INT64",
         "data": repeats},
    ]}  # fmt: skip


@pytest.mark.parametrize("path", ["/v2/models/Tile/versions/13/infer", "/v2/models/tiler/infer"])
def test_the_answer_limit_holds_for_operators_and_repository_models(
    client: TestClient, path: str
) -> None:
    name = path.split("/")[3]
    small = client.post(path, json=_tile(name, [2, 2]))
    assert small.status_code == 200, small.text
    assert small.json()["outputs"][0]["shape"] == [4, 6]
    large = client.post(path, json=_tile(name, [20, 40]))  # 4,800 floats: over 4096 bytes
    assert large.status_code == 413, large.text
    assert "OPSERVE_MAX_ANSWER_BYTES" in large.json()["error"]


def test_the_memory_budget_holds_for_a_repository_models_intermediates(client: TestClient) -> None:
    body = {"inputs": [{"name": "dims", "shape": [1], "datatype": "INT64", "data": [8 * MiB]}]}
    answer = client.post("/v2/models/filler/infer", json=body)  # 32 MiB of floats, budget 16
    assert answer.status_code == 413, answer.text
    assert "OPSERVE_MEMORY_BUDGET_BYTES" in answer.json()["error"]
    body["inputs"][0]["data"] = [MiB]  # 4 MiB fits
    assert client.post("/v2/models/filler/infer", json=body).json()["outputs"][0]["data"] == [MiB]


def test_a_model_that_is_not_ready_is_refused_before_its_inputs_are_decoded(
    client: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    decoded: list[str] = []
    real = inference.decode_input
    monkeypatch.setattr(inference, "decode_input", lambda item, *rest: (
        decoded.append(item.name), real(item, *rest))[1])  # fmt: skip
    body = {"inputs": [{"name": "x", "shape": [1], "datatype": "FP32", "data": [1]}]}
    answer = client.post("/v2/models/broken/infer", json=body)
    assert answer.status_code == 404, answer.text
    assert "'broken' has no available versions" in answer.json()["error"]
    assert decoded == []


def test_a_small_request_on_a_repository_model_decodes_each_input_once(
    client: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    decoded: list[str] = []
    real = inference.decode_input
    monkeypatch.setattr(inference, "decode_input", lambda item, *rest: (
        decoded.append(item.name), real(item, *rest))[1])  # fmt: skip
    answer = client.post("/v2/models/tiler/infer", json=_tile("tiler", [1, 2]))
    assert answer.status_code == 200, answer.text
    assert decoded == ["x", "r"]
    assert np.array(answer.json()["outputs"][0]["data"]).tolist() == [1, 2, 3, 1, 2, 3,
                                                                      4, 5, 6, 4, 5, 6]  # fmt: skip
