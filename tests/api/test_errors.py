"""Every error class of the REST API: 404, 405, 413 and 422, each with the one error model
and a `detail` that names the field path, the operator and its version. No input gets a 5xx."""

import base64
from collections.abc import Iterator
from typing import Any

import numpy as np
import onnx
import onnx.defs
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, numpy_helper
from starlette.testclient import TestClient

from api_schemas.responses import ErrorResponse
from service.main import create_app
from service.settings import Settings

from .cases import VERSIONS, request_body

NEWEST = onnx.defs.onnx_opset_version()

X = {"dtype": "float", "shape": [2, 3], "data": [1, 2, 3, 4, 5, 6]}
R = {"dtype": "int64", "shape": [2], "data": [2, 2]}
S = {"dtype": "int64", "shape": [], "data": 2}
SPARSE_VALUES = {"dtype": "float", "shape": [2], "data": [1, 2]}


def _error(answer: Any, status: int) -> ErrorResponse:
    assert answer.status_code == status, answer.text
    assert answer.headers["content-type"] == "application/json"
    return ErrorResponse.model_validate_json(answer.content)


def _external_data_proto() -> str:
    proto = numpy_helper.from_array(np.zeros(3, np.float32))
    proto.ClearField("raw_data")
    proto.data_location = TensorProto.EXTERNAL
    entry = proto.external_data.add()
    entry.key, entry.value = "location", "weights.bin"
    return base64.b64encode(proto.SerializeToString()).decode()


# ---------------------------------------------------------------------------------------- 404


@pytest.mark.parametrize(
    ("method", "path", "words"),
    [
        ("POST", "/v1/ops/Nope/13", "unknown operator Nope"),
        ("POST", "/v1/ops/Nope", "unknown operator Nope"),
        ("GET", "/v1/ops/Nope/13", "unknown operator Nope"),
        ("POST", "/v1/ops/ConstantOfShape/8", "ConstantOfShape has no version at opset 8"),
        ("GET", "/v1/ops/ConstantOfShape/8", "its first is 9"),
        ("POST", "/v1/ops/Tile/abc", "Tile has no version 'abc'"),
        # an opset past onnx's newest is a typo, not the newest version
        (
            "POST",
            "/v1/ops/Tile/99",
            f"Tile has no version at opset 99: the newest opset onnx {onnx.__version__} defines is {NEWEST}",
        ),
        (
            "GET",
            "/v1/ops/Shape/29",
            f"the newest opset onnx {onnx.__version__} defines is {NEWEST}",
        ),
        # names are case-sensitive; the answer suggests the match and lists the operators
        (
            "POST",
            "/v1/ops/tile/13",
            "unknown operator tile (did you mean Tile?); the operators "
            "are Constant, ConstantOfShape, RandomUniformLike, Shape, Tile",
        ),
        ("POST", "/v1/ops/tile", "(did you mean Tile?)"),
        ("POST", "/v1/ops/Shapee/13", "unknown operator Shapee (did you mean Shape?)"),
        ("GET", "/v1/nope", "Not Found"),
        ("POST", "/v1/ops/Tile/13/extra", "Not Found"),
        ("GET", "/v3/models", "Not Found"),
    ],
)
def test_404(client: TestClient, method: str, path: str, words: str) -> None:
    body = request_body("Tile", 13) if method == "POST" else None
    error = _error(client.request(method, path, json=body), 404)
    assert words in error.detail


# ---------------------------------------------------------------------------------------- 413


@pytest.fixture(scope="module")
def small_client() -> Iterator[TestClient]:
    """The app with the smallest limits the settings allow."""
    settings = Settings(max_request_bytes=4096, max_output_bytes=4096, max_elements=1000)
    with TestClient(create_app(settings), raise_server_exceptions=False) as test_client:
        yield test_client


def test_413_declared_body_over_limit(small_client: TestClient) -> None:
    body = b'{"inputs": {}, "pad": "' + b"x" * 5000 + b'"}'
    answer = small_client.post("/v1/ops/Tile/13", content=body,
                               headers={"content-type": "application/json"})  # fmt: skip
    error = _error(answer, 413)
    assert (
        "request body of 50" in error.detail
        and "(Content-Length) is over the limit of 4096 bytes" in error.detail
    )
    assert answer.headers.get("connection") == "close"


def test_413_streamed_body_over_limit(small_client: TestClient) -> None:
    chunks = (b"x" * 1000 for _ in range(10))  # no Content-Length: chunked transfer
    answer = small_client.post("/v1/ops/Tile/13", content=chunks,
                               headers={"content-type": "application/json"})  # fmt: skip
    error = _error(answer, 413)
    assert "streamed in chunks went over the limit of 4096 bytes" in error.detail


