"""OPSERVE_MAX_JSON_ITEMS at every HTTP door that parses a JSON body: a body of more items
than the limit (its commas, and LIST_ITEMS for each opening bracket) is refused (413, naming
the setting) before it is parsed, and one at the limit is served. The parse holds the interpreter's lock in one call, and so every other
request: 4 million numbers took 116-152 ms (docs/api.md, "Limits")."""

import base64
import gzip
import json
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from service.codecs.json_tensor import LIST_ITEMS
from service.main import create_app
from service.settings import Settings

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from starlette.testclient import TestClient

MOST = 1 << 19  # the setting's least value: every such body is over the 64 KiB read inline
REPOSITORY = Path(__file__).parents[2] / "examples" / "model_repository"
TILE_SHAPE = REPOSITORY / "tile_shape" / "1" / "model.onnx"
Door = Callable[[list], tuple[str, dict]]
"""A door: the path and the request (httpx's arguments) that send these rows of floats."""


@pytest.fixture(scope="module")
def client() -> Iterator[TestClient]:
    settings = Settings(model_repository=REPOSITORY, max_json_items=MOST, access_log=False)
    with TestClient(create_app(settings), raise_server_exceptions=False) as test_client:
        yield test_client


def _rows(count: int) -> list[list[float]]:
    return [[0.5, 1.5, 2.5] for _ in range(count)]


def _rows_around(door: Door, items: int) -> tuple[list, list]:
    """The most rows whose body the door parses holds at most `items` items, and those rows
    and one more (the door's count grows by a fixed step a row)."""
    first, step = (
        _sent_items(door, _rows(1)),
        _sent_items(door, _rows(2)) - _sent_items(door, _rows(1)),
    )
    within = 1 + (items - first) // step
    return _rows(within), _rows(within + 1)


def _items(text: bytes) -> int:
    return text.count(b",") + LIST_ITEMS * text.count(b"[")


def _v1_ops(rows: list) -> tuple[str, dict]:
    return "/v1/ops/Shape/25", {"json": {"inputs": {"data": {"dtype": "float", "data": rows}}}}


def _v1_model(rows: list) -> tuple[str, dict]:
    inputs = {"x": {"dtype": "float", "data": rows}}
    return "/v1/models/tile_shape/run", {"json": {"inputs": inputs, "outputs": ["shape"]}}


def _v1_posted(rows: list) -> tuple[str, dict]:
    model = base64.b64encode(TILE_SHAPE.read_bytes()).decode()
    inputs = {"x": {"dtype": "float", "data": rows}}
    return "/v1/models/run", {"json": {"model": model, "inputs": inputs, "outputs": ["shape"]}}


def _v1_posted_form(rows: list) -> tuple[str, dict]:
    request = json.dumps({"inputs": {"x": {"dtype": "float", "data": rows}}, "outputs": ["shape"]})
    files = {"model": ("model.onnx", TILE_SHAPE.read_bytes()), "request": (None, request)}
    return "/v1/models/run", {"files": files}


def _v2_body(rows: list) -> dict:
    flat = [value for row in rows for value in row]
    return {"inputs": [{"name": "x", "shape": [len(rows), 3], "datatype": "FP32", "data": flat}],
            "outputs": [{"name": "shape"}]}  # fmt: skip


def _v2(rows: list) -> tuple[str, dict]:
    return "/v2/models/tile_shape/infer", {"json": _v2_body(rows)}


def _v2_gzip(rows: list) -> tuple[str, dict]:
    packed = gzip.compress(json.dumps(_v2_body(rows)).encode())
    headers = {"content-type": "application/json", "content-encoding": "gzip"}
    return "/v2/models/tile_shape/infer", {"content": packed, "headers": headers}


def _v2_operator(rows: list) -> tuple[str, dict]:
    flat = [value for row in rows for value in row]
    body = {"inputs": [{"name": "data", "shape": [len(flat)], "datatype": "FP32", "data": flat}]}
    return "/v2/models/Shape/versions/25/infer", {"json": body}


DOORS = [_v1_ops, _v1_model, _v1_posted, _v1_posted_form, _v2, _v2_gzip, _v2_operator]


def _sent_items(door: Door, rows: list) -> int:
    """The items of the JSON the door parses (the form's `request` field)."""
    _path, request = door(rows)
    if "files" in request:
        return _items(request["files"]["request"][1].encode())
    if "json" in request:
        return _items(json.dumps(request["json"]).encode())
    return _items(gzip.decompress(request["content"]))


@pytest.mark.parametrize("door", DOORS, ids=lambda door: door.__name__.strip("_"))
def test_a_json_body_past_the_item_limit_is_413_and_one_within_is_served(
    client: TestClient, door: Door
) -> None:
    within, over = _rows_around(door, MOST)
    assert _sent_items(door, within) <= MOST < _sent_items(door, over)
    path, request = door(over)
    answer = client.post(path, **request)
    assert answer.status_code == 413, answer.text[:300]
    text = answer.text
    assert "OPSERVE_MAX_JSON_ITEMS" in text and f"over the limit of {MOST}" in text, text[:300]
    path, request = door(within)
    answer = client.post(path, **request)
    assert answer.status_code == 200, answer.text[:300]
    rows = len(within)
    shapes: dict[Door, list[int]] = {_v1_ops: [rows, 3], _v2_operator: [3 * rows]}
    expected = shapes.get(door, [2 * rows, 3])
    assert json.dumps(expected) in json.dumps(answer.json()), answer.text[:300]


def test_binary_data_is_not_counted(client: TestClient) -> None:
    """Inputs sent as binary data (Triton's extension) are not JSON: only the header's items
    count."""
    count = 4 * MOST
    header = json.dumps({"inputs": [{"name": "x", "shape": [count // 3, 3], "datatype": "FP32",
                                     "parameters": {"binary_data_size": (count // 3) * 12}}],
                         "outputs": [{"name": "shape"}]}).encode()  # fmt: skip
    body = header + bytes((count // 3) * 12)
    answer = client.post("/v2/models/tile_shape/infer", content=body,
                         headers={"inference-header-content-length": str(len(header))})  # fmt: skip
    assert answer.status_code == 200, answer.text[:300]
    assert answer.json()["outputs"][0]["data"] == [2 * (count // 3), 3]


def test_no_body_read_on_the_event_loop_reaches_the_least_limit() -> None:
    """A body of 64 KiB or less is read and parsed on the event loop without being counted:
    the setting's least value is above the most items such a body can hold (lists nested as
    deep as the parser takes, 200, in two bytes each)."""
    from service.core.offload import INLINE_BODY_BYTES

    least = next(m.ge for m in Settings.model_fields["max_json_items"].metadata if hasattr(m, "ge"))
    group = b"[" * 199 + b"]" * 199
    densest = b"[" + b",".join([group] * (INLINE_BODY_BYTES // (len(group) + 1) - 1)) + b"]"
    assert len(densest) <= INLINE_BODY_BYTES
    assert _items(densest) < least, (_items(densest), least)
