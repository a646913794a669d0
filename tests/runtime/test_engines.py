"""Issue 27, item 1: the engine each kind of model runs on, chosen when it loads (repository
models on onnxruntime unless their configuration asks for the exact engine or onnxruntime cannot
run them, with the reason shown; posted models on the exact engine unless the body asks), and
item 4: the metrics name each version's engine."""

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from fastapi.testclient import TestClient
from onnx import TensorProto, helper

from service.engines.onnxruntime.session import SPINNING, cores
from service.errors import ServiceError
from service.main import create_app
from service.settings import Settings

from .models import I64, F, b64, model, value

BF16 = TensorProto.BFLOAT16
EXACT = b'max_batch_size: 0 parameters { key: "engine" value { string_value: "exact" } }'
SPINS = b'parameters { key: "session.intra_op.allow_spinning" value { string_value: "%s" } }'


def _relu(elem: int = F) -> bytes:
    return model([helper.make_node("Relu", ["x"], ["y"], name="relu")],
                 [value("x", elem, [None])], [value("y", elem, [None])]).SerializeToString()  # fmt: skip


def _tile(elem: int = F) -> bytes:
    return model([helper.make_node("Tile", ["x", "r"], ["y"], name="tile")],
                 [value("x", elem, [None]), value("r", I64, [1])],
                 [value("y", elem, [None])]).SerializeToString()  # fmt: skip


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestClient]:
    root: Path = tmp_path_factory.mktemp("engines")
    files = {
        "relu/1/model.onnx": _relu(),  # no configuration: auto-completed, onnxruntime
        "asked/config.pbtxt": EXACT,
        "asked/1/model.onnx": _tile(),
        "bf16_tile/1/model.onnx": _tile(BF16),  # onnxruntime's binding lacks bfloat16
        "neither/1/model.onnx": _relu(BF16),  # no kernel, no fallback, no bfloat16 on ort
        "unknown/config.pbtxt": b'parameters { key: "engine" value { string_value: "trt" } }',
        "unknown/1/model.onnx": _relu(),
        "spins/config.pbtxt": SPINS % b"1",  # the operator's spinning pool
        "spins/1/model.onnx": _relu(),
        "spins_wrong/config.pbtxt": SPINS % b"yes",
        "spins_wrong/1/model.onnx": _relu(),
    }
    for name, data in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(data)
    settings = Settings(model_repository=root, access_log=False, strict_readiness=False)
    with TestClient(create_app(settings), raise_server_exceptions=False) as test_client:
        yield test_client


def _config(client: TestClient, name: str) -> dict:
    return client.get(f"/v2/models/{name}/config").json()["parameters"]


def _run(client: TestClient, name: str, **inputs: list) -> dict:
    # auto-complete batches the relu's [n] input: n requests of one element each
    tensors = [{"name": k, "shape": [len(v), 1] if name in ("relu", "spins") else [len(v)],
                "datatype": "INT64" if k == "r" else "FP32", "data": v}
               for k, v in inputs.items()]  # fmt: skip
    answer = client.post(f"/v2/models/{name}/infer", json={"inputs": tensors})
    assert answer.status_code == 200, answer.text
    return answer.json()["outputs"][0]


def test_a_repository_model_runs_on_onnxruntime_by_default(client: TestClient) -> None:
    assert _config(client, "relu") == {"engine": {"string_value": "onnxruntime"}}
    assert _run(client, "relu", x=[-1.0, 2.0])["data"] == [0.0, 2.0]
    ran = client.post("/v1/models/relu/run", json={"inputs": {"x": {"dtype": "float",
                                                                   "data": [-3, 4]}}})  # fmt: skip
    assert ran.json()["nodes"] == [{"name": "relu", "op_type": "Relu", "domain": "",
                                    "version": 14, "ran_on": "onnxruntime"}]  # fmt: skip
    (version,) = next(m for m in client.get("/v1/models").json()["models"]
                      if m["name"] == "relu")["versions"]  # fmt: skip
    assert version["engine"] == "onnxruntime" and version["engine_reason"] is None


