"""The V2 routes in-process: readiness before start-up, OpenAPI documentation, headers, the
output limit, and the lane answering the same as FastAPI's documented routes promise."""

import gzip
import json
import threading
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from service.api.v2_lane import V2Wire
from service.codecs import compression
from service.codecs.compression import SHORT_ANSWER_BYTES
from service.engines.onnxruntime.inline import QUICK_RUNS
from service.engines.onnxruntime.model import OrtModel
from service.main import create_app
from service.settings import Settings
from tests.v2.binary_calls import binary_call, binary_output

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from starlette.testclient import TestClient

SMALL = {"inputs": [
    {"name": "input", "shape": [2, 3], "datatype": "FP32", "data": [1, 2, 3, 4, 5, 6]},
    {"name": "repeats", "shape": [2], "datatype": "INT64", "data": [2, 2]},
]}  # fmt: skip


@pytest.fixture(scope="module")
def client() -> Iterator[TestClient]:
    with TestClient(create_app(Settings(max_output_bytes=1 << 20))) as test_client:
        yield test_client


def test_ready_is_400_before_start_up_as_triton_answers() -> None:
    cold = TestClient(create_app())  # no lifespan has run: start-up is not done
    assert cold.get("/v2/health/ready").status_code == 400
    assert cold.get("/v2/health/live").status_code == 200


def test_model_readiness(client: TestClient) -> None:
    answer = client.get("/v2/models/Tile/versions/13/ready")
    assert (answer.status_code, answer.json()) == (200, {"name": "Tile", "ready": True})
    assert client.get("/v2/models/Tile/versions/2/ready").status_code == 404


def test_no_content_type_and_octet_stream_are_accepted(client: TestClient) -> None:
    body = json.dumps(SMALL).encode()
    for headers in ({}, {"Content-Type": "application/octet-stream"}):
        answer = client.post("/v2/models/Tile/infer", content=body, headers=headers)
        assert answer.status_code == 200, answer.text
        assert answer.json()["outputs"][0]["shape"] == [4, 6]


def test_responses_are_compressed_only_when_asked(client: TestClient) -> None:
    """An answer of SHORT_ANSWER_BYTES or more is compressed with the coding the client
    accepts; a shorter one goes as it is, unless the client refuses `identity`."""
    long = json.dumps({"inputs": [SMALL["inputs"][0], {**SMALL["inputs"][1], "data": [8, 8]}]})
    for body, short in ((long.encode(), False), (json.dumps(SMALL).encode(), True)):
        plain = client.post(
            "/v2/models/Tile/infer", content=body, headers={"Accept-Encoding": "identity"}
        )
        assert "content-encoding" not in plain.headers
        assert (len(plain.content) < SHORT_ANSWER_BYTES) == short
        asked = client.post("/v2/models/Tile/infer", content=body,
                            headers={"Accept-Encoding": "br, gzip;q=0.5"})  # fmt: skip
        assert asked.headers.get("content-encoding") == (None if short else "gzip")
        refused = client.post("/v2/models/Tile/infer", content=body,
                              headers={"Accept-Encoding": "gzip;q=0, deflate"})  # fmt: skip
        assert refused.headers.get("content-encoding") == (None if short else "deflate")
        assert asked.json() == refused.json() == plain.json()
        for insisted in ("gzip, identity;q=0", "gzip, *;q=0"):
            answer = client.post("/v2/models/Tile/infer", content=body,
                                 headers={"Accept-Encoding": insisted})  # fmt: skip
            assert answer.headers["content-encoding"] == "gzip"
            assert answer.json() == plain.json()


def test_several_accept_encoding_lines_are_one_list(client: TestClient) -> None:
    """Accept-Encoding sent on two lines is read as one list (RFC 9110, 5.3), on the one step
    (a small JSON body) and on the general path (a gzip body) alike: reading only the last
    line would send the first answer as it is, and the second (under SHORT_ANSWER_BYTES, the
    client refusing identity on its second line) as it is too."""
    long = json.dumps({"inputs": [SMALL["inputs"][0], {**SMALL["inputs"][1], "data": [8, 8]}]})
    for body, lines, coding in (
        (long, [("Accept-Encoding", "deflate"), ("Accept-Encoding", "br")], "deflate"),
        (json.dumps(SMALL), [("Accept-Encoding", "gzip"), ("Accept-Encoding", "identity;q=0")],
         "gzip"),
    ):  # fmt: skip
        plain = client.post("/v2/models/Tile/infer", content=body,
                            headers={"Accept-Encoding": "identity"})  # fmt: skip
        json_type = [("Content-Type", "application/json")]  # the one step's own media type
        for sent, extra in ((body.encode(), json_type), (gzip.compress(body.encode()),
                                                         [("Content-Encoding", "gzip")])):  # fmt: skip
            answer = client.post("/v2/models/Tile/infer", content=sent, headers=lines + extra)
            assert answer.status_code == 200, answer.text
            assert answer.headers.get("content-encoding") == coding, (lines, extra)
            assert answer.json() == plain.json()


