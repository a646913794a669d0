"""An onnxruntime model made from bytes already checked: the session opened with the service's
options and the model's plans (memory estimate, inline gate, node reports) beside it. The
server opens the operator's models so (after the probe: choice.py); an isolated worker opens a
client's model so (workers/run.py), where a crash while opening costs only that worker."""

from typing import Any

from onnx import ModelProto

from service.engines.onnxruntime.inline import gate_for
from service.engines.onnxruntime.memory import memory_plan
from service.engines.onnxruntime.model import OrtModel
from service.engines.onnxruntime.session import CORES, CoreShare, Granted, Threads, open_session
from service.runtime.plan import graph_specs, node_version
from service.runtime.steps import NodeReport
from service.settings import Settings


def ort_model(model: ModelProto, session: Any, settings: Settings) -> OrtModel:
    """The checked `model` over its opened `session`."""
    inputs, outputs = graph_specs(model)
    return OrtModel(
        inputs=inputs, outputs=outputs, steps=(),
        initializers=initializer_names(model), max_graph_bytes=settings.max_graph_bytes,
        session=session, memory=memory_plan(model), reports=node_reports(model),
        gate=gate_for(model),
    )  # fmt: skip


def open_checked(model: ModelProto, data: bytes, threads: Threads, settings: Settings,
                 share: CoreShare | Granted = CORES, spinning: bool = False) -> OrtModel:  # fmt: skip
    """`data` (whose parsed and checked form is `model`) opened in this process, its runs
    given their threads by `share`; `spinning`: its lone runs' pool spins (session.py)."""
    return ort_model(model, open_session(data, threads, share, spinning), settings)


class _NotHeld:
    """An initializer's place in a model's initializers: onnxruntime holds its value."""


NOT_HELD: Any = _NotHeld()


def initializer_names(model: ModelProto) -> dict[str, Any]:
    """The initializers by name, their values not held (they make graph inputs optional)."""
    return dict.fromkeys((tensor.name for tensor in model.graph.initializer), NOT_HELD)


def node_reports(model: ModelProto) -> tuple[NodeReport, ...]:
    """The graph's nodes as a run reports them, each ran_on "onnxruntime"."""
    opsets = {("" if o.domain == "ai.onnx" else o.domain): o.version for o in model.opset_import}
    return tuple(NodeReport(node.name, node.op_type, node.domain, node_version(node, opsets),
                            "onnxruntime") for node in model.graph.node)  # fmt: skip