def test_body_at_the_limit_is_read(small_client: TestClient) -> None:
    body = request_body("Tile", 13)
    answer = small_client.post("/v1/ops/Tile/13", json=body)
    assert answer.status_code == 200


@pytest.mark.parametrize(
    ("path", "body", "words"),
    [
        ("ConstantOfShape/9", {"inputs": {"input": {**R, "data": [100000, 100000]}}},
         "output of shape [100000, 100000] and float would take 40000000000 bytes"),
        ("ConstantOfShape/25", {"inputs": {"input": {**R, "shape": [3], "data": [2**20] * 3}}},
         "over the limit"),
        ("Tile/13", {"inputs": {"input": X, "repeats": {**R, "data": [10**6, 10**6]}}},
         "output of shape [2000000, 3000000]"),
        ("Tile/1", {"inputs": {"input": X, "tiles": {**S, "data": 10**12}, "axis": S | {"data": 0}}},
         "over the limit"),
        ("Constant/11", {"attributes": {"sparse_value": {
            "values": SPARSE_VALUES, "indices": {**R, "data": [0, 1]}, "dims": [10**6, 10**6]}}},
         "sparse_value's dense tensor"),
    ],
)  # fmt: skip
def test_413_output_over_limit(client: TestClient, path: str, body: dict, words: str) -> None:
    error = _error(client.post(f"/v1/ops/{path}", json=body), 413)
    assert words in error.detail
    assert path.replace("/", "-") in error.detail  # names the operator version


def test_413_input_over_element_limit_names_the_input(client: TestClient) -> None:
    huge = {"dtype": "float", "shape": [100000, 100000], "data": []}
    error = _error(
        client.post("/v1/ops/Tile/13", json={"inputs": {"input": huge, "repeats": R}}), 413
    )
    assert "10000000000 elements" in error.detail
    assert "inputs.input" in error.detail


def test_413_output_under_small_limit(small_client: TestClient) -> None:
    body = {"inputs": {"input": {**R, "data": [40, 40]}}}  # 1600 floats = 6400 bytes > 4096
    error = _error(small_client.post("/v1/ops/ConstantOfShape/21", json=body), 413)
    assert "over the limit of 4096" in error.detail


# ---------------------------------------------------------------------------------------- 422