def test_the_configuration_asks_for_the_exact_engine(client: TestClient) -> None:
    assert _config(client, "asked") == {"engine": {"string_value": "exact"}}
    assert _run(client, "asked", x=[1.0, 2.0], r=[2])["data"] == [1.0, 2.0, 1.0, 2.0]
    ran = client.post("/v1/models/asked/run", json={"inputs": {
        "x": {"dtype": "float", "data": [1]}, "r": {"dtype": "int64", "data": [1]}}})  # fmt: skip
    assert ran.json()["nodes"][0]["ran_on"] == "kernel"


def test_what_onnxruntime_cannot_run_falls_back_with_its_reason(client: TestClient) -> None:
    parameters = _config(client, "bf16_tile")
    assert parameters["engine"] == {"string_value": "exact"}
    reason = parameters["engine_reason"]["string_value"]
    assert "onnxruntime cannot run it" in reason and "BFLOAT16" in reason, reason
    rows = client.post("/v2/repository/index", json={}).json()
    (row,) = [r for r in rows if r["name"] == "bf16_tile"]
    assert row["state"] == "READY" and row["reason"] == reason
    assert not [r for r in rows if r["name"] == "relu" and "reason" in r]
    listed = next(m for m in client.get("/v1/models").json()["models"]
                  if m["name"] == "bf16_tile")["versions"][0]  # fmt: skip
    assert listed["engine"] == "exact" and listed["engine_reason"] == reason
    ran = client.post("/v1/models/bf16_tile/run", json={"inputs": {
        "x": {"dtype": "bfloat16", "data": [1.5]}, "r": {"dtype": "int64", "data": [2]}}})  # fmt: skip
    assert ran.json()["outputs"]["y"]["data"] == [1.5, 1.5], ran.text


def test_a_model_neither_engine_runs_is_refused_with_both_reasons(client: TestClient) -> None:
    rows = client.post("/v2/repository/index", json={}).json()
    (row,) = [r for r in rows if r["name"] == "neither"]
    assert row["state"] == "UNAVAILABLE"
    assert "OPSERVE_REFERENCE_FALLBACK is off" in row["reason"]
    assert "onnxruntime cannot run it" in row["reason"] and "BFLOAT16" in row["reason"]
    (row,) = [r for r in rows if r["name"] == "unknown"]
    assert row["state"] == "UNAVAILABLE" and "'trt'; the engines are" in row["reason"]


def test_the_spinning_parameter_reaches_the_session_and_is_checked(client: TestClient) -> None:
    """The parameter travels from the repository's configuration to the model's sessions
    (what it does to them: tests/runtime/test_ort_threads.py); a value that is not
    onnxruntime's "0" or "1" fails the load with the reason."""
    parameters = _config(client, "spins")
    assert parameters["session.intra_op.allow_spinning"] == {"string_value": "1"}
    assert parameters["engine"] == {"string_value": "onnxruntime"}
    sessions = client.app.state.repository.get("spins").model.session.sessions  # type: ignore[attr-defined]
    spins = {count: session.get_session_options().get_session_config_entry(SPINNING)
             for count, session in sessions.items()}  # fmt: skip
    if len(sessions) == 2:  # every core's spins, the share's does not (two cores or more)
        assert spins[cores()] == "1" and spins[min(sessions)] == "0", spins
    else:  # one core: one session, which never spins
        assert list(spins.values()) == ["0"], spins
    assert _run(client, "spins", x=[-1.0, 2.0])["data"] == [0.0, 2.0]
    rows = client.post("/v2/repository/index", json={}).json()
    (row,) = [r for r in rows if r["name"] == "spins_wrong"]
    assert row["state"] == "UNAVAILABLE"
    assert "'session.intra_op.allow_spinning' is 'yes'; it is '1'" in row["reason"], row


def _posted(client: TestClient, built: bytes, **options: object):  # type: ignore[no-untyped-def]
    from onnx import ModelProto

    parsed = ModelProto()
    parsed.ParseFromString(built)
    body = {"model": b64(parsed), "inputs": {"x": {"dtype": "float", "data": [-1, 2]},
                                             "r": {"dtype": "int64", "data": [1]}}, **options}  # fmt: skip
    return client.post("/v1/models/run", json=body)


