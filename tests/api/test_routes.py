"""Every route of the REST API: catalog, describe, the run routes by version, opset and newest,
health, and the offline docs."""

import re
import threading

import numpy as np
import onnx.defs
import pytest
from onnx import helper
from starlette.testclient import TestClient

from api_schemas.catalog import Catalog, OperatorVersion
from api_schemas.responses import OpResponse
from service.main import create_app

from .cases import CONTRACT, VERSIONS, from_wire, reference_output, request_body, run_reference

IDS = [f"{op}-{v}" for op, v in VERSIONS]


def test_catalog_lists_exactly_the_contract(client: TestClient) -> None:
    answer = client.get("/v1/ops")
    assert answer.status_code == 200
    catalog = Catalog.model_validate_json(answer.content)
    served = {o.op_type: o.versions for o in catalog.operators}
    assert served == CONTRACT
    assert sum(len(v) for v in served.values()) == 29
    assert all(o.newest == o.versions[-1] and o.domain == "" for o in catalog.operators)


def _types(type_strs: list[str]) -> list[str]:
    return sorted(t.removeprefix("tensor(").removesuffix(")") for t in type_strs)


@pytest.mark.parametrize(("op_type", "since"), VERSIONS, ids=IDS)
def test_describe_matches_onnx_defs(client: TestClient, op_type: str, since: int) -> None:
    answer = client.get(f"/v1/ops/{op_type}/{since}")
    assert answer.status_code == 200
    info = OperatorVersion.model_validate_json(answer.content)
    schema = onnx.defs.get_schema(op_type, since, "")
    assert (info.op_type, info.domain, info.version) == (op_type, "", since)
    allowed = {c.type_param_str: _types(c.allowed_type_strs) for c in schema.type_constraints}
    assert {c.type_param: sorted(c.types) for c in info.type_constraints} == allowed
    optional = onnx.defs.OpSchema.FormalParameterOption.Optional
    for ours, theirs in [(info.inputs, schema.inputs), (info.outputs, schema.outputs)]:
        assert [(p.name, p.type_param, p.optional) for p in ours] == [
            (p.name, p.type_str, p.option == optional) for p in theirs
        ]
        for param, formal in zip(ours, theirs, strict=True):
            # Tile-1 also takes int64 tiles/axis (documented extension); never fewer types.
            assert set(allowed.get(formal.type_str, _types([formal.type_str]))) <= set(param.types)
    assert {a.name for a in info.attributes} == set(schema.attributes)
    for attribute in info.attributes:
        theirs = schema.attributes[attribute.name]
        assert attribute.type == theirs.type.name
        assert attribute.required == theirs.required
        default = theirs.default_value
        expected = helper.get_attribute_value(default) if default.name else None
        if isinstance(expected, bytes):
            expected = expected.decode()
        assert attribute.default == pytest.approx(expected)


@pytest.mark.parametrize("op_type", sorted(CONTRACT))
def test_describe_and_run_resolve_every_opset(client: TestClient, op_type: str) -> None:
    versions = CONTRACT[op_type]
    for opset in range(1, 27):
        in_force = [v for v in versions if v <= opset]
        answer = client.get(f"/v1/ops/{op_type}/{opset}")
        if not in_force:
            assert answer.status_code == 404
            assert f"first is {versions[0]}" in answer.json()["detail"]
            continue
        assert answer.status_code == 200
        assert answer.json()["version"] == in_force[-1]
        run = client.post(f"/v1/ops/{op_type}/{opset}", json=request_body(op_type, in_force[-1]))
        assert run.status_code == 200, run.text
        assert run.json()["version"] == in_force[-1]


def test_shape_17_runs_shape_15(client: TestClient) -> None:
    body = {"inputs": {"data": {"dtype": "float", "shape": [2, 3, 4], "data": [0] * 24}},
            "attributes": {"start": -2}}  # fmt: skip
    answer = client.post("/v1/ops/Shape/17", json=body)
    assert answer.status_code == 200
    assert answer.json() == {
        "op_type": "Shape",
        "version": 15,
        "outputs": {"shape": {"dtype": "int64", "shape": [2], "data": [3, 4]}},
    }


