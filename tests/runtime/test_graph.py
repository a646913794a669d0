"""Graph semantics on hand-built models, checked against onnxruntime and onnx.reference."""

import numpy as np
import onnxruntime
import pytest
from onnx import helper
from onnx.reference import ReferenceEvaluator

from service.errors import InvalidInput, PayloadTooLarge
from service.runtime.plan import load_model
from service.settings import Settings

from .models import I64, F, chain, model, value

X = np.arange(6, dtype=np.float32).reshape(2, 3)
MiB = 1024 * 1024


def _ort(proto, feeds):  # type: ignore[no-untyped-def]
    session = onnxruntime.InferenceSession(proto.SerializeToString(),
                                           providers=["CPUExecutionProvider"])  # fmt: skip
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(None, feeds), strict=True))


@pytest.mark.parametrize("feeds", [{"x": X}, {"x": X[:1], "k": np.array([3, 2], np.int64)}])
def test_chain_matches_onnxruntime_and_the_reference(feeds: dict) -> None:
    proto = chain()
    result = load_model(proto.SerializeToString(), Settings()).run(feeds)
    ort = _ort(proto, feeds)
    ref = dict(zip(["t", "tail", "y"], ReferenceEvaluator(proto).run(None, feeds), strict=True))
    for name, got in result.outputs.items():
        np.testing.assert_array_equal(got, ort[name])
        np.testing.assert_array_equal(got, ref[name])
        assert got.dtype == ort[name].dtype
    assert [(n.name, n.version, n.ran_on) for n in result.nodes] == [
        ("shape", 21, "kernel"), ("fill", 21, "kernel"), ("repeats", 21, "kernel"),
        ("tile", 13, "kernel"), ("tail", 21, "kernel"), ("tile_x", 13, "kernel"),
    ]  # fmt: skip


def test_initializer_is_the_default_and_a_sent_input_overrides_it() -> None:
    loaded = load_model(chain().SerializeToString(), Settings())
    assert {s.name for s in loaded.inputs} == {"x", "k"}
    default = loaded.run({"x": X}, ["y"]).outputs["y"]
    np.testing.assert_array_equal(default, np.tile(X, (2, 1)))
    sent = loaded.run({"x": X, "k": np.array([1, 2], np.int64)}, ["y"]).outputs["y"]
    np.testing.assert_array_equal(sent, np.tile(X, (1, 2)))


def test_only_the_nodes_a_requested_output_needs_run() -> None:
    result = load_model(chain().SerializeToString(), Settings()).run({"x": X}, ["tail"])
    assert list(result.outputs) == ["tail"]
    assert [n.name for n in result.nodes] == ["shape", "fill", "repeats", "tile", "tail"]
    np.testing.assert_array_equal(result.outputs["tail"], [9])


def test_trace_lists_every_intermediate() -> None:
    result = load_model(chain().SerializeToString(), Settings()).run({"x": X}, trace=True)
    assert result.trace is not None
    seen = {(e.name, e.node, e.op_type, e.version, e.ran_on) for e in result.trace}
    assert seen == {("s", "shape", "Shape", 21, "kernel"), ("c", "fill", "ConstantOfShape", 21,
                     "kernel"), ("r", "repeats", "Constant", 21, "kernel"),
                    ("t", "tile", "Tile", 13, "kernel"), ("tail", "tail", "Shape", 21, "kernel"),
                    ("y", "tile_x", "Tile", 13, "kernel")}  # fmt: skip
    by_name = {e.name: e for e in result.trace}
    np.testing.assert_array_equal(by_name["c"].value, np.full((2, 3), 2.5, np.float32))
    assert all(e.microseconds >= 0 for e in result.trace)


def test_optional_empty_input_on_the_reference() -> None:
    clip = helper.make_node("Clip", ["x", "", "high"], ["y"], name="clip")
    proto = model([clip], [value("x", F, [2, 3])], [value("y", F, [2, 3])],
                  {"high": np.array(2.0, np.float32)})  # fmt: skip
    result = load_model(proto.SerializeToString(), Settings(reference_fallback=True)).run(
        {"x": X - 1}
    )
    np.testing.assert_array_equal(result.outputs["y"], np.minimum(X - 1, 2))
    np.testing.assert_array_equal(result.outputs["y"], _ort(proto, {"x": X - 1})["y"])
    assert result.nodes[0].ran_on == "reference" and result.nodes[0].version == 13


