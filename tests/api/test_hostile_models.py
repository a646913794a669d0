"""Hostile models get a clean 4xx: nothing read from disk, memory flat, no 5xx."""

import base64
import gc
import os
import time
import tracemalloc
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from onnx import ModelProto, TensorProto, helper
from starlette.testclient import TestClient

from service.main import create_app
from service.settings import Settings
from tests.runtime.models import I64, F, b64, model, proto, value

SECRET = b"TOP-SECRET-CONTENT-0123456789"
MiB = 1024 * 1024


@pytest.fixture(scope="module")
def app() -> Any:
    return create_app(Settings(reference_fallback=True, access_log=False))


@pytest.fixture
def secret(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A file in the server's working directory that external data names; its access time is
    set far back, so any read of it moves it (relatime updates an atime older than mtime)."""
    monkeypatch.chdir(tmp_path)
    path = tmp_path / "secret.bin"
    path.write_bytes(SECRET)
    control = tmp_path / "control.bin"
    control.write_bytes(SECRET)
    os.utime(control, (0, time.time()))
    control.read_bytes()
    if os.stat(control).st_atime == 0:
        pytest.skip("this filesystem does not update access times")
    os.utime(path, (0, time.time()))
    yield path
    assert os.stat(path).st_atime == 0, "the external data file was read"


def _external(name: str) -> TensorProto:
    tensor = TensorProto(name=name, data_type=TensorProto.FLOAT, dims=[4])
    tensor.data_location = TensorProto.EXTERNAL
    for key, val in (("location", "secret.bin"), ("offset", "0"), ("length", "16")):
        tensor.external_data.add(key=key, value=val)
    return tensor


def _external_initializer() -> ModelProto:
    node = helper.make_node("Shape", ["w"], ["s"])
    proto = model([node], [], [value("s", I64, [1])])
    proto.graph.initializer.append(_external("w"))
    return proto


def _external_constant() -> ModelProto:
    node = helper.make_node("Constant", [], ["c"], value=_external("v"))
    return model([node], [], [value("c", F, [4])])


def _external_in_subgraph() -> ModelProto:
    inner = helper.make_node("Constant", [], ["c"], value=_external("v"))
    then = helper.make_graph([inner], "then", [], [value("c", F, [4])])
    other = helper.make_graph(
        [helper.make_node("Constant", [], ["d"], value=helper.make_tensor("d", F, [4], [0] * 4))],
        "else", [], [value("d", F, [4])],
    )  # fmt: skip
    node = helper.make_node("If", ["cond"], ["out"], then_branch=then, else_branch=other)
    return model([node], [value("cond", TensorProto.BOOL, [])], [value("out", F, [4])])


@pytest.mark.parametrize("build", [_external_initializer, _external_constant,
                                   _external_in_subgraph])  # fmt: skip
def test_external_data_is_refused_unread(client: TestClient, secret: Path, build: Any) -> None:
    body = {"model": b64(build()), "inputs": {}}
    if build is _external_in_subgraph:
        body["inputs"] = {"cond": proto(np.array(True))}
    answer = client.post("/v1/models/run", json=body)
    assert answer.status_code == 422, answer.text
    assert "external data" in answer.json()["detail"]
    assert SECRET not in answer.content and b"TOP-SECRET" not in answer.content
    multipart = client.post(
        "/v1/models/run", files={"model": ("m.onnx", build().SerializeToString())}
    )
    assert multipart.status_code == 422 and SECRET not in multipart.content


def _refused(client: TestClient, proto_or_bytes: Any, status: int = 422, **extra: Any) -> str:
    data = (
        proto_or_bytes if isinstance(proto_or_bytes, bytes) else proto_or_bytes.SerializeToString()
    )
    answer = client.post("/v1/models/run",
                         json={"model": base64.b64encode(data).decode(), **extra})  # fmt: skip
    assert answer.status_code == status, answer.text
    return str(answer.json()["detail"])


def test_every_unsupported_node_is_listed_in_one_answer(client: TestClient) -> None:
    nodes = [helper.make_node("Foo", ["x"], ["a"], name="foo", domain="com.example"),
             helper.make_node("Bar", ["a"], ["b"], name="bar", domain="com.example"),
             helper.make_node("Shape", ["b"], ["s"], name="shape")]  # fmt: skip
    proto = model(nodes, [value("x", F, [2])], [value("s", I64, [1])])
    proto.opset_import.append(helper.make_opsetid("com.example", 1))
    detail = _refused(client, proto)
    assert "cannot run 2 node(s)" in detail
    assert "node 'foo' (Foo, domain 'com.example', version none)" in detail
    assert "node 'bar' (Bar, domain 'com.example', version none)" in detail


def test_without_the_fallback_a_standard_operator_is_refused_by_name() -> None:
    nodes = [helper.make_node("Relu", ["x"], ["y"], name="relu"),
             helper.make_node("Abs", ["y"], ["z"], name="abs")]  # fmt: skip
    proto = model(nodes, [value("x", F, [2])], [value("z", F, [2])])
    with TestClient(create_app(Settings(access_log=False))) as plain:
        detail = _refused(plain, proto)
    assert "OPSERVE_REFERENCE_FALLBACK is off" in detail
    assert "node 'relu' (Relu, domain '', version 14)" in detail
    assert "node 'abs' (Abs, domain '', version 13)" in detail


def test_cycle_and_use_before_production_name_the_nodes(client: TestClient) -> None:
    cycle = [helper.make_node("Tile", ["x", "r"], ["y"], name="tile"),
             helper.make_node("Shape", ["y"], ["r"], name="shape")]  # fmt: skip
    detail = _refused(client, model(cycle, [value("x", F, [2])], [value("y", F, [None])]))
    assert detail == ("the graph has a cycle: node 'tile' (Tile, domain '', version none) -> "
                      "node 'shape' (Shape, domain '', version none) -> node 'tile' (Tile, "
                      "domain '', version none)")  # fmt: skip
    early = [helper.make_node("Shape", ["y"], ["s"], name="late"),
             helper.make_node("Shape", ["x"], ["y"], name="early")]  # fmt: skip
    detail = _refused(client, model(early, [value("x", F, [2])], [value("s", I64, [1])]))
    assert "node 'late'" in detail and "reads 'y' before node 'early'" in detail
    nothing = [helper.make_node("Shape", ["ghost"], ["s"], name="haunted")]
    detail = _refused(client, model(nothing, [], [value("s", I64, [1])]))
    assert "node 'haunted'" in detail and "'ghost', which no graph input" in detail


def _nested(levels: int) -> ModelProto:
    """`levels` If nodes, each in the then-branch of the one above."""
    leaf = inner = helper.make_graph(
        [helper.make_node("Constant", [], ["o"], value=helper.make_tensor("v", F, [1], [1.0]))],
        "leaf", [], [value("o", F, [1])],
    )  # fmt: skip
    for depth in range(levels):  # the else-branch stays a leaf: the size grows linearly
        node = helper.make_node("If", ["cond"], ["o"], then_branch=inner, else_branch=leaf)
        inner = helper.make_graph([node], f"level{depth}", [], [value("o", F, [1])])
    return model(list(inner.node), [value("cond", TensorProto.BOOL, [])], [value("o", F, [1])])


def _field(number: int, payload: bytes) -> bytes:
    """A length-delimited protobuf field: serialized messages concatenate into one."""
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        out.append(n & 0x7F | (0x80 if n > 0x7F else 0))
        n >>= 7
        if not n:
            return bytes(out)


def _nested_bytes(levels: int) -> bytes:
    """`levels` nested If nodes, serialized by hand: Python's protobuf refuses to build (copy)
    messages nested that deep, and a client is not bound by that."""
    graph = _nested(0).graph.SerializeToString()
    for _ in range(levels):
        attr = helper.make_attribute("then_branch", _nested(0).graph).SerializeToString()
        attr = attr.replace(_field(6, _nested(0).graph.SerializeToString()), _field(6, graph))
        node = helper.make_node("If", ["cond"], ["o"]).SerializeToString() + _field(5, attr)
        graph = helper.make_graph([], "level", [], [value("o", F, [1])]).SerializeToString()
        graph += _field(1, node)
    shell = _nested(0)
    shell.ClearField("graph")
    return shell.SerializeToString() + _field(7, graph)


def test_deep_subgraphs_are_refused(client: TestClient) -> None:
    detail = _refused(client, _nested(9))
    assert "nested deeper than 8 levels" in detail
    assert "missing" in _refused(client, _nested(8))  # 8 levels pass; `cond` was not sent
    detail = _refused(client, _nested_bytes(100))  # protobuf's own depth limit: never a 5xx
    assert "not a serialized onnx.ModelProto" in detail
    assert "nested deeper than 8 levels" in _refused(client, _nested_bytes(12))


def test_a_hundred_thousand_nodes_are_refused_with_memory_flat(client: TestClient) -> None:
    node = helper.make_node("Shape", ["x"], ["s"])
    proto = model([node], [value("x", F, [2])], [value("s", I64, [1])])
    graph = proto.graph.SerializeToString() + _field(1, node.SerializeToString()) * 99_999
    proto.ClearField("graph")
    data = proto.SerializeToString() + _field(7, graph)  # serialized fields concatenate
    details: list[str] = []
    peak = _peak(lambda: details.append(_refused(client, data, status=413)))
    assert peak < 64 * MiB, peak
    assert "over 10000 nodes" in details[0] and "OPSERVE_MAX_GRAPH_NODES" in details[0]


def test_an_intermediate_over_the_output_limit_names_the_node(client: TestClient) -> None:
    huge = helper.make_tensor("n", I64, [2], [2**20, 2**20])
    nodes = [helper.make_node("Constant", [], ["n"], name="dims", value=huge),
             helper.make_node("ConstantOfShape", ["n"], ["big"], name="big"),
             helper.make_node("Shape", ["big"], ["s"], name="shape")]  # fmt: skip
    detail = _refused(client, model(nodes, [], [value("s", I64, [2])]), status=413)
    assert detail.startswith("node 'big' (ConstantOfShape-21): ")
    assert "output of shape [1048576, 1048576] and float would take 4398046511104 bytes" in detail


def test_garbage_model_bytes(client: TestClient) -> None:
    for garbage in (b"\xff" * 64, os.urandom(4096), b"not a model at all", b""):
        _refused(client, garbage)
        answer = client.post("/v1/models/run", files={"model": ("m.onnx", garbage)})
        assert answer.status_code == 422, answer.text
    answer = client.post("/v1/models/run", json={"model": "!!not base64!!"})
    assert answer.status_code == 422 and "base64" in answer.json()["detail"]


def test_a_multipart_body_with_a_thousand_parts(client: TestClient) -> None:
    fields = [(f"f{i}", (None, b"x" * 100)) for i in range(1000)]
    files = [(f"file{i}", (f"{i}.onnx", b"x" * 100)) for i in range(1000)]
    for parts in (fields, files, [("model", ("m.onnx", b"x"))] * 1000):
        answer: Any = None

        def send(parts: list = parts) -> None:
            nonlocal answer
            answer = client.post("/v1/models/run", files=parts)

        assert _peak(send) < 16 * MiB
        assert 400 <= answer.status_code < 500, answer.text


def _peak(work: Any) -> int:
    gc.collect()
    tracemalloc.start()
    try:
        work()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
