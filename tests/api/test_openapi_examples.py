"""Every example the OpenAPI document holds is valid, and every request example runs (200)."""

import base64
import re
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi import FastAPI
from jsonschema import Draft202012Validator
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT202012
from starlette.testclient import TestClient

from api_schemas.models import EXAMPLE_MODEL, ModelRunResponse
from api_schemas.responses import OpResponse
from api_schemas.v2 import InferenceResponse
from service.main import create_app
from service.operators import registry
from service.settings import Settings

DOCUMENT = create_app().openapi()
SCHEMAS = DOCUMENT["components"]["schemas"]
OPERATORS = {op_type: [v.since_version for v in vs] for _, op_type, vs in registry.operators()}
PER_VERSION = re.compile(r"^/v1/ops/(?P<op>\w+)/(?P<since>\d+)$")


def _operations() -> Iterator[tuple[str, str, dict[str, Any]]]:
    for path, item in DOCUMENT["paths"].items():
        for method, operation in item.items():
            yield path, method, operation


def _body_schema(operation: dict[str, Any]) -> tuple[str, dict[str, Any]] | None:
    body = operation.get("requestBody")
    if body is None:
        return None
    ref = body["content"]["application/json"]["schema"]["$ref"]
    name = ref.rsplit("/", 1)[-1]
    return name, SCHEMAS[name]


def _request_examples() -> list[Any]:
    """(path, example body) for each request example an operation's body schema documents."""
    cases = []
    for path, method, operation in _operations():
        found = _body_schema(operation)
        if found is None:
            continue
        name, schema = found
        media = operation["requestBody"]["content"]["application/json"]
        bodies = [
            *schema.get("examples", []),
            *(e["value"] for e in media.get("examples", {}).values()),
        ]
        if "example" in media:
            bodies.append(media["example"])
        for index, body in enumerate(bodies):
            cases.append(pytest.param(path, method, operation, body, id=f"{path}[{name}#{index}]"))
    return cases


def _fill_path(path: str, operation: dict[str, Any]) -> str:
    """A templated path with each path parameter set to its documented example."""
    for param in operation.get("parameters", []):
        if param["in"] == "path":
            example = (param.get("examples") or param["schema"]["examples"])[0]
            path = path.replace("{" + param["name"] + "}", str(example))
    return path


@pytest.fixture(scope="module")
def app(tmp_path_factory: pytest.TempPathFactory) -> FastAPI:
    """The app with a repository holding the model the examples name (`tile_shape`), as a
    deployment that follows docs/models.md has, so Swagger's Execute works on every route."""
    repository = tmp_path_factory.mktemp("repository")
    (repository / "tile_shape" / "1").mkdir(parents=True)
    (repository / "tile_shape" / "1" / "model.onnx").write_bytes(base64.b64decode(EXAMPLE_MODEL))
    return create_app(Settings(model_repository=repository))


def test_document_header() -> None:
    info = DOCUMENT["info"]
    assert info["title"] == "opserve"
    assert re.fullmatch(r"\d+\.\d+\.\d+.*", info["version"])
    assert "Swagger" not in info["description"] and len(info["description"]) > 100


def test_one_tag_per_operator_and_a_route_per_version() -> None:
    tagged: dict[str, set[str]] = {}
    for path, _method, operation in _operations():
        for tag in operation.get("tags", []):
            tagged.setdefault(tag, set()).add(path)
    for op_type, versions in OPERATORS.items():
        assert tagged.get(op_type) == {f"/v1/ops/{op_type}/{v}" for v in versions}
    declared = {tag["name"]: tag for tag in DOCUMENT.get("tags", [])}
    assert set(OPERATORS) <= set(declared), "every operator tag is declared with a description"
    assert all(declared[op]["description"] for op in OPERATORS)


def test_path_parameters_are_exactly_the_templated_ones() -> None:
    wrong = {}
    for path, method, operation in _operations():
        declared = {p["name"] for p in operation.get("parameters", []) if p["in"] == "path"}
        if declared != set(re.findall(r"{(\w+)}", path)):
            wrong[f"{method.upper()} {path}"] = sorted(declared)
    assert not wrong, wrong


@pytest.mark.parametrize(
    "operation",
    [
        pytest.param(op, id=f"{m.upper()} {p}") for p, m, op in _operations()
    ],
)  # fmt: skip
def test_every_operation_has_summary_and_description(operation: dict[str, Any]) -> None:
    assert operation.get("summary")
    assert operation.get("description"), f"{operation['operationId']} has no description"


