"""Requests built to break the service: each gets a clear 4xx, never a 5xx, and no memory
or CPU it should not have (found by review; each case once gave a 500 or ran unbounded)."""

import base64
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient
from onnx import SparseTensorProto, helper, numpy_helper

from service.main import create_app
from service.operators import registry
from service.settings import Settings

BIG = 2**62


@pytest.fixture(scope="module")
def client() -> TestClient:
    return TestClient(create_app(Settings()))


@pytest.fixture(scope="module")
def small() -> TestClient:
    limits = Settings(max_output_bytes=4096, max_elements=1024, max_string_bytes=1024)
    return TestClient(create_app(limits))


def _post(client: TestClient, path: str, body: Any) -> tuple[int, str]:
    answer = client.post(path, json=body)
    assert answer.headers["content-type"] == "application/json"
    return answer.status_code, answer.json()["detail"]


def _t(dtype: str, data: Any, shape: list[int] | None = None) -> dict[str, Any]:
    return {"dtype": dtype, "data": data, **({"shape": shape} if shape is not None else {})}


# Empty outputs whose other dimensions are huge: numpy cannot build them even empty.
@pytest.mark.parametrize(("path", "body"), [
    ("/v1/ops/ConstantOfShape/9", {"inputs": {"input": _t("int64", [0, BIG, BIG])}}),
    ("/v1/ops/Tile/13", {"inputs": {"input": _t("float", [], [0, 2]),
                                    "repeats": _t("int64", [1, BIG])}}),
    ("/v1/ops/Tile/1", {"inputs": {"input": _t("float", [], [0, 2]), "tiles": _t("int64", BIG, []),
                                   "axis": _t("int64", 1, [])}}),
])  # fmt: skip
def test_empty_output_with_huge_dims_is_413(client: TestClient, path: str, body: Any) -> None:
    status, detail = _post(client, path, body)
    assert status == 413 and "over the limit" in detail


def _sparse_proto(dims: list[int]) -> str:
    sparse = SparseTensorProto()
    sparse.values.CopyFrom(numpy_helper.from_array(np.array([1.0], np.float32)))
    sparse.indices.CopyFrom(numpy_helper.from_array(np.array([0], np.int64)))
    sparse.dims.extend(dims)
    return base64.b64encode(sparse.SerializeToString()).decode()


@pytest.mark.parametrize(("sparse", "status"), [
    ({"values": _t("float", [1]), "indices": _t("int64", [0]), "dims": [0, 10**30]}, 413),
    ({"values": _t("float", [1]), "indices": _t("int64", [0]), "dims": [0, BIG, BIG]}, 413),
    ({"sparse_tensor_proto": _sparse_proto([-1])}, 422),
    ({"sparse_tensor_proto": _sparse_proto([-2, -3])}, 422),
])  # fmt: skip
def test_sparse_dims_are_bounded(client: TestClient, sparse: Any, status: int) -> None:
    got, detail = _post(client, "/v1/ops/Constant/11", {"attributes": {"sparse_value": sparse}})
    assert got == status and detail.startswith("Constant-11: attributes.sparse_value")


@pytest.mark.parametrize("version", ["%C2%B2", "9" * 5000, "1.5", "-3", "0x10"])
@pytest.mark.parametrize("method", ["GET", "POST"])
def test_odd_versions_in_the_path_are_404(client: TestClient, method: str, version: str) -> None:
    answer = client.request(method, f"/v1/ops/Tile/{version}", json={})
    assert answer.status_code == 404, answer.text


def test_string_outputs_count_their_text(small: TestClient) -> None:
    body = {"inputs": {"input": _t("string", ["x" * 1000]), "repeats": _t("int64", [300])}}
    status, detail = _post(small, "/v1/ops/Tile/13", body)
    assert status == 413 and "inputs.repeats" in detail


@pytest.mark.parametrize("attributes", [
    {"value_ints": list(range(100_000))},
    {"value_floats": [1.5] * 100_000},
    {"value_string": "x" * 100_000},
    {"value_strings": ["y" * 1000] * 1000},
])  # fmt: skip
def test_constant_lists_and_strings_have_the_output_budget(
    small: TestClient, attributes: dict[str, Any]
) -> None:
    status, detail = _post(small, "/v1/ops/Constant/12", {"attributes": attributes})
    (name,) = attributes
    assert status == 413 and detail.startswith(f"Constant-12: attributes.{name}: ")


def test_unknown_operators_leave_nothing_behind(client: TestClient) -> None:
    before = len(registry._SERVED)
    for i in range(50):
        assert client.post(f"/v1/ops/Nope{i}/1", json={}).status_code == 404
    assert len(registry._SERVED) == before


@pytest.mark.parametrize(("path", "body", "field"), [
    ("/v1/ops/Constant/1", {"attributes": {"value": _t("int64", [1])}}, "attributes.value"),
    ("/v1/ops/ConstantOfShape/9", {"inputs": {"input": _t("int64", [2])},
                                   "attributes": {"value": _t("string", ["a"])}}, "attributes.value"),
    ("/v1/ops/RandomUniformLike/1", {"inputs": {"input": _t("float", [1])},
                                     "attributes": {"dtype": "bfloat16"}}, "attributes.dtype"),
])  # fmt: skip
def test_output_types_are_blamed_on_the_field_that_chose_them(
    client: TestClient, path: str, body: Any, field: str
) -> None:
    status, detail = _post(client, path, body)
    assert status == 422 and f": {field}: the output cannot be" in detail


def test_tensor_proto_attribute_made_with_helper(client: TestClient) -> None:
    """A TENSOR attribute built by onnx.helper (typed float_data) runs as Constant's value."""
    proto = helper.make_tensor("v", 1, [2], [1.5, -2.0])
    value = {"tensor_proto": base64.b64encode(proto.SerializeToString()).decode()}
    answer = client.post("/v1/ops/Constant/13", json={"attributes": {"value": value}})
    assert answer.json()["outputs"]["output"]["data"] == [1.5, -2.0]