def test_an_empty_name_for_a_required_input_is_refused_naming_the_node() -> None:
    tile = helper.make_node("Tile", ["x", ""], ["y"], name="t1")
    proto = model([tile], [value("x", F, [2, 3])], [value("y", F, [None, None])])
    with pytest.raises(InvalidInput, match=r"onnx.checker: Node \(t1\)'s input 1 .* empty"):
        load_model(proto.SerializeToString(), Settings())


def _fan(count: int, kept: bool) -> bytes:
    """`count` ConstantOfShape nodes of 1 MiB each, each read by a Shape node; the big values
    are graph outputs when `kept`, otherwise released after their Shape."""
    size = helper.make_tensor("size", I64, [1], [MiB // 4])
    nodes, outputs = [helper.make_node("Constant", [], ["n"], name="n", value=size)], []
    for i in range(count):
        nodes += [helper.make_node("ConstantOfShape", ["n"], [f"big{i}"], name=f"big{i}",
                                   value=helper.make_tensor("v", F, [1], [1.0])),
                  helper.make_node("Shape", [f"big{i}"], [f"s{i}"], name=f"shape{i}")]  # fmt: skip
        outputs += [value(f"s{i}", I64, [1])] + ([value(f"big{i}", F, [None])] if kept else [])
    return model(nodes, [], outputs).SerializeToString()


def test_intermediates_are_released_so_a_total_over_the_budget_passes() -> None:
    settings = Settings(max_graph_bytes=3 * MiB)
    result = load_model(_fan(8, kept=False), settings).run({})  # 8 MiB made, 1 MiB live
    assert [int(result.outputs[f"s{i}"][0]) for i in range(8)] == [MiB // 4] * 8


@pytest.mark.parametrize("how", ["kept as outputs", "traced"])
def test_the_live_bytes_bound_names_the_node_that_would_pass_it(how: str) -> None:
    loaded = load_model(_fan(8, kept=how == "kept as outputs"), Settings(max_graph_bytes=3 * MiB))
    with pytest.raises(PayloadTooLarge, match=r"node 'big2' \(ConstantOfShape-21\).*"
                       "OPSERVE_MAX_GRAPH_BYTES") as info:  # fmt: skip
        loaded.run({}, trace=how == "traced")
    assert info.value.status_code == 413


@pytest.mark.parametrize(
    ("feeds", "outputs", "words"),
    [
        ({"x": X.astype(np.float64)}, None, "graph input 'x' is float, not double"),
        ({"x": X.reshape(3, 2)}, None, r"graph input 'x' has shape \[\?, 3\], not \[3, 2\]"),
        ({"x": X.reshape(6)}, None, r"has shape \[\?, 3\], not \[6\]"),
        ({}, None, "graph input 'x' is missing"),
        ({"x": X, "z": X}, None, "the graph has no input 'z'; its inputs are x, k"),
        ({"x": X}, ["nope"], "the graph has no output 'nope'; its outputs are t, tail, y"),
    ],
)
def test_bad_feeds_and_outputs_are_named(feeds: dict, outputs: list | None, words: str) -> None:
    with pytest.raises(InvalidInput, match=words):
        load_model(chain().SerializeToString(), Settings()).run(feeds, outputs)


def test_a_dim_param_accepts_any_size() -> None:
    loaded = load_model(chain().SerializeToString(), Settings())
    big = np.zeros((7, 3), np.float32)
    assert loaded.run({"x": big}, ["y"]).outputs["y"].shape == (14, 3)


def test_a_reference_error_on_bad_input_is_a_422_naming_the_node() -> None:
    reshape = helper.make_node("Reshape", ["x", "to"], ["y"], name="reshape")
    proto = model([reshape], [value("x", F, ["a", "b"]), value("to", I64, [2])],
                  [value("y", F, [None, None])])  # fmt: skip
    loaded = load_model(proto.SerializeToString(), Settings(reference_fallback=True))
    with pytest.raises(InvalidInput, match=r"^node 'reshape' \(Reshape-21\): onnx.reference "
                       "refused the inputs: ") as info:  # fmt: skip
        loaded.run({"x": X, "to": np.array([4, 5], np.int64)})
    assert info.value.status_code == 422
    ok = loaded.run({"x": X, "to": np.array([3, 2], np.int64)}).outputs["y"]
    np.testing.assert_array_equal(ok, X.reshape(3, 2))
