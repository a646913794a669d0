"""ModelProto bytes -> LoadedModel: screened, checked, every node bound to the step that runs
it, and every node the service cannot run refused in one answer before anything runs."""

from collections.abc import Iterator

import onnx
import onnx.checker
import onnx.defs
import onnx.shape_inference
from google.protobuf.message import DecodeError
from onnx import GraphProto, ModelProto, NodeProto, TypeProto, ValueInfoProto, helper

from service.codecs.limits import Limits
from service.codecs.tensor_proto import tensor_to_array
from service.errors import InvalidInput, ServiceError, located
from service.operators import registry
from service.operators.node_attributes import node_attributes
from service.runtime.digest import model_digest
from service.runtime.graph import LoadedModel, Step, TensorSpec
from service.runtime.screen import screen
from service.runtime.steps import KernelStep, NodeReport, ReferenceStep
from service.settings import Settings

STANDARD_DOMAINS = frozenset(s.domain for s in onnx.defs.get_all_schemas_with_history())
_SHOWN_REFUSALS = 50
LOAD_MEMORY_FACTOR = 4
"""Memory loading a model may hold per byte of it: the parsed ModelProto, its initializers
as arrays, the copy onnx.checker serializes, the one-node models of reference nodes."""


def load_model(data: bytes, settings: Settings) -> LoadedModel:
    """Parse, screen and check a serialized ModelProto; 4xx for anything the service refuses."""
    model = checked(data, settings)
    limits = Limits.of(settings)
    initializers = {}
    for tensor in model.graph.initializer:
        with located("initializer", tensor.name[:100]):
            initializers[tensor.name] = tensor_to_array(tensor, limits)
    steps = tuple(_steps(model, settings, limits))
    # a model with a node on onnx.reference keeps its bytes: its runs go to a worker process
    isolated = any(isinstance(step, ReferenceStep) for step in steps)
    return LoadedModel(
        inputs=tuple(_spec(info, "input") for info in model.graph.input),
        outputs=tuple(_spec(info, "output") for info in model.graph.output),
        steps=steps,
        initializers=initializers,
        max_graph_bytes=settings.max_graph_bytes,
        source=data if isolated else b"",
        source_id=model_digest(data) if isolated else b"",
    )


def checked(data: bytes, settings: Settings) -> ModelProto:
    """The parsed model, screened and checked (every engine's first step); 4xx for anything
    the service refuses."""
    model = parse(data)
    screen(model, settings.max_graph_nodes, settings.max_graph_depth)
    check_order(model.graph)
    try:
        onnx.checker.check_model(model, full_check=False)
    except (onnx.checker.ValidationError, ValueError, RuntimeError) as exc:
        raise InvalidInput(f"the model fails onnx.checker: {_short(str(exc))}") from None
    if model.graph.sparse_initializer:
        raise InvalidInput("sparse initializers are not supported; make them dense")
    return model


def graph_specs(model: ModelProto) -> tuple[tuple[TensorSpec, ...], tuple[TensorSpec, ...]]:
    """The graph's inputs and outputs as the API takes and gives them (422 for a non-tensor)."""
    return (tuple(_spec(info, "input") for info in model.graph.input),
            tuple(_spec(info, "output") for info in model.graph.output))  # fmt: skip


def node_version(node: NodeProto, opsets: dict[str, int]) -> int | None:
    """The since_version of the node's schema at the model's opset (None: none known)."""
    domain = "" if node.domain == "ai.onnx" else node.domain
    return _version(node, domain, opsets.get(domain))


def parse(data: bytes) -> ModelProto:
    model = ModelProto()
    try:
        model.ParseFromString(data)
    except (DecodeError, RuntimeError, ValueError) as exc:
        raise InvalidInput(f"the model is not a serialized onnx.ModelProto: {_short(str(exc))}"
                           ) from None  # fmt: skip
    return model


