"""Our kernels against onnx.reference, onnxruntime and hand-computed values, for every
(operator, version, element type) cell, on hypothesis-drawn shapes, values and attributes.

An oracle that cannot check a cell is skipped with the reason from oracles.GAPS, after
proving that it still cannot (so the exclusions, and the coverage table built from them,
cannot go stale).
"""

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from onnx import AttributeProto, ModelProto, helper, numpy_helper

from service.codecs.dtypes import element_type
from service.kernels.context import KernelContext
from service.operators.node_attributes import node_attributes
from service.operators.registry import OpVersion, resolve
from service.operators.run import run

from .oracles import CONSTANT_FORMS, QUIRKS, Cell, cells, gap, seeding_rule
from .runtimes import assert_same, one_node_model, run_onnxruntime, run_reference
from .strategies import SHAPES, arrays, scalars

CELLS = cells()
CTX = KernelContext(max_output_bytes=1 << 24)
# Small budgets: every cell runs, so breadth comes from the cells, not from examples per cell
# (six each, for each of the three oracles: the draws are most of the table's time).
EXAMPLES = settings(
    max_examples=6, deadline=None, derandomize=True, database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)  # fmt: skip
Draw = Callable[[st.SearchStrategy], Any]
Avoid = frozenset[str]  # names of oracle quirks the drawn example must not trigger


@dataclass
class Example:
    """One drawn node: its inputs, the node itself, and what a hand computation expects."""

    op: OpVersion
    inputs: dict[str, np.ndarray]
    node: Any
    expected: np.ndarray

    @property
    def model(self) -> ModelProto:
        outputs = dict.fromkeys(self.op.outputs, self.expected)
        return one_node_model(self.node, self.op.since_version, self.inputs, outputs)

    def ours(self) -> list[np.ndarray]:
        attributes = node_attributes(self.op, self.node.attribute)
        return list(run(self.op, self.inputs, attributes, CTX).values())


def _node(op: OpVersion, **attributes: Any) -> Any:
    given = {k: v for k, v in attributes.items() if v is not None}
    return helper.make_node(op.op_type, op.inputs, op.outputs, **given)


def shape_example(op: OpVersion, cell: Cell, draw: Draw, avoid: Avoid) -> Example:
    data = draw(arrays(cell.dtype))
    start = end = None
    if op.since_version >= 15:
        start = draw(st.none() | st.integers(-4, 4))
        lowest = -data.ndim if "shape_end_below_minus_rank" in avoid else -4
        end = draw(st.none() | st.integers(lowest, 4))
    expected = np.array(data.shape[(start or 0) : end], dtype=np.int64)
    return Example(op, {"data": data}, _node(op, start=start, end=end), expected)


def tile_example(op: OpVersion, cell: Cell, draw: Draw, avoid: Avoid) -> Example:
    if op.since_version == 1:
        data = draw(arrays(cell.dtype, SHAPES.filter(lambda s: len(s) > 0)))
        count, axis = draw(st.integers(0, 3)), draw(st.integers(-data.ndim, data.ndim - 1))
        kind = draw(st.sampled_from([data.dtype, np.dtype(np.int64)]))  # input's type or int64
        reps = [count if i == axis % data.ndim else 1 for i in range(data.ndim)]
        inputs = {"input": data, "tiles": np.array(count, kind), "axis": np.array(axis, kind)}
        return Example(op, inputs, _node(op), np.tile(data, reps))
    data = draw(arrays(cell.dtype))
    reps = draw(st.lists(st.integers(0, 3), min_size=data.ndim, max_size=data.ndim))
    inputs = {"input": data, "repeats": np.array(reps, dtype=np.int64)}
    return Example(op, inputs, _node(op), np.tile(data, reps))


