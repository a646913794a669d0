"""Which oracle checks which (operator, version, element type) cell, and why an oracle cannot.

The differential tests and tools/coverage_table.py both read these tables, so the published
coverage is exactly what the tests run. A gap is an oracle's limitation, with its reason; the
tests also prove every gap is still real (an oracle that learns a type must be used).
"""

from dataclasses import dataclass
from functools import cache

import numpy as np

from service.operators.registry import OpVersion, operators

from .backend_cases import backend_cases, opset

ORACLES = ("backend", "reference", "onnxruntime", "hand")
ORACLE_NAMES = {
    "backend": "onnx backend test case",
    "reference": "onnx.reference.ReferenceEvaluator",
    "onnxruntime": "onnxruntime (CPU)",
    "hand": "hand-computed (numpy, or the documented rule)",
}
# The type parameters whose element types make the cells: the data, not the int64 shapes.
CELL_PARAMS = {
    "Constant": ("T",),
    "ConstantOfShape": ("T2",),
    "RandomUniformLike": ("T1", "T2"),
    "Shape": ("T",),
    "Tile": ("T",),
}
ROLE = {  # what the element type is the type of, per (operator, type parameter)
    ("Constant", "T"): "output (the value)",
    ("ConstantOfShape", "T2"): "output (the value)",
    ("RandomUniformLike", "T1"): "input",
    ("RandomUniformLike", "T2"): "output (dtype)",
    ("Shape", "T"): "data",
    ("Tile", "T"): "input and output",
}


@dataclass(frozen=True)
class Cell:
    """One operator version with one element type for one of its type parameters."""

    op_type: str
    version: int
    param: str
    dtype: str

    @property
    def id(self) -> str:
        return f"{self.op_type}-{self.version}-{self.param}-{self.dtype}"


@dataclass(frozen=True)
class Gap:
    """An oracle cannot check these cells (None matches any operator, version or type)."""

    op_type: str | None
    versions: frozenset[int] | None
    dtypes: frozenset[str] | None
    reason: str
    param: str | None = None

    def covers(self, cell: Cell) -> bool:
        return (
            self.op_type in (None, cell.op_type)
            and (self.versions is None or cell.version in self.versions)
            and (self.dtypes is None or cell.dtype in self.dtypes)
            and self.param in (None, cell.param)
        )


FLOAT8 = frozenset({"float8e4m3fn", "float8e4m3fnuz", "float8e5m2", "float8e5m2fnuz"})
NEWEST = frozenset({"int4", "uint4", "int2", "uint2", "float4e2m1", "float8e8m0"})
COMPLEX = frozenset({"complex64", "complex128"})

GAPS: dict[str, list[Gap]] = {
    "backend": [],  # backend cases cover what they cover: see backend_cells()
    "reference": [
        Gap("Tile", frozenset({1}), None, "onnx.reference implements Tile from version 6 only"),
        Gap(
            "Constant",
            None,
            None,
            "onnx.reference cannot run a Constant with sparse_value",
            param="sparse_value",
        ),
    ],
    "onnxruntime": [
        Gap(None, None, COMPLEX, "onnxruntime registers no complex tensor type"),
        Gap(
            "Constant",
            None,
            None,
            "onnxruntime outputs sparse_value as a sparse tensor: it does not densify it",
            param="sparse_value",
        ),
        Gap(
            "Tile",
            frozenset({1}),
            None,
            "no Tile-1 kernel (and a float16 Tile-1 model is refused as invalid)",
        ),
        Gap("Tile", frozenset({13}), frozenset({"bfloat16"}), "no bfloat16 Tile kernel"),
        Gap(
            "ConstantOfShape",
            None,
            FLOAT8,
            "ConstantOfShape fails to read a float8 `value` (SetValueFromTensorProto)",
        ),
        Gap("ConstantOfShape", None, NEWEST, "no ConstantOfShape kernel for the type"),
        Gap("Shape", frozenset({19}), FLOAT8, "no float8 Shape kernel before version 21"),
        Gap("Shape", None, NEWEST, "no Shape kernel for the type"),
        Gap("RandomUniformLike", frozenset({22}), None, "no RandomUniformLike-22 kernel"),
        Gap(
            "RandomUniformLike",
            frozenset({1}),
            frozenset({"float16"}),
            "no float16 RandomUniformLike kernel",
            param="T2",
        ),
    ],
    "hand": [],  # every cell has a hand-computed expectation
}