def check_order(graph: GraphProto) -> None:
    """Each node's inputs must exist before it: refuse a cycle, a name used before the node
    that makes it, or one nothing makes, naming the node and the name."""
    known = {info.name for info in graph.input} | {t.name for t in graph.initializer}
    producer = {name: i for i, node in enumerate(graph.node) for name in node.output if name}
    for i, node in enumerate(graph.node):
        for name in node.input:
            if not name or name in known:
                continue
            at = producer.get(name)
            if at is None:
                raise InvalidInput(f"{_node(node, i)} reads {name[:100]!r}, which no graph "
                                   "input, initializer or node provides")  # fmt: skip
            cycle = _cycle(graph, producer, i)
            if cycle:
                raise InvalidInput("the graph has a cycle: " + " -> ".join(cycle))
            raise InvalidInput(f"{_node(node, i)} reads {name[:100]!r} before "
                               f"{_node(graph.node[at], at)} produces it")  # fmt: skip
        known.update(node.output)


def _cycle(graph: GraphProto, producer: dict[str, int], start: int) -> list[str]:
    """The nodes of a cycle through node `start`, if there is one (iterative DFS)."""
    path: dict[int, int] = {}  # node -> the node that reached it
    stack = [(start, p) for p in _producers(graph.node[start], producer)]
    while stack:
        parent, i = stack.pop()
        if i in path:
            continue
        path[i] = parent
        if i == start:
            chain, at = [start], parent
            while at != start:
                chain.append(at)
                at = path[at]
            return [_node(graph.node[j], j) for j in [start, *reversed(chain[1:]), start]]
        stack += [(i, p) for p in _producers(graph.node[i], producer)]
    return []


def _producers(node: NodeProto, producer: dict[str, int]) -> list[int]:
    return [producer[name] for name in node.input if name in producer]


def _steps(model: ModelProto, settings: Settings, limits: Limits) -> Iterator[Step]:
    opsets = {("" if o.domain == "ai.onnx" else o.domain): o.version for o in model.opset_import}
    functions = {(f.domain, f.name) for f in model.functions}
    steps, refused = [], []
    types: dict[str, TypeProto] | None = None  # known value types, for the reference
    available = {info.name for info in model.graph.input}
    available |= {t.name for t in model.graph.initializer}
    for i, node in enumerate(model.graph.node):
        domain = "" if node.domain == "ai.onnx" else node.domain
        opset = opsets.get(domain)
        report = NodeReport(node.name, node.op_type, domain, _version(node, domain, opset), "")
        step: Step | None = None
        if registry.is_served(node.op_type, domain) and opset is not None:
            step = _kernel_step(node, i, report, opset, settings, limits)
        if (
            step is None
            and settings.reference_fallback
            and (domain in STANDARD_DOMAINS or (domain, node.op_type) in functions)
        ):
            types = _value_types(model) if types is None else types
            outer = sorted(_outer_names(node) & available)
            step = _reference_step(node, report, outer, model, types)
        if step is None:
            refused.append(_node(node, i, report))
        else:
            steps.append(step)
        available.update(node.output)
    if refused:
        shown = "; ".join(refused[:_SHOWN_REFUSALS])
        more = len(refused) - _SHOWN_REFUSALS
        shown += f"; and {more} more" if more > 0 else ""
        where = "on its kernels or on onnx.reference" if settings.reference_fallback else (
            "on its kernels (OPSERVE_REFERENCE_FALLBACK is off)")  # fmt: skip
        raise InvalidInput(f"the service cannot run {len(refused)} node(s) of the model "
                           f"{where}: {shown}", loc=("model",))  # fmt: skip
    yield from steps


