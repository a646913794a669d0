"""Repository models over V2 with tritonclient.http. Skipped until the model repository
(service/runtime/repository.py, another branch) is merged; then it runs against a real
server whose repository holds models built here with onnx.helper."""

import pytest

pytest.importorskip("service.runtime.repository")

import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import onnx
import tritonclient.http as triton
from onnx import TensorProto, helper
from tritonclient.utils import InferenceServerException

import service.runtime.repository as repository_module
from tests.api.live_server import serve

X = np.arange(6, dtype=np.float32).reshape(2, 3)


def _save(path: Path, nodes: list, inputs: list, outputs: list) -> None:
    graph = helper.make_graph(nodes, path.parent.parent.name, inputs, outputs)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    model.ir_version = 10
    path.parent.mkdir(parents=True)
    onnx.save(model, path)


def _repository(root: Path) -> Path:
    value = helper.make_tensor_value_info
    _save(root / "tiler" / "1" / "model.onnx", [helper.make_node("Tile", ["x", "r"], ["y"])],
          [value("x", TensorProto.FLOAT, [2, 3]), value("r", TensorProto.INT64, [2])],
          [value("y", TensorProto.FLOAT, [None, None])])  # fmt: skip
    _save(root / "chain" / "2" / "model.onnx",
          [helper.make_node("ConstantOfShape", ["dims"], ["filled"]),
           helper.make_node("Shape", ["filled"], ["shape"])],
          [value("dims", TensorProto.INT64, [None])], [value("shape", TensorProto.INT64, [None])])  # fmt: skip
    # A repository model named like an operator wins over it: this "Shape" starts at axis 1.
    _save(root / "Shape" / "1" / "model.onnx", [helper.make_node("Shape", ["d"], ["s"], start=1)],
          [value("d", TensorProto.FLOAT, [None, None, None])], [value("s", TensorProto.INT64, [None])])  # fmt: skip
    (root / "broken" / "1").mkdir(parents=True)
    (root / "broken" / "1" / "model.onnx").write_bytes(b"not a model")
    return root


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[triton.InferenceServerClient]:
    if not Path(repository_module.__file__).is_relative_to(Path(__file__).parents[2]):
        # An editable install of another checkout can supply the module: the server under
        # test (this checkout) would not have it.
        pytest.skip("service.runtime.repository comes from another checkout, not this one")
    root = _repository(tmp_path_factory.mktemp("repository"))
    # a broken model keeps a strictly ready server not ready: this one is ready once started
    with serve(model_repository=str(root), strict_readiness="false",
               default_max_batch_size="0") as server:  # fmt: skip
        triton_client = triton.InferenceServerClient(f"127.0.0.1:{server.port}")
        yield triton_client
        triton_client.close()


def _input(name: str, array: np.ndarray, binary: bool = True) -> triton.InferInput:
    tensor = triton.InferInput(name, list(array.shape), triton.np_to_triton_dtype(array.dtype))
    return tensor.set_data_from_numpy(array, binary_data=binary)


def test_metadata_and_readiness(client: triton.InferenceServerClient) -> None:
    metadata = client.get_model_metadata("tiler")
    assert metadata["versions"] == ["1"] and metadata["platform"] == "onnxruntime_onnx"
    assert [(t["name"], t["datatype"], t["shape"]) for t in metadata["inputs"]] == [
        ("x", "FP32", [2, 3]), ("r", "INT64", [2])]  # fmt: skip
    assert metadata["outputs"] == [{"name": "y", "datatype": "FP32", "shape": [-1, -1]}]
    assert client.is_model_ready("tiler") and client.is_model_ready("chain", "2")
    assert not client.is_model_ready("broken")
    assert not client.is_model_ready("chain", "1")


@pytest.mark.parametrize("binary", [False, True])
def test_infer(client: triton.InferenceServerClient, binary: bool) -> None:
    result = client.infer("tiler", [_input("x", X, binary), _input("r", np.array([1, 2]), binary)])
    np.testing.assert_array_equal(result.as_numpy("y"), np.tile(X, (1, 2)))
    result = client.infer("chain", [_input("dims", np.array([4, 0, 2]), binary)], model_version="2")
    np.testing.assert_array_equal(result.as_numpy("shape"), np.array([4, 0, 2]))


def test_a_repository_model_wins_over_the_operator(client: triton.InferenceServerClient) -> None:
    assert client.get_model_metadata("Shape")["platform"] == "onnxruntime_onnx"
    result = client.infer("Shape", [_input("d", np.zeros((2, 3, 4), np.float32))])
    np.testing.assert_array_equal(result.as_numpy("s"), np.array([3, 4]))


def test_refusals(client: triton.InferenceServerClient) -> None:
    with pytest.raises(InferenceServerException, match=(
            r"^\[404\] Request for unknown model: 'broken' has no available versions \(the model "
            "is not a serialized onnx.ModelProto")) as caught:  # fmt: skip
        client.infer("broken", [_input("x", X)])
    with pytest.raises(InferenceServerException, match=(
            r"^\[503\] Request for unknown model: 'broken' version 1 is not at ready state")):  # fmt: skip
        client.infer("broken", [_input("x", X)], model_version="1")
    with pytest.raises(
        InferenceServerException,
        match=r"^\[400\] inference input 'r' data-type is 'FP32', but model 'tiler' expects 'INT64'$",
    ) as caught:
        client.infer("tiler", [_input("x", X), _input("r", X)])
    assert caught.value.status() == "400"
    # custom parameters reach the model (as Triton passes them); triton_ ones are Triton's
    result = client.infer("tiler", [_input("x", X), _input("r", np.array([1, 1]))],
                          parameters={"start": 1, "note": "any"})  # fmt: skip
    np.testing.assert_array_equal(result.as_numpy("y"), X)
    body = {"inputs": [{"name": "x", "shape": [2, 3], "datatype": "FP32", "data": X.ravel().tolist()},
                       {"name": "r", "shape": [2], "datatype": "INT64", "data": [1, 1]}],
            "parameters": {"triton_x": 1}}  # tritonclient refuses it before sending  # fmt: skip
    answer = client._client_stub.post("/v2/models/tiler/infer", body=json.dumps(body))
    assert answer.status_code == 400
    assert "parameter keys starting with 'triton_' are reserved" in answer.read().decode()
    with pytest.raises(InferenceServerException) as caught:
        client.get_model_metadata("chain", "1")
    assert caught.value.status() == "404"
