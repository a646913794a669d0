"""A readiness that is false says why (service/core/readiness.py): `/v2/health/ready` and
`/v2/models/{m}/ready` keep Triton's 400 and carry the reason in their JSON error, and the log
says it once, whichever door asked (the gRPC health check too), on a real server."""

import json
import shutil
import urllib.error
import urllib.request
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tests.api.live_server import ROOT, free_port, serve

EXAMPLES = ROOT / "examples" / "model_repository"


def _get(url: str, method: str = "GET") -> tuple[int, dict]:
    request = urllib.request.Request(url, method=method, data=b"" if method == "POST" else None)
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            body = answer.read()
            return answer.status, json.loads(body) if body else {}
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def _reasons(log: Path) -> list[str]:
    lines = [json.loads(line) for line in log.read_text().splitlines() if line.startswith("{")]
    return [line["message"] for line in lines if line["message"].startswith("not ready: ")]


def test_explicit_mode_without_start_up_models_says_what_to_set(tmp_path: Path) -> None:
    log, grpc_port = tmp_path / "opserve.log", free_port()
    with serve(wait_path="/v2/health/live", log_to=log, model_repository=str(EXAMPLES),
               model_control_mode="explicit", grpc_port=str(grpc_port)) as server:  # fmt: skip
        for _ in range(3):
            status, body = _get(f"{server.url}/v2/health/ready")
            assert status == 400 and body["ready"] is False
            assert body["error"].startswith("Server not ready: ")
            assert "OPSERVE_LOAD_MODELS" in body["error"], body
        with grpc.insecure_channel(f"127.0.0.1:{grpc_port}") as channel:
            check = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest())
            assert check.status == health_pb2.HealthCheckResponse.NOT_SERVING
        status, _ = _get(f"{server.url}/v2/models/simple_sequence/ready")
        assert status == 404  # never loaded: unknown, as Triton answers
        # the reason's advice, followed, is what makes the server ready (the oracle)
        status, _ = _get(f"{server.url}/v2/repository/models/tile_shape/load", "POST")
        assert status == 200
        assert _get(f"{server.url}/v2/health/ready") == (200, {"ready": True})
        assert _get(f"{server.url}/v2/models/tile_shape/ready") == (
            200, {"name": "tile_shape", "ready": True})  # fmt: skip
        status, _ = _get(f"{server.url}/v2/repository/models/tile_shape/unload", "POST")
        assert status == 200
        status, body = _get(f"{server.url}/v2/models/tile_shape/ready")
        assert status == 400 and body["name"] == "tile_shape" and body["ready"] is False
        assert "model 'tile_shape' is not ready: unloaded" in body["error"], body
        reasons = _reasons(log)
    server_reasons = [r for r in reasons if "OPSERVE_LOAD_MODELS" in r]
    assert len(server_reasons) == 1, reasons  # three HTTP asks and a gRPC one: logged once
    assert [r for r in reasons if "'tile_shape' is not ready" in r], reasons


def test_a_model_that_failed_to_load_is_named(tmp_path: Path) -> None:
    root = tmp_path / "models"
    shutil.copytree(EXAMPLES / "tile_shape", root / "tile_shape")
    (root / "broken" / "1").mkdir(parents=True)
    (root / "broken" / "1" / "model.onnx").write_bytes(b"not an onnx model")
    with serve(wait_path="/v2/health/live", model_repository=str(root)) as server:
        status, body = _get(f"{server.url}/v2/health/ready")
        assert status == 400 and "failed to load: broken" in body["error"], body
        assert "tile_shape" not in body["error"]  # ready, so not named
        status, body = _get(f"{server.url}/v2/models/broken/ready")
        assert status == 400 and "model 'broken' is not ready: " in body["error"], body
        assert len(body["error"]) > len("Model version not ready: model 'broken' is not ready: x")