@pytest.fixture
def deflated_on(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The threads compression.deflate ran on, call by call, while the test runs."""
    seen: list[str] = []
    deflate = compression.deflate

    def recording(*args: Any) -> list[bytes]:
        seen.append(threading.current_thread().name)
        return deflate(*args)

    monkeypatch.setattr(compression, "deflate", recording)
    return seen


def test_a_long_answer_is_compressed_on_a_thread_and_its_model_not_run_again(
    tmp_path: Path,
    deflated_on: list[str],
) -> None:
    """A small call whose answer, made inline, is too long to compress on the event loop
    (INLINE_COMPRESSED_BYTES) is compressed on a kernel thread: zlib took 34 ms for 1 MiB of
    random float32 here, on every other client's time. The model runs once (inline), the
    outputs the thread encodes are held in the memory budget meanwhile, and the answer is the
    model's, compressed; a shorter answer is compressed inline."""
    f, i64 = TensorProto.FLOAT, TensorProto.INT64
    graph = helper.make_graph(
        [helper.make_node("Tile", ["x", "r"], ["t"]),
         helper.make_node("RandomUniformLike", ["t"], ["y"], seed=1.0)],
        "g", [helper.make_tensor_value_info("x", f, [1, 1024]),
              helper.make_tensor_value_info("r", i64, [2])],
        [helper.make_tensor_value_info("y", f, [1, "n"])],
    )  # fmt: skip
    (tmp_path / "noise" / "1").mkdir(parents=True)
    (tmp_path / "noise" / "config.pbtxt").write_text(
        'parameters { key: "engine" value { string_value: "onnxruntime" } }\n'
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]),
              tmp_path / "noise" / "1" / "model.onnx")  # fmt: skip
    held: list[int] = []
    encode = V2Wire.encode

    def holding(wire: V2Wire, call: Any, result: Any, ctx: Any) -> Any:
        if ctx.claims is not None:  # on a thread: what the request holds of the budget
            held.append(ctx.claims.held)
        return encode(wire, call, result, ctx)

    runs: list[int] = []
    session_run = OrtModel._session_run

    def counted(*args: Any) -> Any:
        runs.append(1)
        return session_run(*args)

    x = np.zeros((1, 1024), np.float32)
    with TestClient(create_app(Settings(model_repository=str(tmp_path)))) as client:
        for tiles, on_thread in ((1, False), (64, True)):  # answers of 4 KiB, 256 KiB
            r = np.array([1, tiles], np.int64)
            call = binary_call({"x": x, "r": r}, "y")
            for _ in range(QUICK_RUNS):  # a model runs inline once it was quick this often
                assert client.post("/v2/models/noise/infer", **call).status_code == 200
            deflated_on.clear()
            runs.clear()
            held.clear()
            with pytest.MonkeyPatch.context() as patch:
                patch.setattr(OrtModel, "_session_run", counted)
                patch.setattr(V2Wire, "encode", holding)
                answer = client.post("/v2/models/noise/infer", **call)
            assert answer.status_code == 200, answer.text
            assert answer.headers["content-encoding"] == "gzip"  # httpx inflated it
            y = binary_output(answer)
            assert y.shape == (1024 * tiles,) and y.min() >= 0.0 and y.max() < 1.0
            assert y.std() > 0.2  # uniform on [0, 1): 0.29
            assert deflated_on and deflated_on[-1].startswith("opserve-kernel") == on_thread, (
                deflated_on
            )
            assert len(runs) == 1  # the model ran once, inline
            assert bool(held) == on_thread and all(h >= y.nbytes for h in held), held


def test_a_binary_answer_of_the_whole_inline_allowance_is_compressed_on_a_thread(
    deflated_on: list[str],
) -> None:
    """A small call's binary output may take the whole inline allowance (1 MiB): its answer,
    in parts even inline, is compressed on a kernel thread too."""
    x = np.random.default_rng(0).random(1024, dtype=np.float32)
    r = np.array([256], np.int64)  # 1 MiB of float32
    with TestClient(create_app()) as client:
        answer = client.post("/v2/models/Tile/versions/13/infer",
                             **binary_call({"input": x, "repeats": r}, "output"))  # fmt: skip
    assert answer.status_code == 200 and answer.headers["content-encoding"] == "gzip"
    np.testing.assert_array_equal(binary_output(answer), np.tile(x, 256))
    assert deflated_on and all(name.startswith("opserve-kernel") for name in deflated_on), (
        deflated_on
    )