def constant_example(op: OpVersion, cell: Cell, draw: Draw, avoid: Avoid) -> Example:
    if cell.param == "sparse_value":
        return sparse_constant_example(op, cell, draw)
    if cell.param in CONSTANT_FORMS:
        return constant_form_example(op, cell, draw)
    value = draw(arrays(cell.dtype))
    return Example(op, {}, _node(op, value=numpy_helper.from_array(value)), value)


def constant_form_example(op: OpVersion, cell: Cell, draw: Draw) -> Example:
    one = {
        "float": st.floats(width=32),
        "int64": st.integers(-(2**63), 2**63 - 1),
        "string": st.text(st.characters(exclude_categories=("Cs",)), max_size=4),
    }[cell.dtype]
    value = draw(st.lists(one, max_size=4) if cell.param.endswith("s") else one)
    kind = {"float": AttributeProto.FLOAT, "int64": AttributeProto.INT,
            "string": AttributeProto.STRING}[cell.dtype]  # fmt: skip
    if cell.param.endswith("s"):  # an empty list has no type of its own
        kind = {AttributeProto.FLOAT: AttributeProto.FLOATS, AttributeProto.INT: AttributeProto.INTS,
                AttributeProto.STRING: AttributeProto.STRINGS}[kind]  # fmt: skip
    node = _node(op)
    node.attribute.append(helper.make_attribute(cell.param, value, attr_type=kind))
    expected = np.array(value, dtype=element_type(cell.dtype).np_dtype)
    return Example(op, {}, node, expected)


def sparse_constant_example(op: OpVersion, cell: Cell, draw: Draw) -> Example:
    dims = draw(hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=3))
    count = math.prod(dims)
    positions = draw(st.lists(st.integers(0, max(count - 1, 0)), unique=True, max_size=count))
    values = draw(arrays(cell.dtype, (len(positions),)))
    linear = np.array(positions, dtype=np.int64)
    if draw(st.booleans()):  # [NNZ, rank] coordinates instead of [NNZ] linear positions
        coordinates = np.unravel_index(linear, dims) if dims else ()
        indices = np.stack(coordinates, axis=-1) if dims else np.zeros((linear.size, 0), np.int64)
    else:
        indices = linear
    sparse = helper.make_sparse_tensor(
        numpy_helper.from_array(values), numpy_helper.from_array(indices.astype(np.int64)), dims
    )
    expected = np.zeros(count, dtype=values.dtype)
    if values.dtype == object:
        expected[:] = ""
    for position, value in zip(positions, values, strict=True):  # one by one, by hand
        expected[position] = value
    return Example(op, {}, _node(op, sparse_value=sparse), expected.reshape(dims))


def constant_of_shape_example(op: OpVersion, cell: Cell, draw: Draw, avoid: Avoid) -> Example:
    dims = draw(st.lists(st.integers(0, 3), max_size=3))
    default = cell.dtype == "float" and draw(st.booleans())  # the spec's default: float 0
    value = np.zeros(1, np.float32) if default else draw(scalars(cell.dtype))
    attribute = None if default else numpy_helper.from_array(value)
    expected = np.full(dims, value[0], dtype=value.dtype)
    return Example(op, {"input": np.array(dims, np.int64)}, _node(op, value=attribute), expected)


def random_uniform_like_example(op: OpVersion, cell: Cell, draw: Draw, avoid: Avoid) -> Example:
    # Input cells draw float or double outputs: the T2 cells cover the other output types.
    out = cell.dtype if cell.param == "T2" else draw(st.sampled_from(["float", "double"]))
    shapes = SHAPES.filter(len) if "random_scalar_input" in avoid else SHAPES
    data = draw(arrays(cell.dtype if cell.param == "T1" else "float", shapes))
    # The output type from the input itself, where the input's type is an output type.
    dtype = None if cell.param == "T1" and cell.dtype == out else element_type(out).enum
    low = draw(st.floats(-100, 100, width=32))
    high = low + draw(st.floats(0.5, 100, width=32))
    seed = draw(st.floats(0, 2**20, width=32))
    expected = seeding_rule(data.size, seed, low, high, element_type(out).np_dtype)
    node = _node(op, dtype=dtype, low=low, high=high, seed=seed)
    return Example(op, {"input": data}, node, expected.reshape(data.shape))