@pytest.mark.parametrize("op_type", sorted(CONTRACT))
def test_newest_route(client: TestClient, op_type: str) -> None:
    newest = CONTRACT[op_type][-1]
    answer = client.post(f"/v1/ops/{op_type}", json=request_body(op_type, newest))
    assert answer.status_code == 200, answer.text
    assert answer.json()["version"] == newest


def _run(
    client: TestClient, op_type: str, since: int, **form: str
) -> tuple[OpResponse, np.ndarray]:
    answer = client.post(f"/v1/ops/{op_type}/{since}", json=request_body(op_type, since, **form))
    assert answer.status_code == 200, answer.text
    response = OpResponse.model_validate_json(answer.content)
    assert (response.op_type, response.version) == (op_type, since)
    (name,) = response.outputs
    assert name == onnx.defs.get_schema(op_type, since, "").outputs[0].name
    return response, from_wire(answer.json()["outputs"][name])


def _assert_exact(got: np.ndarray, expected: np.ndarray) -> None:
    assert got.dtype == expected.dtype
    assert got.shape == expected.shape
    np.testing.assert_array_equal(got, expected)


@pytest.mark.parametrize("output_format", ["json", "tensor_proto"])
@pytest.mark.parametrize("tensor_form", ["json", "tensor_proto"])
@pytest.mark.parametrize(("op_type", "since"), VERSIONS, ids=IDS)
def test_version_route_matches_onnx_reference(
    client: TestClient, op_type: str, since: int, tensor_form: str, output_format: str
) -> None:
    """Each version's own route, tensors in both forms both ways, against onnx.reference."""
    response, got = _run(
        client, op_type, since, tensor_form=tensor_form, output_format=output_format
    )
    tensor = next(iter(response.outputs.values()))
    assert ("tensor_proto" in tensor.model_dump()) == (output_format == "tensor_proto")
    if op_type == "RandomUniformLike":  # seeded: the same values each call, in [low, high)
        assert got.dtype == np.float32 and got.shape == (2, 3)
        assert ((got >= -2.0) & (got < 3.0)).all()
        _, again = _run(
            client, op_type, since, tensor_form=tensor_form, output_format=output_format
        )
        _assert_exact(again, got)
        return
    _assert_exact(got, reference_output(op_type, since))


@pytest.mark.parametrize(
    "attributes",
    [{"value_float": 2.5}, {"value_floats": [1.5, -2.0]}, {"value_int": -3},
     {"value_ints": [1, 2, 3]}, {"value_string": "héllo"}, {"value_strings": ["a", "b"]}],
    ids=lambda a: next(iter(a)),
)  # fmt: skip
def test_constant_12_value_attributes(client: TestClient, attributes: dict) -> None:
    answer = client.post("/v1/ops/Constant/12", json={"attributes": attributes})
    assert answer.status_code == 200, answer.text
    output = answer.json()["outputs"]["output"]
    expected = run_reference("Constant", 12, {}, attributes)
    if expected.dtype.kind in "OUS":  # strings: onnx.reference holds them as str or bytes
        assert output["dtype"] == "string" and output["shape"] == list(expected.shape)
        got = np.array(output["data"], dtype=object).reshape(output["shape"])  # outputs are flat
        assert got.tolist() == np.vectorize(_text, otypes=[object])(expected).tolist()
    else:
        _assert_exact(from_wire(output), expected)


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def test_random_uniform_like_without_seed_differs(client: TestClient) -> None:
    body = request_body("RandomUniformLike", 22)
    del body["attributes"]["seed"]
    first, second = (client.post("/v1/ops/RandomUniformLike/22", json=body) for _ in range(2))
    assert first.status_code == second.status_code == 200
    assert first.json()["outputs"] != second.json()["outputs"]


def test_health(client: TestClient) -> None:
    live, ready = client.get("/v2/health/live"), client.get("/v2/health/ready")
    assert (live.status_code, live.json()) == (200, {"live": True})
    assert (ready.status_code, ready.json()) == (200, {"ready": True})


@pytest.mark.parametrize(("path", "schema"), [("/v2/health/live", "ServerLive"),
                                              ("/v2/health/ready", "ServerReady")])  # fmt: skip