def test_posted_models_take_the_engine_they_ask_for(client: TestClient) -> None:
    default = _posted(client, _tile())
    assert default.json()["nodes"][0]["ran_on"] == "kernel", default.text
    ort = _posted(client, _tile(), engine="onnxruntime")
    assert ort.json()["nodes"][0]["ran_on"] == "onnxruntime", ort.text
    assert ort.json()["outputs"] == default.json()["outputs"]
    traced = _posted(client, _tile(), engine="onnxruntime", trace=True)
    assert traced.json()["nodes"][0]["ran_on"] == "kernel" and traced.json()["trace"]
    refused = _posted(client, _tile(BF16), engine="onnxruntime")
    assert refused.status_code == 422 and "BFLOAT16" in refused.text, refused.text
    unknown = _posted(client, _tile(), engine="trt")
    assert unknown.status_code == 422 and "engine" in unknown.text


def test_a_repository_run_takes_no_engine_field(client: TestClient) -> None:
    answer = client.post("/v1/models/relu/run", json={"engine": "exact"})
    assert answer.status_code == 422 and "engine" in answer.text


def test_the_metrics_name_each_versions_engine(client: TestClient) -> None:
    text = client.get("/metrics").text
    assert 'opserve_model_engine{engine="onnxruntime",model="relu",version="1"} 1.0' in text
    assert 'opserve_model_engine{engine="exact",model="bf16_tile",version="1"} 1.0' in text
    assert 'model="neither"' not in text


def test_posted_sessions_are_kept_by_digest_and_bounded() -> None:
    from service.engines.choice import PostedSessions

    sessions, settings = PostedSessions(), Settings(onnxruntime_sessions=2)
    models = [_relu(), _tile(), model([helper.make_node("Neg", ["x"], ["y"])], [value("x", F, [1])],
                                      [value("y", F, [1])]).SerializeToString()]  # fmt: skip
    first = sessions.model(models[0], settings)
    assert sessions.model(models[0], settings) is first  # by digest: made once
    for data in models[1:]:
        sessions.model(data, settings)
    assert len(sessions.models) == 2 and sessions.model(models[0], settings) is not first
    x = np.array([-1.0], np.float32)
    isolated = sessions.model(models[2], settings)  # a client's: for the workers only
    assert isolated.engine == "onnxruntime" and isolated.isolated
    with pytest.raises(ServiceError, match="runs only in the isolated workers"):
        isolated.run({"x": x})  # never in this process
    trusted = Settings(onnxruntime_sessions=2, client_models_in_process=True)
    in_process = PostedSessions().model(models[2], trusted)
    assert not in_process.isolated and in_process.run({"x": x}).outputs["y"].tolist() == [1.0]


def test_posted_models_alike_at_both_ends_are_told_apart() -> None:
    """The lookup keys on a model's length and ends: two models that differ only in the
    middle (one weight) are two models, each answering with its own weight."""
    from onnx import numpy_helper

    from service.engines.choice import PostedSessions

    def adding(weight: float) -> bytes:
        weights = np.ones(256, np.float32)
        weights[128] = weight
        graph = model([helper.make_node("Add", ["x", "w"], ["y"])], [value("x", F, [256])],
                      [value("y", F, [256])])  # fmt: skip
        graph.graph.initializer.append(numpy_helper.from_array(weights, "w"))
        return graph.SerializeToString()

    one, two = adding(1.0), adding(2.0)
    edge = PostedSessions.EDGE
    assert len(one) == len(two) and one[:edge] == two[:edge] and one[-edge:] == two[-edge:]
    assert one != two
    trusted = Settings(onnxruntime_sessions=2, client_models_in_process=True)
    sessions = PostedSessions()
    x = np.zeros(256, np.float32)
    answers = [sessions.model(data, trusted).run({"x": x}).outputs["y"][128]
               for data in (one, two, one, two)]  # fmt: skip
    assert answers == [1.0, 2.0, 1.0, 2.0]
    assert len(sessions.models) == 2
    (candidates,) = sessions.lookup.values()  # one key, both models behind it
    assert len(candidates) == 2
    sessions.model(adding(3.0), trusted)  # a third: the least recently used goes
    assert len(sessions.models) == 2
    assert sum(len(digests) for digests in sessions.lookup.values()) == 2
