"""Hostile models of issue 16's table, built small (onnx.helper), and how to post them."""

import json
import time

import httpx
import numpy as np
from onnx import ModelProto, TensorProto, helper

from tests.api.live_server import Server
from tests.runtime.models import I64, F, b64, model, value


def tile_chain(nodes: int, elements: int) -> ModelProto:
    """ConstantOfShape makes `elements` floats, then `nodes` Tile nodes copy them (repeats 1):
    a long run on our kernels, each node bounded."""
    shape = helper.make_tensor("shape", I64, [1], [elements])
    steps = [helper.make_node("Constant", [], ["n"], name="n", value=shape),
             helper.make_node("ConstantOfShape", ["n"], ["t0"], name="fill")]  # fmt: skip
    for i in range(nodes):
        steps.append(helper.make_node("Tile", [f"t{i}", "one"], [f"t{i + 1}"], name=f"tile{i}"))
    steps.append(helper.make_node("Shape", [f"t{nodes}"], ["s"], name="shape"))
    return model(steps, [], [value("s", I64, [1])], {"one": np.ones(1, np.int64)})


def fills(count: int, elements: int, dtype: int = TensorProto.DOUBLE) -> ModelProto:
    """`count` ConstantOfShape outputs of `elements` each: a tiny model, a huge answer."""
    shape = helper.make_tensor("shape", I64, [1], [elements])
    one = helper.make_tensor("v", dtype, [1], [1.5])
    steps = [helper.make_node("Constant", [], ["n"], name="n", value=shape)]
    outputs = []
    for i in range(count):
        steps.append(helper.make_node("ConstantOfShape", ["n"], [f"o{i}"], name=f"fill{i}",
                                      value=one))  # fmt: skip
        outputs.append(value(f"o{i}", dtype, [elements]))
    return model(steps, [], outputs)


def endless_loop(trips: int = 10**12) -> ModelProto:
    """A Loop of `trips` turns whose body adds one (onnx.reference, the fallback)."""
    body = helper.make_graph(
        [helper.make_node("Add", ["x_in", "one"], ["x_out"]),
         helper.make_node("Identity", ["cond_in"], ["cond_out"])],
        "body",
        [value("i", I64, []), value("cond_in", TensorProto.BOOL, []), value("x_in", F, [1])],
        [value("cond_out", TensorProto.BOOL, []), value("x_out", F, [1])],
        [helper.make_tensor("one", F, [1], [1.0])],
    )  # fmt: skip
    trip = helper.make_tensor("trip", I64, [], [trips])
    cond = helper.make_tensor("cond", TensorProto.BOOL, [], [True])
    steps = [helper.make_node("Constant", [], ["trip"], value=trip),
             helper.make_node("Constant", [], ["cond"], value=cond),
             helper.make_node("Loop", ["trip", "cond", "x"], ["y"], name="loop", body=body)]  # fmt: skip
    return model(steps, [value("x", F, [1])], [value("y", F, [1])])


def regex_freeze() -> ModelProto:
    """RegexFullMatch with a catastrophic backtracking pattern (onnx.reference)."""
    node = helper.make_node("RegexFullMatch", ["x"], ["y"], name="regex", pattern="(a+)+$")
    return model([node], [value("x", TensorProto.STRING, [1])],
                 [value("y", TensorProto.BOOL, [1])], opset=20)  # fmt: skip


def expand_huge(elements: int = 768 * 1024 * 1024) -> ModelProto:
    """Expand a float scalar to `elements` (onnx.reference): inference knows the size."""
    shape = helper.make_tensor("shape", I64, [1], [elements])
    steps = [helper.make_node("Constant", [], ["s"], value=shape),
             helper.make_node("Expand", ["x", "s"], ["y"], name="expand")]  # fmt: skip
    return model(steps, [value("x", F, [1])], [value("y", F, [None])])


def expand_input(elements: int) -> ModelProto:
    """Expand a float to a shape that comes in as an input: inference cannot size it."""
    node = helper.make_node("Expand", ["x", "s"], ["y"], name="expand")
    return model([node], [value("x", F, [1]), value("s", I64, [1])], [value("y", F, [None])])


def posted(built: ModelProto, inputs: dict | None = None, **options: object) -> bytes:
    """The JSON body of `POST /v1/models/run` for a model."""
    return json.dumps({"model": b64(built), "inputs": inputs or {}, **options}).encode()


def post_run(server: Server, body: bytes, timeout: float = 60) -> tuple[int, dict, float]:
    """POST `body` to the server's /v1/models/run: the status, the JSON answer, the seconds."""
    start = time.monotonic()
    answer = httpx.post(f"{server.url}/v1/models/run", content=body, timeout=timeout,
                        headers={"content-type": "application/json"})  # fmt: skip
    return answer.status_code, answer.json(), time.monotonic() - start


def back_near_idle(server: Server, idle: int, margin: int, seconds: float = 10) -> int:
    """The server's RSS once it is under `idle` + `margin`, or after `seconds`."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and server.rss_bytes() >= idle + margin:
        time.sleep(0.2)
    return server.rss_bytes()
