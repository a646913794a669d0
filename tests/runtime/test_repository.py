"""The model repository: Triton's layout and bare files, broken models listed not ready with
their reason, the service still starting, and the v1 routes over it."""

import asyncio
import base64
import logging
import re
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from onnx import helper
from starlette.testclient import TestClient

from api_schemas.models import EXAMPLE_MODEL
from service.errors import NotFound
from service.main import create_app
from service.runtime.repository import ModelRepository
from service.settings import Settings

from .models import I64, F, from_proto, model, proto, value

GOOD = base64.b64decode(EXAMPLE_MODEL)  # y = Tile(x, repeats=[2, 1]), shape = Shape(y)


def _shape_model() -> bytes:
    return model([helper.make_node("Shape", ["x"], ["s"], name="shape")],
                 [value("x", F, ["a", "b"])], [value("s", I64, [2])]).SerializeToString()  # fmt: skip


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("repo")
    outside = tmp_path_factory.mktemp("outside") / "model.onnx"
    outside.write_bytes(GOOD)
    files = {
        "good/config.pbtxt": b"version_policy: { all: {} }",  # both versions (Triton: newest)
        "good/1/model.onnx": GOOD,
        "good/2/model.onnx": _shape_model(),
        "bare.onnx": GOOD,
        "broken/1/model.onnx": b"\x08\x07garbage",
        # the exact engine, by the configuration's parameter: no kernel for Relu, no fallback
        "relu/config.pbtxt": b'parameters { key: "engine" value { string_value: "exact" } }',
        "relu/3/model.onnx": model([helper.make_node("Relu", ["x"], ["y"], name="r")],
                                   [value("x", F, [2])], [value("y", F, [2])]).SerializeToString(),
        "big/1/model.onnx": GOOD * 20,
        "good/notaversion/model.onnx": GOOD,
        "good/0/model.onnx": GOOD,
        "empty/1/README": b"no model here",
    }  # fmt: skip
    for name, data in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(data)
    (root / "escape" / "1").mkdir(parents=True)
    (root / "escape" / "1" / "model.onnx").symlink_to(outside)
    return root


@pytest.fixture(scope="module")
def client(root: Path) -> Iterator[TestClient]:
    settings = Settings(model_repository=root, max_model_bytes=2048, access_log=False)
    with TestClient(create_app(settings), raise_server_exceptions=False) as test_client:
        yield test_client


def test_the_listing(client: TestClient) -> None:
    listing = client.get("/v1/models").json()["models"]
    states = {(m["name"], v["version"]): (v["ready"], v["reason"]) for m in listing
              for v in m["versions"]}  # fmt: skip
    assert set(states) == {("bare", 1), ("big", 1), ("broken", 1), ("empty", 1), ("escape", 1),
                           ("good", 1), ("good", 2), ("relu", 3)}  # fmt: skip
    assert states["good", 1] == states["good", 2] == states["bare", 1] == (True, None)
    assert "not a serialized onnx.ModelProto" in states["broken", 1][1]
    assert "node 'r' (Relu, domain '', version 14)" in states["relu", 3][1]
    assert "over the limit of 2048 (OPSERVE_MAX_MODEL_BYTES)" in states["big", 1][1]
    assert "is a link that leaves the model folder" in states["escape", 1][1]
    assert "version 1 has no model file model.onnx" in states["empty", 1][1]
    good = next(m for m in listing if m["name"] == "good")["versions"][0]
    assert good["inputs"] == [
        {"name": "x", "dtype": "float", "shape": [None, 3], "optional": False},
        {"name": "repeats", "dtype": "int64", "shape": [2], "optional": True},
    ]


def test_runs_newest_and_named_versions(client: TestClient) -> None:
    x = np.arange(3, dtype=np.float32).reshape(1, 3)
    newest = client.post("/v1/models/good/run", json={"inputs": {"x": proto(x)},
                                                      "output_format": "tensor_proto"})  # fmt: skip
    assert newest.status_code == 200, newest.text
    np.testing.assert_array_equal(from_proto(newest.json()["outputs"]["s"]), [1, 3])
    first = client.post("/v1/models/good/versions/1/run", json={"inputs": {"x": proto(x)}})
    assert first.json()["outputs"]["y"] == {"dtype": "float", "shape": [2, 3],
                                            "data": [0.0, 1.0, 2.0, 0.0, 1.0, 2.0]}  # fmt: skip
    bare = client.post("/v1/models/bare/versions/1/run", json={"inputs": {"x": proto(x)},
                                                              "outputs": ["shape"]})  # fmt: skip
    assert bare.json()["outputs"] == {"shape": {"dtype": "int64", "shape": [2], "data": [2, 3]}}


@pytest.mark.parametrize(
    ("path", "status", "words"),
    [
        ("/v1/models/nope/run", 404, "no model 'nope' in the repository; the models are bare"),
        ("/v1/models/good/versions/7/run", 404, "model 'good' has no version 7; its versions "
         "are 1, 2"),
        ("/v1/models/broken/run", 422, "model 'broken' version 1 is not ready: the model is not"),
        ("/v1/models/relu/versions/3/run", 422, "is not ready: model: the service cannot run"),
        ("/v1/models/good/versions/0/run", 422, "version"),
    ],
)  # fmt: skip
def test_refusals(client: TestClient, path: str, status: int, words: str) -> None:
    answer = client.post(path, json={})
    assert answer.status_code == status, answer.text
    assert words in answer.json()["detail"]


def test_a_body_with_model_is_refused_on_a_repository_route(client: TestClient) -> None:
    answer = client.post("/v1/models/good/run", json={"model": EXAMPLE_MODEL})
    assert answer.status_code == 422 and "model" in answer.text


def test_no_repository_and_a_missing_folder(tmp_path: Path, caplog: pytest.LogCaptureFixture
                                            ) -> None:  # fmt: skip
    empty = ModelRepository(None, Settings())
    asyncio.run(empty.start())
    assert empty.names() == []
    with pytest.raises(NotFound):
        empty.get("good")
    with caplog.at_level(logging.ERROR, logger="opserve"):
        missing = ModelRepository(tmp_path / "missing", Settings())
        asyncio.run(missing.start())
    assert missing.names() == [] and "cannot be read" in caplog.text
    for strict, status in ((True, 400), (False, 200)):
        settings = Settings(model_repository=tmp_path / "missing", access_log=False,
                            strict_readiness=strict)  # fmt: skip
        with TestClient(create_app(settings)) as started:  # the service starts all the same
            # strict readiness: a repository with no model ready is not ready
            assert started.get("/v2/health/ready").status_code == status
            assert started.get("/v1/models").json() == {"models": []}


def test_the_interface_the_v2_routes_use(root: Path) -> None:
    repository = ModelRepository(root, Settings(max_model_bytes=2048))
    asyncio.run(repository.start())
    assert repository.names() == ["bare", "big", "broken", "empty", "escape", "good", "relu"]
    assert list(repository.versions("good")) == [1, 2]
    entry = repository.get("good")
    assert (entry.name, entry.version, entry.error) == ("good", 2, None)
    assert entry.model is not None
    assert [(s.name, s.elem_type, s.shape) for s in entry.model.outputs] == [("s", 7, (2,))]
    assert repository.get("broken", 1).model is None


def test_metrics_count_the_ready_model_versions(client: TestClient) -> None:
    """good/1, good/2 and bare/1 loaded; the five others are listed but not ready."""
    text = client.get("/metrics").text
    assert re.search(r"^opserve_models_loaded 3(\.0)?$", text, re.M), text
