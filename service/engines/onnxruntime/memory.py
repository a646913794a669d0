"""What a run on onnxruntime will hold at its peak, estimated before it runs from the shapes
onnx's shape inference finds, with the request's input shapes bound to the model's symbolic
dimensions.

The estimate walks the graph's nodes in order as the exact engine runs them: each node's
outputs become live when it runs and are released after their last reader (graph outputs are
kept). A value whose shape stays unknown (a dimension no input names, a data-dependent one),
and any value inside a subgraph (an If branch, a Loop's body: the walk sees only the main
graph), counts for nothing here: such an estimate is not whole. The run's outputs are claimed
at their real size once it returns, and what a run whose estimate was not whole really held is
measured (onnxruntime/resident.py) and kept as the estimate for the same inputs (`measured`).
"""

from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np
import onnx.shape_inference
from onnx import ModelProto, TensorProto, TypeProto, ValueInfoProto, helper, numpy_helper

from service.engines.onnxruntime.fold import fold

Dims = tuple[int | str | None, ...]
STRING_BYTES = 32  # what onnxruntime holds per string element besides its characters
MAX_CACHED_SHAPES = 64
SMALL_INITIALIZER = 64  # elements: a shape or a count, which inference may need the values of
REINFERRED_NODES = 256
"""A graph this small, with a size the symbols leave unknown (two inputs' dynamic dimensions
broadcast together, as in Triton's `simple`), is inferred again with each new request's own
shapes, once per shapes (cached): a few milliseconds on a kernel thread, and the estimate is
then whole, which a run on the event loop needs (onnxruntime/inline.py). A larger graph is inferred
again only for a small number input's values (_small_numbers), as inference takes longer
there."""


@dataclass
class MemoryPlan:
    """The graph's values (item size, dims) and, per node, the values it makes and frees."""

    inputs: tuple[tuple[str, Dims], ...]  # graph inputs' declared dims, to bind symbols
    values: tuple[tuple[int, Dims], ...]
    made: tuple[tuple[int, ...], ...]
    freed: tuple[tuple[int, ...], ...]
    # a shape skeleton of the model, kept when some size is unknown from the symbols alone
    # (or lies in a subgraph) and may follow a small number input's values (a ConstantOfShape
    # of a `dims` input) or, in a small graph, the request's shapes: then inferred again with
    # those (REINFERRED_NODES); the estimates are then kept by those values too (a measured one)
    skeleton: ModelProto | None = field(default=None, repr=False)
    strings: bool = False  # a value is a string tensor (its characters are not counted)
    nested: bool = False  # the graph has subgraphs (their values are not counted)
    # by the inputs' shapes (and values): (bytes at the peak, whether every size was known)
    peaks: dict[tuple, tuple[int, bool]] = field(default_factory=dict)

    def peak(self, inputs: Mapping[str, np.ndarray]) -> int:
        """Bytes live at the run's peak with these inputs (their own bytes not included)."""
        return self.estimate(inputs)[0]

    def estimate(self, inputs: Mapping[str, np.ndarray]) -> tuple[int, bool]:
        """The peak with these inputs, and whether it is whole: every value's size known (no
        strings, whose characters it does not count). Made once per inputs' key, which may
        infer shapes again (a skeleton): cost to be paid off the event loop."""
        key = self._key(inputs)
        found = self.peaks.get(key)
        if found is None:
            plan = self if self.skeleton is None else _plan(_valued(self.skeleton, inputs))
            found = plan._peak(inputs)
            if len(self.peaks) >= MAX_CACHED_SHAPES:
                self.peaks.clear()
            self.peaks[key] = found
        return found

    def estimated(self, inputs: Mapping[str, np.ndarray]) -> tuple[int, bool] | None:
        """The estimate for these inputs if it was made already (None: nothing is computed)."""
        return self.peaks.get(self._key(inputs))

    def measured(self, inputs: Mapping[str, np.ndarray], nbytes: int, most: int) -> None:
        """A run with these inputs held `nbytes` (measured after it, onnxruntime/resident.py):
        the estimate for the same inputs from now on, up to `most` (the graph limit: a figure
        of the whole process may be too high, so it is claimed, never a reason to refuse);
        still not whole."""
        key = self._key(inputs)
        known = self.peaks.get(key, (0, False))[0]
        if nbytes > known:
            self.peaks[key] = (max(known, min(nbytes, most)), False)

    def _key(self, inputs: Mapping[str, np.ndarray]) -> tuple:
        return tuple(_key(inputs.get(name), self.skeleton is not None) for name, _ in self.inputs)

    def _peak(self, inputs: Mapping[str, np.ndarray]) -> tuple[int, bool]:
        bound: dict[str, int] = {}
        for name, dims in self.inputs:
            if name in inputs and len(dims) == inputs[name].ndim:
                bound.update({d: n for d, n in zip(dims, inputs[name].shape, strict=True)
                              if isinstance(d, str)})  # fmt: skip
        sizes = [_bytes(itemsize, dims, bound) for itemsize, dims in self.values]
        live = peak = 0
        for made, freed in zip(self.made, self.freed, strict=True):
            live += sum(sizes[i] or 0 for i in made)
            peak = max(peak, live)
            live -= sum(sizes[i] or 0 for i in freed)
        whole = not (self.strings or self.nested) and all(size is not None for size in sizes)
        return peak, whole


