"""Which engine runs a model, chosen when it loads.

- `onnxruntime` for repository models (their configuration says `platform:
  "onnxruntime_onnx"` or `backend: "onnxruntime"`, which auto-complete sets), as Triton runs
  them;
- `exact` (the service's kernels, and onnx.reference for other nodes with
  OPSERVE_REFERENCE_FALLBACK) where the configuration asks for it, with the model parameter
  `engine: "exact"`, and for a model onnxruntime cannot load or run (an input or output type
  its binding lacks, a node type or opset it has no kernel for): then the reason is written in
  the completed configuration (parameter `engine_reason`) and in the repository index;
- models posted to /v1/models/run run on the exact engine unless the body asks for
  `"engine": "onnxruntime"` (their sessions kept by digest, `PostedSessions`).
"""

import hashlib
import threading
from collections import OrderedDict
from dataclasses import replace
from typing import Any

from onnx import ModelProto

from service.engines.onnxruntime.crashes import crashes
from service.engines.onnxruntime.differs import differs
from service.engines.onnxruntime.inline import gate_for
from service.engines.onnxruntime.memory import memory_plan
from service.engines.onnxruntime.model import OrtModel
from service.engines.onnxruntime.probe import PROBES
from service.engines.onnxruntime.session import (
    Unsupported,
    check_types,
    open_session,
    run_threads,
)
from service.errors import InvalidInput, ServiceError
from service.runtime.graph import LoadedModel
from service.runtime.plan import checked, graph_specs, load_model, node_version
from service.runtime.steps import NodeReport
from service.settings import Settings

ENGINE = "engine"  # the model parameter that chooses, and then says, the engine
REASON = "engine_reason"  # the parameter that says why the exact engine runs it
ENGINES = ("onnxruntime", "exact")


def configured(config: Any) -> str:
    """The engine a repository model's configuration asks for (onnxruntime by default); 422
    for an engine the service does not have."""
    if config is None or ENGINE not in config.parameters:
        return "onnxruntime"
    wanted = config.parameters[ENGINE].string_value
    if wanted not in ENGINES:
        raise InvalidInput(f"parameter {ENGINE!r} is {wanted[:100]!r}; the engines are "
                           "'onnxruntime' and 'exact'")  # fmt: skip
    return wanted


def load_repository_model(data: bytes, config: Any, settings: Settings) -> LoadedModel:
    """A repository model version on the engine its configuration names, or on the exact
    engine with the reason onnxruntime cannot run it (refused, 4xx, when neither can)."""
    if configured(config) == "exact":
        return load_model(data, settings)
    try:
        return load_ort(data, settings)
    except Unsupported as exc:
        why = f"onnxruntime cannot run it: {exc}"
    try:
        exact = load_model(data, settings)
    except ServiceError as exc:
        exc.detail = f"{exc.detail}; and {why}"
        raise
    return replace(exact, engine_reason=why)


def record(config: Any, model: LoadedModel) -> None:
    """Write the engine that runs the model (and why, when it is not the one named) into its
    completed configuration's parameters."""
    config.parameters[ENGINE].string_value = model.engine
    if model.engine_reason:
        config.parameters[REASON].string_value = model.engine_reason
    elif REASON in config.parameters:
        del config.parameters[REASON]  # a reason of the configuration's own says nothing here


def load_ort(data: bytes, settings: Settings) -> OrtModel:
    """The model on onnxruntime: checked as the exact engine checks it (4xx), then opened
    (Unsupported: onnxruntime's reason)."""
    model = checked(data, settings)
    graph_specs(model)  # 422 for a graph input or output that is not a tensor
    check_types(model)
    why = differs(model) or crashes(model)
    if why is not None:
        raise Unsupported(why)
    threads = run_threads(settings.kernel_threads)
    PROBES.check(data, threads.counts, settings.onnxruntime_load_seconds, settings.max_graph_bytes)
    session = open_session(data, threads)
    return ort_model(model, session, settings)


def ort_model(model: ModelProto, session: Any, settings: Settings) -> OrtModel:
    """The checked `model` over its opened `session`."""
    inputs, outputs = graph_specs(model)
    return OrtModel(
        inputs=inputs, outputs=outputs, steps=(),
        # the session holds the initializers: only their names are kept (optional inputs)
        initializers=dict.fromkeys((t.name for t in model.graph.initializer), _NOT_HELD),
        max_graph_bytes=settings.max_graph_bytes,
        session=session, memory=memory_plan(model), reports=_reports(model),
        gate=gate_for(model),
    )  # fmt: skip


class _NotHeld:
    """An initializer's place in OrtModel.initializers: onnxruntime holds its value."""


_NOT_HELD: Any = _NotHeld()


def _reports(model: ModelProto) -> tuple[NodeReport, ...]:
    opsets = {("" if o.domain == "ai.onnx" else o.domain): o.version for o in model.opset_import}
    return tuple(NodeReport(node.name, node.op_type, node.domain, node_version(node, opsets),
                            "onnxruntime") for node in model.graph.node)  # fmt: skip


class PostedSessions:
    """onnxruntime models of posted models, by digest; the least recently used dropped."""

    def __init__(self) -> None:
        self.models: OrderedDict[bytes, OrtModel] = OrderedDict()
        self.lock = threading.Lock()  # posted runs load on several kernel threads

    def model(self, data: bytes, settings: Settings) -> OrtModel:
        """The posted model on onnxruntime (422 with onnxruntime's reason if it cannot)."""
        key = hashlib.blake2b(data, digest_size=16).digest()
        with self.lock:
            found = self.models.get(key)
            if found is not None:
                self.models.move_to_end(key)
                return found
        try:
            found = load_ort(data, settings)
        except Unsupported as exc:
            raise InvalidInput(f"onnxruntime cannot run the model: {exc}; the exact engine "
                               "may (leave out \"engine\")", loc=("engine",)) from None  # fmt: skip
        with self.lock:
            self.models[key] = found
            while len(self.models) > settings.onnxruntime_sessions:
                self.models.popitem(last=False)
        return found


POSTED = PostedSessions()
"""The process's posted-model sessions."""