def test_health_answers_are_documented(client: TestClient, path: str, schema: str) -> None:
    document = client.get("/openapi.json").json()
    ok = document["paths"][path]["get"]["responses"]["200"]["content"]["application/json"]
    assert ok["schema"]["$ref"].endswith(f"/{schema}")
    fields = document["components"]["schemas"][schema]["properties"]
    assert set(client.get(path).json()) <= set(fields)


def test_405_lists_every_allowed_method(client: TestClient) -> None:
    answer = client.delete("/v1/ops/Shape/17")
    assert answer.status_code == 405
    assert set(answer.headers["allow"].replace(" ", "").split(",")) >= {"GET", "POST"}


def test_openapi_json(client: TestClient) -> None:
    answer = client.get("/openapi.json")
    assert answer.status_code == 200
    assert answer.json() == client.app.openapi()  # type: ignore[attr-defined]


def test_the_openapi_document_is_built_off_the_event_loop_once() -> None:
    """Its first build took the loop 300-330 ms (service/api/docs.py): it is made on a thread,
    once, and behind a root path the document names it as FastAPI's own route does."""
    app = create_app()
    built_on: list[str] = []
    build = app.openapi

    def recorded() -> dict:
        built_on.append(threading.current_thread().name)
        return build()

    app.openapi = recorded  # type: ignore[method-assign]
    with TestClient(app) as fresh:
        loop_thread = fresh.portal.call(lambda: threading.current_thread().name)  # type: ignore[union-attr]
        first, again = fresh.get("/openapi.json"), fresh.get("/openapi.json")
        assert first.status_code == again.status_code == 200
        assert first.content == again.content and first.json() == build()
        assert len(built_on) == 1 and built_on[0] != loop_thread, (built_on, loop_thread)
    with TestClient(app, root_path="/behind") as prefixed:
        servers = prefixed.get("/openapi.json").json()["servers"]
        assert servers[0] == {"url": "/behind"}


def test_the_operator_registry_is_scanned_at_start_up(monkeypatch: pytest.MonkeyPatch) -> None:
    """onnx's schemas are scanned for every served operator before the app serves: made by
    the first index, config or statistics call, the scan held the event loop 23-36 ms."""
    from service.operators import registry

    monkeypatch.setattr(registry, "_SERVED", {})  # as a fresh process has it
    with TestClient(create_app()):
        assert set(registry._SERVED) == set(registry.REGISTERED)


def test_openapi_tags_start_with_tile_and_cover_every_operation(client: TestClient) -> None:
    """Swagger UI and ReDoc show tags in the document's `tags` order: Tile (the README's first
    call), the other operators, then running by opset, models, V2, health, catalog, metrics."""
    document = client.get("/openapi.json").json()
    tags = [tag["name"] for tag in document["tags"]]
    assert tags == ["Tile", "Constant", "ConstantOfShape", "RandomUniformLike", "Shape",
                    "run by opset", "models", "KServe V2", "health", "catalog", "operations"]  # fmt: skip
    used = {t for operations in document["paths"].values() for o in operations.values()
            for t in o["tags"]}  # fmt: skip
    assert used == set(tags)  # no operation falls to the end under a tag the list lacks


def test_swagger_ui_opens_collapsed(client: TestClient) -> None:
    html = client.get("/docs").text
    assert '"docExpansion": "none"' in html and '"filter": true' in html


ASSET = re.compile(r"""(?:src|href)=["']?([^"' >]+)""")


@pytest.mark.parametrize("page", ["/docs", "/redoc"])
def test_docs_pages_use_only_local_assets(client: TestClient, page: str) -> None:
    answer = client.get(page)
    assert answer.status_code == 200
    assert answer.headers["content-type"].startswith("text/html")
    html = answer.text
    assert "/openapi.json" in html
    assets = ASSET.findall(html)
    assert assets, "the page loads its scripts and styles"
    for url in assets:
        assert url.startswith("/static/docs/"), f"{page} loads {url} from elsewhere"
        asset = client.get(url)
        assert asset.status_code == 200 and len(asset.content) > 100, url
    assert not re.search(
        r"https?://(?!127\.0\.0\.1|localhost)", html.replace("http://www.w3.org", "")
    )