def test_an_output_over_the_limit_is_413(client: TestClient) -> None:
    body = {"inputs": [{"name": "input", "shape": [2], "datatype": "INT64", "data": [1024, 1024]}]}
    answer = client.post("/v2/models/ConstantOfShape/infer", json=body)
    assert answer.status_code == 413
    assert answer.json()["error"].startswith("ConstantOfShape-25: ")


def test_a_large_gzip_request_runs(client: TestClient) -> None:
    data = list(range(100_000))  # a body over the inline size once inflated
    body = {"inputs": [{"name": "data", "shape": [100_000], "datatype": "INT32", "data": data}]}
    answer = client.post("/v2/models/Shape/infer", content=gzip.compress(json.dumps(body).encode()),
                         headers={"Content-Encoding": "gzip"})  # fmt: skip
    assert answer.status_code == 200 and answer.json()["outputs"][0]["data"] == [100_000]


def test_the_v2_routes_are_documented(client: TestClient) -> None:
    paths = client.get("/openapi.json").json()["paths"]
    for path, method in [("/v2", "get"), ("/v2/models/{name}", "get"),
                         ("/v2/models/{name}/versions/{version}", "get"),
                         ("/v2/models/{name}/ready", "get"),
                         ("/v2/models/{name}/versions/{version}/ready", "get"),
                         ("/v2/models/{name}/infer", "post"),
                         ("/v2/models/{name}/versions/{version}/infer", "post")]:  # fmt: skip
        operation = paths[path][method]
        assert operation["tags"] == ["KServe V2"] and operation["description"]
    infer = paths["/v2/models/{name}/versions/{version}/infer"]["post"]
    assert infer["requestBody"]["content"]["application/json"]["schema"]["$ref"].endswith(
        "/InferenceRequest"
    )
    assert {"400", "404", "413", "415"} <= set(infer["responses"])


@pytest.mark.parametrize(("path", "value"), [
    ("/v2/models/Constant/versions/1", {"shape": [-1], "optional": False}),
    ("/v2/models/Constant/versions/25", {"shape": [-1], "optional": True}),
    ("/v2/models/ConstantOfShape/versions/20", {"shape": [1], "optional": True}),
])  # fmt: skip
def test_a_tensor_attribute_is_listed_as_an_input(client: TestClient, path: str,
                                                 value: dict) -> None:  # fmt: skip
    metadata = client.get(path).json()
    entry = next(i for i in metadata["inputs"] if i["name"] == "value")
    assert {k: entry[k] for k in value} == value
    assert entry["datatype"] == entry["datatypes"][0] == "FP32" and "FP16" in entry["datatypes"]
    attribute = next(a for a in metadata["attributes"] if a["name"] == "value")
    assert attribute == {"name": "value", "type": "TENSOR", "required": not value["optional"],
                         "travels_as": "input"}  # fmt: skip


def test_unknown_top_level_fields_are_ignored(client: TestClient) -> None:
    """The KServe SDK puts `model_name` in every body; Triton ignores what it does not use."""
    body = {**SMALL, "model_name": "Tile", "some_extension": {"x": 1}}
    answer = client.post("/v2/models/Tile/infer", json=body)
    assert answer.status_code == 200, answer.text
    assert answer.json()["outputs"][0]["shape"] == [4, 6]


@pytest.mark.parametrize(("parameters", "status", "words"), [
    ({"sequence_id": 7, "sequence_start": True, "priority": 1, "timeout": 5}, 200, None),
    ({"triton_enable": True}, 400, "parameter keys starting with 'triton_' are reserved"),
    ({"nope": 1}, 400, "no attribute 'nope'"),
])  # fmt: skip
def test_reserved_parameters_on_an_operator(client: TestClient, parameters: dict, status: int,
                                            words: str | None) -> None:  # fmt: skip
    """Triton's reserved parameters are taken and ignored by a model they mean nothing to (an
    operator has no sequences); triton_ keys are Triton's own; other names are attributes."""
    answer = client.post("/v2/models/Tile/infer", json={**SMALL, "parameters": parameters})
    assert answer.status_code == status, answer.text
    if words:
        assert words in answer.json()["error"]