BUILDERS = {
    "Shape": shape_example,
    "Tile": tile_example,
    "Constant": constant_example,
    "ConstantOfShape": constant_of_shape_example,
    "RandomUniformLike": random_uniform_like_example,
}


def draw_example(cell: Cell, draw: Draw, oracle: str = "hand") -> Example:
    """An example of the cell, avoiding the oracle's known quirks."""
    op = resolve(cell.op_type, cell.version)
    assert op.since_version == cell.version
    return BUILDERS[cell.op_type](op, cell, draw, frozenset(QUIRKS[oracle]))


def _compare(cell: Cell, ours: list[np.ndarray], theirs: list[np.ndarray]) -> None:
    if cell.op_type == "RandomUniformLike":  # other generators: the same shape and type only
        assert [(a.shape, a.dtype) for a in ours] == [(b.shape, b.dtype) for b in theirs]
        return
    assert_same(ours, theirs)


def _check(cell: Cell, oracle: str, runtime: Callable) -> None:
    reason = gap(oracle, cell)
    if reason:
        _still_fails(cell, oracle, runtime)
        pytest.skip(reason)

    @EXAMPLES
    @given(st.data())
    def differential(data: st.DataObject) -> None:
        example = draw_example(cell, data.draw, oracle)
        _compare(cell, example.ours(), runtime(example.model, example.inputs))

    differential()


def _still_fails(cell: Cell, oracle: str, runtime: Callable) -> None:
    """The oracle's gap is real: it refuses or fails on a drawn example of the cell."""

    @settings(EXAMPLES, max_examples=1)
    @given(st.data())
    def fails(data: st.DataObject) -> None:
        example = draw_example(cell, data.draw, oracle)
        with pytest.raises(Exception):  # noqa: B017 - any failure: load, kernel or I/O
            runtime(example.model, example.inputs)

    fails()


@pytest.mark.parametrize("cell", CELLS, ids=lambda cell: cell.id)
def test_hand(cell: Cell) -> None:
    @EXAMPLES
    @given(st.data())
    def by_hand(data: st.DataObject) -> None:
        example = draw_example(cell, data.draw)
        assert_same(example.ours(), [example.expected])

    by_hand()


@pytest.mark.parametrize("cell", CELLS, ids=lambda cell: cell.id)
def test_reference(cell: Cell) -> None:
    _check(cell, "reference", run_reference)


@pytest.mark.parametrize("cell", CELLS, ids=lambda cell: cell.id)
def test_onnxruntime(cell: Cell) -> None:
    _check(cell, "onnxruntime", run_onnxruntime)


def test_reference_quirks_are_real() -> None:
    """The inputs the reference examples avoid are still mishandled by onnx.reference."""
    assert set(QUIRKS["reference"]) == {"shape_end_below_minus_rank", "random_scalar_input"}
    data = np.zeros((2, 3, 4), np.float32)
    shape = _node(resolve("Shape", 15), end=-4)
    model = one_node_model(shape, 15, {"data": data}, {"shape": np.zeros(0, np.int64)})
    (wrong,) = run_reference(model, {"data": data})
    assert wrong.tolist() == [2, 3]  # the spec (and onnxruntime, and we) say []
    assert run_onnxruntime(model, {"data": data})[0].tolist() == []
    scalar = np.array(0.5, np.float32)
    random = _node(resolve("RandomUniformLike", 22), seed=1.0)
    model = one_node_model(random, 22, {"input": scalar}, {"output": scalar})
    with pytest.raises(TypeError, match="RandomUniformLike") as caught:
        run_reference(model, {"input": scalar})
    assert "astype" in str(caught.value.__context__)