def _kernel_step(node: NodeProto, i: int, report: NodeReport, opset: int,
                 settings: Settings, limits: Limits) -> KernelStep | None:  # fmt: skip
    try:
        op = registry.resolve(node.op_type, opset, report.domain)
    except ServiceError:
        return None  # no served version at this opset
    report = NodeReport(report.name, report.op_type, report.domain, op.since_version, "kernel")
    if len(node.input) > len(op.inputs) or len(node.output) > len(op.outputs):
        raise InvalidInput(f"{_node(node, i, report)} has {len(node.input)} inputs and "
                           f"{len(node.output)} outputs; {op.name} takes at most "
                           f"{len(op.inputs)} and {len(op.outputs)}")  # fmt: skip
    try:
        attributes = node_attributes(op, node.attribute, limits)
    except ServiceError as exc:
        exc.operator = _node(node, i, report)
        raise
    return KernelStep(report, tuple(node.input), tuple(node.output), op, attributes,
                      settings.max_output_bytes)  # fmt: skip


def _reference_step(
    node: NodeProto,
    report: NodeReport,
    outer: list[str],
    model: ModelProto,
    types: dict[str, TypeProto],
) -> ReferenceStep | None:
    report = NodeReport(report.name, report.op_type, report.domain, report.version, "reference")
    try:
        return ReferenceStep(report, node, outer, model, types)
    except Exception:  # the reference has no implementation (or cannot build this node)
        return None


def _value_types(model: ModelProto) -> dict[str, TypeProto]:
    """The type of every value the model declares or onnx's shape inference finds (the model
    is screened: inference reads no file)."""
    try:
        graph = onnx.shape_inference.infer_shapes(model, strict_mode=False).graph
    except Exception:  # inference is a help here, not a check: the declared types remain
        graph = model.graph
    types = {t.name: helper.make_tensor_type_proto(t.data_type, t.dims) for t in graph.initializer}
    for info in [*graph.input, *graph.value_info, *graph.output]:
        if info.HasField("type"):
            types[info.name] = info.type
    return types


def _outer_names(node: NodeProto) -> set[str]:
    """Names the node's subgraphs read without defining them (outer-scope values)."""
    used: set[str] = set()
    graphs = [g for a in node.attribute for g in [*([a.g] if a.HasField("g") else []), *a.graphs]]
    while graphs:  # nesting is already bounded by screen()
        graph = graphs.pop()
        defined = {i.name for i in graph.input} | {t.name for t in graph.initializer}
        for inner in graph.node:
            used |= {name for name in inner.input if name not in defined}
            defined.update(inner.output)
            graphs += [g for a in inner.attribute
                       for g in [*([a.g] if a.HasField("g") else []), *a.graphs]]  # fmt: skip
        used |= {o.name for o in graph.output if o.name not in defined}
    return used


def _version(node: NodeProto, domain: str, opset: int | None) -> int | None:
    if opset is None:
        return None
    try:
        return int(onnx.defs.get_schema(node.op_type, opset, domain).since_version)
    except onnx.defs.SchemaError:
        return None


def _spec(info: ValueInfoProto, role: str) -> TensorSpec:
    kind = info.type.WhichOneof("value")
    if kind == "optional_type" and info.type.optional_type.elem_type.HasField("tensor_type"):
        inner = onnx.ValueInfoProto(name=info.name, type=info.type.optional_type.elem_type)
        return _spec(inner, role)  # a present optional tensor travels as the tensor
    if kind not in ("tensor_type", None):
        raise InvalidInput(f"graph {role} {info.name[:100]!r} is a {kind.removesuffix('_type')}; "
                           "only tensors travel over the API")  # fmt: skip
    tensor = info.type.tensor_type
    shape = None
    if tensor.HasField("shape"):
        shape = tuple(d.dim_value if d.HasField("dim_value") else None for d in tensor.shape.dim)
    return TensorSpec(info.name, tensor.elem_type, shape)


def _node(node: NodeProto, i: int, report: NodeReport | None = None) -> str:
    name = repr(node.name[:100]) if node.name else f"#{i}"
    domain = f"domain {node.domain[:100]!r}, "
    version = report.version if report else None
    return f"node {name} ({node.op_type[:100]}, {domain}version {version or 'none'})"


def _short(text: str) -> str:
    return text if len(text) <= 1000 else text[:1000] + "..."