def memory_plan(model: ModelProto) -> MemoryPlan:
    """The plan of a screened, checked model (inference opens no file)."""
    skeleton = _skeleton(model)
    plan = _plan(skeleton)
    symbols = {d for _, dims in plan.inputs for d in dims if isinstance(d, str)}
    unknown = plan.nested or any(d is None or (isinstance(d, str) and d not in symbols)
                                 for _, dims in plan.values for d in dims)  # fmt: skip
    small_graph = len(model.graph.node) <= REINFERRED_NODES
    if unknown and (small_graph or any(_small_numbers(i) for i in skeleton.graph.input)):
        plan.skeleton = skeleton
    return plan


def _skeleton(model: ModelProto) -> ModelProto:
    """The model with every large initializer turned into a typed graph input (inference
    needs its type, not its bytes) and every unnamed dynamic input dimension named, so that
    inference carries it to the values it sizes."""
    skeleton = ModelProto()
    skeleton.CopyFrom(model) if not model.graph.initializer else _copy_light(model, skeleton)
    for info in skeleton.graph.input:
        if info.type.HasField("tensor_type") and info.type.tensor_type.HasField("shape"):
            for axis, dim in enumerate(info.type.tensor_type.shape.dim):
                if not dim.HasField("dim_value") and not dim.dim_param:
                    dim.dim_param = f"opserve:{info.name}:{axis}"
    return skeleton


def _copy_light(model: ModelProto, skeleton: ModelProto) -> None:
    graph = model.graph
    large = [t for t in graph.initializer if _elements(t) > SMALL_INITIALIZER]
    kept = [t for t in graph.initializer if _elements(t) <= SMALL_INITIALIZER]
    skeleton.CopyFrom(model)
    del skeleton.graph.initializer[:]
    skeleton.graph.initializer.extend(kept)
    declared = {info.name for info in graph.input}
    for tensor in large:
        if tensor.name not in declared:
            skeleton.graph.input.append(helper.make_tensor_value_info(
                tensor.name, tensor.data_type, list(tensor.dims)))  # fmt: skip


def _elements(tensor: TensorProto) -> int:
    return int(np.prod(tensor.dims)) if tensor.dims else 1


SIZING_TYPES = (TensorProto.INT64, TensorProto.INT32, TensorProto.FLOAT, TensorProto.DOUBLE)
SMALL_FLOATS = 8  # a Resize's scales (one a dimension) or a Range's bounds; more is data


def _sizing(array: np.ndarray) -> bool:
    """Whether a request's array is small enough to be a shape, count, scales or bounds, whose
    values inference may need (a data input of a few floats counts too, at worst costing an
    inference on a thread per new value)."""
    if array.ndim > 1:
        return False
    if array.dtype.kind == "i":
        return array.size <= SMALL_INITIALIZER
    return array.dtype.kind == "f" and array.size <= SMALL_FLOATS