def test_every_operation_with_a_body_has_an_example() -> None:
    missing = [
        f"{method.upper()} {path}"
        for path, method, operation in _operations()
        if (found := _body_schema(operation)) and not found[1].get("examples")
    ]
    assert not missing


def _examples_in(node: Any, pointer: str) -> Iterator[tuple[str, int, Any]]:
    """(JSON pointer of the schema, index, example) for every `examples` list in the document."""
    if isinstance(node, dict):
        if isinstance(node.get("examples"), list):
            for index, example in enumerate(node["examples"]):
                yield pointer, index, example
        for key, value in node.items():
            if key not in {"examples", "example"}:
                escaped = key.replace("~", "~0").replace("/", "~1")
                yield from _examples_in(value, f"{pointer}/{escaped}")
    elif isinstance(node, list):
        for index, value in enumerate(node):
            yield from _examples_in(value, f"{pointer}/{index}")


ALL_EXAMPLES = list(_examples_in(DOCUMENT, ""))
BASE = "urn:opserve:openapi"
RESOURCE_REGISTRY = Registry().with_resource(BASE, Resource(DOCUMENT, DRAFT202012))


def test_the_document_holds_examples() -> None:
    assert len(ALL_EXAMPLES) >= 20


@pytest.mark.parametrize(
    ("pointer", "index", "example"), ALL_EXAMPLES, ids=[f"{p}#{i}" for p, i, _ in ALL_EXAMPLES]
)
def test_example_is_valid_against_its_own_schema(pointer: str, index: int, example: Any) -> None:
    schema = {"$ref": f"{BASE}#{pointer}"}  # refs inside resolve against the whole document
    Draft202012Validator(schema, registry=RESOURCE_REGISTRY).validate(example)


@pytest.mark.parametrize(("path", "method", "operation", "body"), _request_examples())
def test_request_example_runs(
    client: TestClient, path: str, method: str, operation: dict[str, Any], body: Any
) -> None:
    url = _fill_path(path, operation)
    answer = client.request(method, url, json=body)
    assert answer.status_code == 200, answer.text
    if url.startswith("/v1/models/"):
        ran = ModelRunResponse.model_validate_json(answer.content)
        assert set(ran.outputs) == set(body.get("outputs") or ["y", "shape"])
        # posted models run on the exact engine by default, repository ones on onnxruntime
        engine = "kernel" if url == "/v1/models/run" else "onnxruntime"
        assert [n.ran_on for n in ran.nodes] == [engine, engine]
        return
    if path.startswith("/v2/"):  # a V2 inference: the example's model answers (docs/v2.md)
        v2 = InferenceResponse.model_validate_json(answer.content)
        assert v2.model_name == url.split("/")[3] and v2.outputs
        return
    response = OpResponse.model_validate_json(answer.content)
    op_type, opset = url.removeprefix("/v1/ops/").partition("/")[::2]
    assert response.op_type == op_type
    expected = registry.resolve(op_type, int(opset) if opset else None)
    assert response.version == expected.since_version
    if PER_VERSION.match(path):  # a version's own route runs exactly that version
        assert response.version == int(opset)
    assert set(response.outputs) == set(expected.outputs)


def test_every_version_route_runs_an_example(app: FastAPI) -> None:
    ran = {p.values[0] for p in _request_examples() if PER_VERSION.match(p.values[0])}
    assert ran == {f"/v1/ops/{op}/{v}" for op, versions in OPERATORS.items() for v in versions}


TENSOR_EXAMPLES = {
    "JsonTensor": ("Constant/1", "value"),
    "ProtoTensor": ("Constant/1", "value"),
    "SparseJsonTensor": ("Constant/11", "sparse_value"),
}


@pytest.mark.parametrize("component", sorted(TENSOR_EXAMPLES))
def test_tensor_component_examples_run_as_attributes(client: TestClient, component: str) -> None:
    route, attribute = TENSOR_EXAMPLES[component]
    for example in SCHEMAS[component]["examples"]:
        answer = client.post(f"/v1/ops/{route}", json={"attributes": {attribute: example}})
        assert answer.status_code == 200, answer.text
        OpResponse.model_validate_json(answer.content)
