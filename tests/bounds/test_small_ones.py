"""Issue 16's small ones: function attribute defaults screened, initializer-backed inputs
optional on V2, an output requested twice refused, `q=0` honoured, name lists capped."""

import struct
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import orjson
import pytest
from onnx import AttributeProto, TensorProto, helper
from starlette.testclient import TestClient

from service.codecs.compression import SHORT_ANSWER_BYTES, accepted, answer_coding
from service.errors import InvalidInput, listed
from service.main import create_app
from service.runtime.screen import screen
from service.settings import Settings
from tests.runtime.models import I64, F, model, value


def test_a_function_attribute_default_with_external_data_is_refused() -> None:
    external = TensorProto(name="w", data_type=F, dims=[1], data_location=TensorProto.EXTERNAL)
    external.external_data.add(key="location", value="/etc/passwd")
    default = helper.make_attribute("w", external)
    assert default.type == AttributeProto.TENSOR
    function = helper.make_function("local", "f", ["x"], ["y"],
                                    [helper.make_node("Identity", ["x"], ["y"])],
                                    [helper.make_opsetid("", 21)])  # fmt: skip
    function.attribute_proto.append(default)
    built = model([helper.make_node("f", ["x"], ["y"], domain="local")], [value("x")],
                  [value("y")], functions=[function])  # fmt: skip
    with pytest.raises(InvalidInput, match=r"function .f.: default: attribute .w.*external"):
        screen(built, 100, 4)


@pytest.mark.parametrize(
    ("header", "coding"),
    [("gzip", "gzip"), ("gzip;q=0", None), ("gzip; q=0", None), ("gzip;Q=0", None),
     ("gzip ; q = 0.000", None), ("gzip;q=0.", None), ("GZIP;q=0.5", "gzip"),
     ("gzip;q=0, deflate", "deflate"), ("deflate;q=0,gzip;q=0", None), ("gzip;q=bad", None),
     ("gzip;q=2", None), ("*", None), ("identity", None), ("br, gzip;q=0.1", "gzip")],
)  # fmt: skip
def test_accept_encoding_weights(header: str, coding: str | None) -> None:
    assert accepted(header) == coding


@pytest.mark.parametrize(
    ("header", "short_coding"),
    [("gzip", None), ("gzip, deflate, br", None), ("gzip, identity;q=0", "gzip"),
     ("gzip, identity; Q=0.000", "gzip"), ("gzip, *;q=0", "gzip"), ("gzip, identity, *;q=0", None),
     ("gzip, identity;q=0.5", None), ("identity", None), ("gzip;q=0, identity;q=0", None)],
)  # fmt: skip
def test_a_short_answer_goes_as_it_is_unless_identity_is_refused(
    header: str, short_coding: str | None
) -> None:
    """An answer under SHORT_ANSWER_BYTES is not compressed unless the client refuses
    `identity` (RFC 9110, 12.5.3); one of SHORT_ANSWER_BYTES or more takes what is accepted."""
    coding = accepted(header)
    assert answer_coding(header, coding, SHORT_ANSWER_BYTES - 1) == short_coding
    assert answer_coding(header, coding, SHORT_ANSWER_BYTES) == coding


def test_lists_of_names_are_capped() -> None:
    names = [f"name{i}" for i in range(100_000)]
    text = listed(names)
    assert text.endswith("and 99990 more") and len(text) < 200


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestClient]:
    root = tmp_path_factory.mktemp("repository")
    graph = model([helper.make_node("Tile", ["x", "reps"], ["y"])],
                  [value("x", F, [2]), value("reps", I64, [1])], [value("y", F, [None])],
                  {"reps": np.ones(1, np.int64)})  # fmt: skip
    (root / "add.onnx").write_bytes(graph.SerializeToString())
    app = create_app(Settings(model_repository=Path(root)))
    with TestClient(app, raise_server_exceptions=False) as test_client:
        yield test_client


def _x(data: list[float], name: str = "x") -> dict:
    return {"name": name, "datatype": "FP32", "shape": [2], "data": data}


def test_an_initializer_backed_input_is_optional_on_v2(client: TestClient) -> None:
    config = client.get("/v2/models/add/config").json()
    assert [(i["name"], i.get("optional", False)) for i in config["input"]] == [
        ("x", False), ("reps", True)]  # fmt: skip
    alone = client.post("/v2/models/add/infer", json={"inputs": [_x([1, 2])]})
    assert alone.json()["outputs"][0]["data"] == [1, 2]
    reps = {"name": "reps", "datatype": "INT64", "shape": [1], "data": [2]}
    both = client.post("/v2/models/add/infer", json={"inputs": [_x([1, 2]), reps]})
    assert both.json()["outputs"][0]["data"] == [1, 2, 1, 2]


def test_an_output_requested_twice_is_refused(client: TestClient) -> None:
    body = {"inputs": [_x([1, 2])], "outputs": [{"name": "y", "parameters": {"binary_data": True}},
                                                {"name": "y"}]}  # fmt: skip
    answer = client.post("/v2/models/add/infer", json=body)
    assert answer.status_code == 400
    assert answer.json() == {"error": "outputs: output 'y' already exists in request"}


def test_many_unknown_input_names_make_a_short_text(client: TestClient) -> None:
    inputs = {f"n{i}": {"dtype": "float", "data": [1]} for i in range(20_000)}
    answer = client.post("/v1/ops/Tile/13", json={"inputs": inputs})
    assert answer.status_code == 422 and len(answer.text) < 2000, len(answer.text)
    answer = client.post("/v1/models/add/run", json={"inputs": inputs})
    assert answer.status_code in (413, 422) and len(answer.text) < 2000, len(answer.text)


def _bytes_request(elements: list[bytes]) -> tuple[bytes, dict[str, str]]:
    raw = b"".join(struct.pack("<I", len(e)) + e for e in elements)
    head = orjson.dumps({"inputs": [
        {"name": "input", "datatype": "BYTES", "shape": [len(elements)],
         "parameters": {"binary_data_size": len(raw)}},
        {"name": "repeats", "datatype": "INT64", "shape": [1], "data": [1]}]})  # fmt: skip
    return head + raw, {"Inference-Header-Content-Length": str(len(head)),
                        "Accept-Encoding": "identity"}  # fmt: skip


def test_a_large_string_answer_streams_as_json(client: TestClient) -> None:
    """200,000 strings (1.6 MB of pointers): their JSON text is made a chunk at a time; an
    element that is not UTF-8 is refused before the answer starts."""
    elements = [f"s{i}".encode() for i in range(200_000)]
    body, headers = _bytes_request(elements)
    answer = client.post("/v2/models/Tile/versions/13/infer", content=body, headers=headers)
    assert answer.status_code == 200, answer.text[:300]
    assert "content-length" not in answer.headers  # chunked: streamed
    assert answer.json()["outputs"][0]["data"] == [e.decode() for e in elements]
    body, headers = _bytes_request([*elements[:-1], b"\xff"])
    answer = client.post("/v2/models/Tile/versions/13/infer", content=body, headers=headers)
    assert answer.status_code == 400 and "element 199999" in answer.json()["error"]