def _small_numbers(info: ValueInfoProto) -> bool:
    """An input whose values may size something, rank <= 1: a shape or a count (integers), a
    Resize's scales or a Range's bounds (floats), which inference sizes once it has them."""
    tensor = info.type.tensor_type
    return tensor.elem_type in SIZING_TYPES and (
        tensor.HasField("shape") and len(tensor.shape.dim) <= 1)  # fmt: skip


def _valued(skeleton: ModelProto, inputs: Mapping[str, np.ndarray]) -> ModelProto:
    """The skeleton with the request's small number inputs as initializers (their values),
    small integer arithmetic on them folded (onnxruntime/fold.py), and its other inputs at
    the request's shapes."""
    valued = ModelProto()
    valued.CopyFrom(skeleton)
    graph = valued.graph
    for info in list(graph.input):
        array = inputs.get(info.name)
        if array is None:
            continue
        if _small_numbers(info) and _sizing(array):
            graph.input.remove(info)
            graph.initializer.append(numpy_helper.from_array(array, info.name))
            continue
        shape = info.type.tensor_type.shape if info.type.HasField("tensor_type") else None
        if shape is not None and len(shape.dim) == array.ndim:
            for dim, n in zip(shape.dim, array.shape, strict=True):
                dim.dim_value = n  # clears dim_param (a oneof)
    fold(graph)  # Abs, Add, Reshape... of those values, which inference does not carry
    return valued


def _key(array: np.ndarray | None, valued: bool) -> tuple | None:
    if array is None:
        return None
    if valued and _sizing(array):
        return (array.shape, tuple(array.reshape(-1).tolist()))
    return (array.shape,)


def _plan(model: ModelProto) -> MemoryPlan:
    try:
        graph = onnx.shape_inference.infer_shapes(model, strict_mode=False, data_prop=True).graph
    except Exception:  # inference is a help here: unknown shapes count for nothing
        graph = model.graph
    types: dict[str, TypeProto] = {}
    for info in [*graph.value_info, *graph.output]:
        types[info.name] = info.type
    kept = {info.name for info in graph.output}
    index: dict[str, int] = {}
    values: list[tuple[int, Dims]] = []
    made: list[tuple[int, ...]] = []
    last: dict[int, int] = {}
    for at, node in enumerate(graph.node):
        for name in node.input:
            if name in index:
                last[index[name]] = at
        mine = []
        for name in node.output:
            if name:
                index[name] = len(values)
                last[len(values)] = at  # a value nothing reads is freed right after its node
                mine.append(len(values))
                values.append(_value(types.get(name)))
        made.append(tuple(mine))
    freed: list[list[int]] = [[] for _ in made]
    for name, i in index.items():
        if name not in kept:
            freed[last[i]].append(i)
    inputs = tuple((info.name, _value(info.type)[1]) for info in model.graph.input)
    strings = any(kind.tensor_type.elem_type == TensorProto.STRING for kind in types.values()
                  if kind.HasField("tensor_type"))  # fmt: skip
    nested = any(a.HasField("g") or a.graphs for node in graph.node for a in node.attribute)
    return MemoryPlan(inputs, tuple(values), tuple(made), tuple(tuple(f) for f in freed),
                      strings=strings, nested=nested)  # fmt: skip


def _value(kind: TypeProto | None) -> tuple[int, Dims]:
    if kind is None or not kind.HasField("tensor_type"):
        return 0, (None,)
    tensor = kind.tensor_type
    if not tensor.HasField("shape"):
        return 0, (None,)
    if tensor.elem_type == TensorProto.STRING:
        itemsize = STRING_BYTES
    else:
        try:
            itemsize = np.dtype(helper.tensor_dtype_to_np_dtype(tensor.elem_type)).itemsize
        except (KeyError, TypeError, ValueError):
            itemsize = 0
    dims: Dims = tuple(
        d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in tensor.shape.dim
    )
    return itemsize, dims


def _bytes(itemsize: int, dims: Dims, bound: Mapping[str, int]) -> int | None:
    """The value's bytes; None when a dimension (or its type) is unknown."""
    if not itemsize:
        return None
    total = itemsize
    for d in dims:
        n = bound.get(d) if isinstance(d, str) else d
        if n is None:
            return None
        total *= n
    return total