# (id, route, body, field path the detail must name, operator version it must name,
#  whether the kernel or type check names the operator itself, before the lane adds it)
CASES_422: list[tuple[str, str, Any, str, str, bool]] = [
    ("missing input", "Tile/13", {"inputs": {"input": X}}, "inputs.repeats", "Tile-13", False),
    ("unknown input", "Tile/13", {"inputs": {"input": X, "repeats": R, "foo": R}},
     "inputs.foo", "Tile-13", False),
    ("unknown attribute", "Tile/13", {"inputs": {"input": X, "repeats": R}, "attributes": {"axis": 1}},
     "attributes.axis", "Tile-13", False),
    ("attribute of a later version", "Shape/13", {"inputs": {"data": X}, "attributes": {"start": 1}},
     "attributes.start", "Shape-13", False),
    ("wrong attribute type", "Shape/15", {"inputs": {"data": X}, "attributes": {"start": "one"}},
     "attributes.start", "Shape-15", False),
    ("attribute out of int64", "Shape/19", {"inputs": {"data": X}, "attributes": {"end": 2**63}},
     "attributes.end", "Shape-19", False),
    ("bad dtype", "Tile/13", {"inputs": {"input": {**X, "dtype": "float33"}, "repeats": R}},
     "inputs.input.dtype", "Tile-13", False),
    ("data does not match shape", "Tile/13", {"inputs": {"input": {**X, "shape": [2, 2]}, "repeats": R}},
     "inputs.input.data", "Tile-13", False),
    ("integer out of range", "Tile/13",
     {"inputs": {"input": {"dtype": "int8", "shape": [1], "data": [300]}, "repeats": {**R, "shape": [1], "data": [1]}}},
     "inputs.input.data", "Tile-13", False),
    ("bad non-finite spelling", "Shape/1", {"inputs": {"data": {"dtype": "float", "shape": [1], "data": ["nan"]}}},
     "inputs.data.data", "Shape-1", False),
    ("not base64", "Tile/13", {"inputs": {"input": {"tensor_proto": "!!"}, "repeats": R}},
     "inputs.input.tensor_proto", "Tile-13", False),
    ("not a TensorProto", "Tile/13", {"inputs": {"input": {"tensor_proto": "/////w=="}, "repeats": R}},
     "inputs.input.tensor_proto", "Tile-13", False),
    ("external data", "Tile/13", {"inputs": {"input": {"tensor_proto": _external_data_proto()}, "repeats": R}},
     "inputs.input.tensor_proto", "Tile-13", False),
    ("both tensor forms", "Tile/13", {"inputs": {"input": {**X, "tensor_proto": "AAAA"}, "repeats": R}},
     "inputs.input.dtype", "Tile-13", False),
    ("tensor not an object", "Tile/13", {"inputs": {"input": [1, 2], "repeats": R}},
     "inputs.input", "Tile-13", False),
    ("bad output_format", "Tile/13", {"inputs": {"input": X, "repeats": R}, "output_format": "xml"},
     "output_format", "Tile-13", False),
    ("bad dtype enum", "RandomUniformLike/22", {"inputs": {"input": X}, "attributes": {"dtype": 99}},
     "attributes.dtype", "RandomUniformLike-22", False),
    ("two Constant values", "Constant/12", {"attributes": {"value_int": 1, "value_float": 2.0}},
     "attributes", "Constant-12", False),
    ("no Constant value", "Constant/1", {}, "attributes", "Constant-1", False),
    ("type constraint: Tile-6 bfloat16", "Tile/6",
     {"inputs": {"input": {**X, "dtype": "bfloat16"}, "repeats": R}}, "inputs.input", "Tile-6", True),
    ("type constraint: repeats float", "Tile/13", {"inputs": {"input": X, "repeats": {**R, "dtype": "float"}}},
     "inputs.repeats", "Tile-13", True),
    ("type constraint: shape int32", "ConstantOfShape/9",
     {"inputs": {"input": {**R, "dtype": "int32"}}}, "inputs.input", "ConstantOfShape-9", True),
    ("type constraint: output bfloat16 at 9", "ConstantOfShape/9",
     {"inputs": {"input": R}, "attributes": {"value": {"dtype": "bfloat16", "shape": [1], "data": [1]}}},
     "attributes.value", "ConstantOfShape-9", True),
    ("type constraint: Constant-1 int64", "Constant/1",
     {"attributes": {"value": {"dtype": "int64", "shape": [1], "data": [1]}}}, "attributes.value", "Constant-1", True),
    ("rule: negative repeats", "Tile/13", {"inputs": {"input": X, "repeats": {**R, "data": [-1, 2]}}},
     "inputs.repeats", "Tile-13", True),
    ("rule: repeats per axis", "Tile/6", {"inputs": {"input": X, "repeats": {**R, "shape": [1], "data": [2]}}},
     "inputs.repeats", "Tile-6", True),
    ("rule: axis out of range", "Tile/1", {"inputs": {"input": X, "tiles": S, "axis": {**S, "data": 2}}},
     "inputs.axis", "Tile-1", True),
    ("rule: negative dimension", "ConstantOfShape/20", {"inputs": {"input": {**R, "data": [-1, 2]}}},
     "inputs.input", "ConstantOfShape-20", True),
    ("rule: value of two elements", "ConstantOfShape/23",
     {"inputs": {"input": R}, "attributes": {"value": {"dtype": "float", "shape": [2], "data": [1, 2]}}},
     "attributes.value", "ConstantOfShape-23", True),
    ("rule: low >= high", "RandomUniformLike/1", {"inputs": {"input": X}, "attributes": {"low": 2, "high": 1}},
     "attributes.low", "RandomUniformLike-1", True),
    ("rule: integer output dtype", "RandomUniformLike/22", {"inputs": {"input": X}, "attributes": {"dtype": "int64"}},
     "attributes.dtype", "RandomUniformLike-22", True),
    ("rule: sparse index outside", "Constant/11", {"attributes": {"sparse_value": {
        "values": SPARSE_VALUES, "indices": {**R, "data": [1, 9]}, "dims": [2, 3]}}},
     "attributes.sparse_value", "Constant-11", True),
    ("opset route: Shape-15 rules at 17", "Shape/17", {"inputs": {"data": X}, "attributes": {"start": "x"}},
     "attributes.start", "Shape-15", False),
]  # fmt: skip


def _params() -> list[Any]:
    return [pytest.param(path, body, field, op, id=name)
            for name, path, body, field, op, _named in CASES_422]  # fmt: skip


@pytest.mark.parametrize(("path", "body", "field", "op"), _params())
def test_422_names_the_field_path(
    client: TestClient, path: str, body: Any, field: str, op: str
) -> None:
    error = _error(client.post(f"/v1/ops/{path}", json=body), 422)
    assert f"{field}: " in error.detail
    assert error.errors, "each violation is listed"
    assert any(".".join(map(str, e.loc)) == field for e in error.errors), error.errors


