"""Each documented route shows its own answers: the 200, 404, 413 and 422 examples in the
OpenAPI document are exactly what the service answers to the matching requests."""

from typing import Any

import orjson
import pytest
from starlette.testclient import TestClient

from service.api import examples
from service.main import create_app
from service.operators import registry
from service.settings import Settings

LIMIT = 4096  # a small body limit, so the 413 can be provoked with a small body
APP = create_app(Settings(max_request_bytes=LIMIT))
DOCUMENT = APP.openapi()
RUNS = [
    (path, item["post"])
    for path, item in DOCUMENT["paths"].items()
    if path.startswith("/v1/ops/") and "post" in item
]
JSON = {"content-type": "application/json"}
FILLED = {"/v1/ops/{op_type}/{version}": "/v1/ops/Shape/17", "/v1/ops/{op_type}": "/v1/ops/Shape"}


@pytest.fixture(scope="module")
def client() -> Any:
    with TestClient(APP, raise_server_exceptions=False) as test_client:
        yield test_client


def _example(operation: dict[str, Any], status: int) -> Any:
    return operation["responses"][str(status)]["content"]["application/json"]["example"]


def _request_example(operation: dict[str, Any]) -> Any:
    ref = operation["requestBody"]["content"]["application/json"]["schema"]["$ref"]
    schema = DOCUMENT["components"]["schemas"][ref.rsplit("/", 1)[-1]]
    return schema["examples"][0]


def test_every_run_route_is_checked() -> None:
    per_version = sum(len(vs) for _, _, vs in registry.operators())
    assert len(RUNS) == per_version + 2  # and the opset and newest forms


@pytest.mark.parametrize(("path", "operation"), RUNS, ids=[p for p, _ in RUNS])
def test_ok_example_is_the_answer_to_the_request_example(
    client: TestClient, path: str, operation: dict[str, Any]
) -> None:
    url = FILLED.get(path, path)
    shown = _example(operation, 200)
    answer = client.post(url, json=_request_example(operation))
    assert answer.status_code == 200, answer.text
    assert answer.json() == shown
    if path not in FILLED:  # a version's own route shows that version's answer
        op_type, since = path.removeprefix("/v1/ops/").split("/")
        assert (shown["op_type"], shown["version"]) == (op_type, int(since))


@pytest.mark.parametrize(("path", "operation"), RUNS, ids=[p for p, _ in RUNS])
def test_error_examples_are_the_errors_the_route_answers(
    client: TestClient, path: str, operation: dict[str, Any]
) -> None:
    url = FILLED.get(path, path)
    op = registry.resolve(*_op_and_opset(url))
    unknown = client.post(url, content=orjson.dumps(
        {"inputs": {"nope": {"dtype": "float", "data": [1.0]}}}), headers=JSON)  # fmt: skip
    assert unknown.status_code == 422
    assert unknown.json() == _example(operation, 422)

    padded = b'{"inputs": {}}' + b" " * (2 * LIMIT)
    too_big = client.post(url, content=padded, headers=JSON)
    assert too_big.status_code == 413
    assert too_big.json() == examples.too_large_example(LIMIT, op.name, len(padded))
    shown = _example(operation, 413)
    assert shown == {"detail": examples.too_large_example(LIMIT, op.name)["detail"]}
    assert f"over the limit of {LIMIT} bytes" in shown["detail"]

    as_text = client.post(url, content=b"{}", headers={"content-type": "text/plain"})
    assert as_text.status_code == 415
    assert _shown(as_text.json()) == _example(operation, 415)
    for status in (408, 503):  # shown with the route's own version and the configured limits
        shown = _example(operation, status)["detail"]
        assert shown.startswith(f"{op.name}: ") and str(status) not in shown[:4]
    assert "within 60 s" in _example(operation, 408)["detail"]
    assert "retry" in _example(operation, 503)["detail"]

    if path in FILLED:
        misspelt = url.replace("Shape", "shape")
        answer = client.post(misspelt, json={})
        assert answer.status_code == 404
        assert answer.json()["detail"] == _example(operation, 404)["detail"]
    else:
        assert "404" not in operation["responses"], "a served version's route cannot 404"


def test_describe_route_shows_a_404(client: TestClient) -> None:
    operation = DOCUMENT["paths"]["/v1/ops/{op_type}/{version}"]["get"]
    answer = client.get("/v1/ops/shape/17")
    assert answer.status_code == 404
    assert answer.json()["detail"] == _example(operation, 404)["detail"]


def _shown(answer: dict[str, Any]) -> dict[str, Any]:
    """An answer as the document shows it: FastAPI leaves out fields that are null."""
    return {key: value for key, value in answer.items() if value is not None}


def _op_and_opset(url: str) -> tuple[str, int | None]:
    op_type, _, opset = url.removeprefix("/v1/ops/").partition("/")
    return op_type, int(opset) if opset else None