# Inputs on which an oracle is known wrong, in cells it otherwise checks: the examples drawn for
# that oracle avoid them, and test_differential proves each quirk still exists.
QUIRKS: dict[str, dict[str, str]] = {
    "backend": {},
    "reference": {
        "shape_end_below_minus_rank": "Shape 15+: an `end` below -rank is not clamped to 0 "
        "(onnx.reference slices with end + rank, a negative index, so [2, 3, 4] with end=-4 "
        "gives [2, 3] instead of [])",
        "random_scalar_input": "RandomUniformLike: a scalar input fails "
        "(numpy's RandomState.rand() returns a float, which has no astype)",
    },
    "onnxruntime": {},
    "hand": {},
}


# Constant's other attribute forms, each with the one type it makes. Their cells carry the
# attribute's name where the others carry a type parameter; sparse_value takes every type of T.
CONSTANT_FORMS = {
    "value_float": "float",
    "value_floats": "float",
    "value_int": "int64",
    "value_ints": "int64",
    "value_string": "string",
    "value_strings": "string",
}


@cache
def cells() -> tuple[Cell, ...]:
    """Every (operator, version, type parameter, element type) the contract serves, then
    Constant's other attribute forms per version."""
    found = []
    for _, op_type, versions in operators():
        for op in versions:
            for param in CELL_PARAMS[op_type]:
                for dtype in allowed(op, param):
                    found.append(Cell(op_type, op.since_version, param, dtype))
    for op in next(vs for _, t, vs in operators() if t == "Constant"):
        forms = op.attributes.model_fields
        if "sparse_value" in forms:
            found += [
                Cell("Constant", op.since_version, "sparse_value", t) for t in allowed(op, "T")
            ]
        found += [Cell("Constant", op.since_version, f, CONSTANT_FORMS[f]) for f in CONSTANT_FORMS
                  if f in forms]  # fmt: skip
    return tuple(found)


def allowed(op: OpVersion, param: str) -> list[str]:
    """The element type names a version's type parameter allows, sorted."""
    (constraint,) = (c for c in op.schema.type_constraints if c.type_param_str == param)
    return sorted(t[len("tensor(") : -1] for t in constraint.allowed_type_strs)


def gap(oracle: str, cell: Cell) -> str | None:
    """Why `oracle` cannot check `cell`, or None when it can."""
    if oracle == "backend":
        return None if cell in backend_cells() else "no backend case"
    return next((g.reason for g in GAPS[oracle] if g.covers(cell)), None)


@cache
def backend_cells() -> frozenset[Cell]:
    """The cells the onnx backend node cases exercise (test_backend_cases.py runs them)."""
    found = set()
    for case in backend_cases():
        node = case.model.graph.node[0]
        op = next(v for _, t, vs in operators() if t == node.op_type for v in reversed(vs)
                  if v.since_version <= opset(case))  # fmt: skip
        for inputs, outputs in case.data_sets:
            arrays = dict(zip(op.inputs, inputs, strict=False))
            arrays.update(zip(op.outputs, outputs, strict=False))
            for formal in [*op.schema.inputs, *op.schema.outputs]:
                if formal.type_str in CELL_PARAMS[op.op_type] and formal.name in arrays:
                    dtype = _type_name(np.asarray(arrays[formal.name]))
                    found.add(Cell(op.op_type, op.since_version, formal.type_str, dtype))
    return frozenset(found)


def _type_name(array: np.ndarray) -> str:
    from service.codecs.dtypes import element_type_of

    return element_type_of(array).name


def seeding_rule(count: int, seed: float, low: float, high: float, dtype: object) -> np.ndarray:
    """RandomUniformLike's documented seeding rule, written out independently of the kernel:
    PCG64 seeded by SeedSequence(float32 bits of the seed); u = (raw >> 11) * 2**-53;
    low + (high - low) * u rounded to the type; values rounding to >= high become the largest
    value below high, values rounding below low the smallest value >= low."""
    f32 = np.float32
    bits = int(np.array([seed], f32).view(np.uint32)[0])
    raw = np.random.PCG64(np.random.SeedSequence(bits)).random_raw(count)
    unit = np.array([(int(r) >> 11) * 2.0**-53 for r in raw], dtype=np.float64)
    low, high = float(f32(low)), float(f32(high))
    with np.errstate(over="ignore"):  # bounds beyond float16's range round to infinity
        values = (low + (high - low) * unit).astype(dtype)
        values[values.astype(np.float64) >= high] = _step_until(high, dtype, below=True)
        values[values.astype(np.float64) < low] = _step_until(low, dtype, below=False)
    return values


def _step_until(bound: float, dtype: object, below: bool) -> np.ndarray:
    """The largest value of `dtype` < bound (below) or the smallest >= bound."""
    value = np.array(bound, dtype)
    toward = np.array(-np.inf if below else np.inf, dtype)
    while (float(value) >= bound) if below else (float(value) < bound):
        value = np.nextafter(value, toward)
    return value