@pytest.mark.parametrize(("path", "body", "field", "op"), _params())
def test_422_names_the_operator_version(
    client: TestClient, path: str, body: Any, field: str, op: str
) -> None:
    error = _error(client.post(f"/v1/ops/{path}", json=body), 422)
    assert f"{op}:" in error.detail or f"{op} " in error.detail


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("Shape/15", {"inputs": {"data": X}, "attributes": {"end": False}}),
        ("Constant/12", {"attributes": {"value_ints": [True, False]}}),
        ("RandomUniformLike/22", {"inputs": {"input": X}, "attributes": {"seed": True}}),
        ("Tile/13", {"inputs": {"input": {**X, "shape": [True, 6]}, "repeats": R}}),
    ],
)
def test_422_a_boolean_is_not_a_number(client: TestClient, path: str, body: Any) -> None:
    _error(client.post(f"/v1/ops/{path}", json=body), 422)


@pytest.mark.parametrize(
    ("content", "words"),
    [
        (b'{"inputs": {', "the body is not valid JSON"),
        (b"", "the body is not valid JSON"),
        (b"inputs=1", "the body is not valid JSON"),
        (b"\xff\xfe{}", "the body is not valid JSON"),
        (b'{"inputs": {}} trailing', "the body is not valid JSON"),
        (b"[1, 2]", "Input should be an object"),
        (b"null", "Input should be an object"),
    ],
)
def test_422_invalid_json(client: TestClient, content: bytes, words: str) -> None:
    answer = client.post("/v1/ops/Tile/13", content=content,
                         headers={"content-type": "application/json"})  # fmt: skip
    assert words in _error(answer, 422).detail


@pytest.mark.parametrize("method", ["GET", "POST"])
def test_404_path_version_must_be_an_opset_number(client: TestClient, method: str) -> None:
    # GET and POST share one route, so both answer alike: no such version is a 404.
    assert "no version at opset 0" in _error(client.request(method, "/v1/ops/Tile/0"), 404).detail
    assert "no version 'x'" in _error(client.request(method, "/v1/ops/Tile/x"), 404).detail


# ------------------------------------------------------------------------------ never a 5xx

JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)
TENSORISH = st.fixed_dictionaries(
    {"dtype": st.sampled_from(["float", "int64", "bool", "string", "uint4", "float8e4m3fn",
                               "complex64", "bfloat16", 7, "FLOAT", "float64", "x"]),
     "shape": st.lists(st.integers(-1, 5), max_size=3) | st.none(),
     "data": JSON},
)  # fmt: skip


def _leaves(node: Any, path: tuple = ()) -> Iterator[tuple]:
    if isinstance(node, dict) and node:
        for key, value in node.items():
            yield from _leaves(value, (*path, key))
    elif isinstance(node, list) and node:
        for index, value in enumerate(node):
            yield from _leaves(value, (*path, index))
    yield path


def _replace(node: Any, path: tuple, value: Any) -> Any:
    if not path:
        return value
    copy = dict(node) if isinstance(node, dict) else list(node)
    copy[path[0]] = _replace(node[path[0]], path[1:], value)
    return copy


@st.composite
def _mutated(draw: st.DrawFn) -> tuple[str, Any]:
    """A valid request of a random version with one part swapped for random JSON or a tensor."""
    op_type, since = draw(st.sampled_from(VERSIONS))
    body = request_body(op_type, since, tensor_form=draw(st.sampled_from(["json", "tensor_proto"])))
    path = draw(st.sampled_from(list(_leaves(body))))
    return f"/v1/ops/{op_type}/{since}", _replace(body, path, draw(JSON | TENSORISH))


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
@given(case=_mutated())
def test_no_5xx_for_mutated_requests(client: TestClient, case: tuple[str, Any]) -> None:
    path, body = case
    answer = client.post(path, json=body)
    assert answer.status_code in (200, 404, 413, 415, 422), (path, body, answer.text)
    if answer.status_code != 200:
        ErrorResponse.model_validate_json(answer.content)


@settings(max_examples=100, deadline=None, suppress_health_check=list(HealthCheck))
@given(path=st.sampled_from(["/v1/ops/Tile/13", "/v1/ops/Shape", "/v1/ops/Constant/25"]), body=JSON)
def test_no_5xx_for_any_json(client: TestClient, path: str, body: Any) -> None:
    answer = client.post(path, json=body)
    assert answer.status_code < 500, (path, body, answer.text)
