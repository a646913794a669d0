"""Hand-built models for the runtime tests (onnx.helper), and how to post them."""

import base64
from typing import Any

import numpy as np
from onnx import ModelProto, NodeProto, TensorProto, ValueInfoProto, helper, numpy_helper

F, I64 = TensorProto.FLOAT, TensorProto.INT64


def model(nodes: list[NodeProto], inputs: list[ValueInfoProto], outputs: list[ValueInfoProto],
          initializers: dict[str, np.ndarray] | None = None, opset: int = 21,
          **extra: Any) -> ModelProto:  # fmt: skip
    graph = helper.make_graph(
        nodes, "g", inputs, outputs,
        [numpy_helper.from_array(a, n) for n, a in (initializers or {}).items()],
    )  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)],
                             ir_version=10, **extra)  # fmt: skip


def value(name: str, elem: int = F, shape: list[Any] | None = None) -> ValueInfoProto:
    return helper.make_tensor_value_info(name, elem, shape)


def b64(message: Any) -> str:
    return base64.b64encode(message.SerializeToString()).decode()


def proto(array: np.ndarray) -> dict[str, str]:
    return {"tensor_proto": b64(numpy_helper.from_array(np.asarray(array)))}


def from_proto(tensor: dict[str, str]) -> np.ndarray:
    parsed = TensorProto()
    parsed.ParseFromString(base64.b64decode(tensor["tensor_proto"]))
    return numpy_helper.to_array(parsed)


def chain() -> ModelProto:
    """Shape -> ConstantOfShape -> Tile (repeats from a Constant node) -> Shape(start=1), and
    a second Tile with an initializer-backed input `reps`."""
    fill = helper.make_tensor("fill", F, [1], [2.5])
    reps = helper.make_tensor("reps", I64, [2], [1, 3])
    nodes = [
        helper.make_node("Shape", ["x"], ["s"], name="shape"),
        helper.make_node("ConstantOfShape", ["s"], ["c"], name="fill", value=fill),
        helper.make_node("Constant", [], ["r"], name="repeats", value=reps),
        helper.make_node("Tile", ["c", "r"], ["t"], name="tile"),
        helper.make_node("Shape", ["t"], ["tail"], name="tail", start=1),
        helper.make_node("Tile", ["x", "k"], ["y"], name="tile_x"),
    ]
    return model(nodes, [value("x", F, ["n", 3]), value("k", I64, [2])],
                 [value("t", F, [None, None]), value("tail", I64, [1]),
                  value("y", F, [None, None])],
                 {"k": np.array([2, 1], np.int64)})  # fmt: skip


def tiler(repeats: list[int]) -> bytes:
    """y = Tile(x, repeats) with the repeats baked in (float [2, 3] in), serialized: each
    version of a repository model made of it answers its own shape."""
    graph = helper.make_graph(
        [helper.make_node("Tile", ["x", "r"], ["y"])], "tiler",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, None])],
        [helper.make_tensor("r", TensorProto.INT64, [2], repeats)],
    )  # fmt: skip
    made = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)
    return made.SerializeToString()


def chained_steps(step_model: str, steps: int, through: tuple[str, str],
                  shared: tuple[str, ...] = ()) -> str:  # fmt: skip
    """An ensemble's `ensemble_scheduling` running `step_model` `steps` times in a chain: its
    input `through[0]` reads the ensemble's (then the step before's output), its output
    `through[1]` feeds the next step (the last: the ensemble's); each of `shared` is the
    ensemble's input of that name, read by every step."""
    first, last = through
    chain = []
    for i in range(steps):
        source = first if i == 0 else f"t{i}"
        target = last if i == steps - 1 else f"t{i + 1}"
        reads = "".join(f' input_map {{key: "{n}" value: "{n}"}}' for n in shared)
        chain.append(f'{{model_name: "{step_model}" model_version: -1 input_map {{key: '
                     f'"{first}" value: "{source}"}}{reads} output_map {{key: "{last}" '
                     f'value: "{target}"}}}}')  # fmt: skip
    return f"ensemble_scheduling {{step [{', '.join(chain)}]}}\n"
