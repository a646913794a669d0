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
  `"engine": "onnxruntime"` (kept by digest, `PostedSessions`).

Where a model runs follows where its bytes came from: the operator's repository in this
process (fast; screened for known crashes, opened after a probe); bytes a client sent (a
posted model, a `file:` load) in the isolated workers (onnxruntime/isolated.py), unless
OPSERVE_CLIENT_MODELS_IN_PROCESS; an operator's model too when its configuration says
`isolated: "true"`.
"""

__all__ = ["POSTED", "from_a_load_request", "load_ort", "load_repository_model", "ort_model",
           "record"]  # fmt: skip

import threading
from collections import OrderedDict
from dataclasses import replace
from typing import Any

from service.engines.onnxruntime.crashes import crashes
from service.engines.onnxruntime.differs import differs
from service.engines.onnxruntime.isolated import IsolatedOrtModel, load_isolated
from service.engines.onnxruntime.model import OrtModel
from service.engines.onnxruntime.opened import open_checked, ort_model
from service.engines.onnxruntime.probe import PROBES
from service.engines.onnxruntime.session import (
    SPINNING,
    Unsupported,
    check_types,
    run_threads,
    worker_threads,
)
from service.errors import InvalidInput, ServiceError
from service.runtime.digest import model_digest
from service.runtime.graph import LoadedModel
from service.runtime.plan import checked, graph_specs, load_model
from service.settings import Settings

ENGINE = "engine"  # the model parameter that chooses, and then says, the engine
REASON = "engine_reason"  # the parameter that says why the exact engine runs it
ENGINES = ("onnxruntime", "exact")
ISOLATED = "isolated"  # the model parameter that puts a repository model in the workers


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


def load_repository_model(data: bytes, config: Any, settings: Settings,
                          sent: bool = False) -> LoadedModel:  # fmt: skip
    """A repository model version on the engine its configuration names (onnxruntime in the
    isolated workers when its bytes were `sent` by a client, or its configuration asks), or
    on the exact engine with the reason onnxruntime cannot run it (4xx when neither can)."""
    spins = spinning(config)  # checked whatever the engine, as every parameter here is
    if configured(config) == "exact":
        return load_model(data, settings)
    try:
        if isolated(config, sent, settings):
            return load_in_workers(data, settings)
        return load_ort(data, settings, spins)
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


def load_ort(data: bytes, settings: Settings, spinning: bool = False) -> OrtModel:
    """The model on onnxruntime in this process: checked as the exact engine checks it (4xx),
    screened for kernels known to crash or differ, then opened after the probe opened it
    (Unsupported: the reason); `spinning`: its lone runs' pool spins (the parameter
    `SPINNING`)."""
    model = checked(data, settings)
    graph_specs(model)  # 422 for a graph input or output that is not a tensor
    check_types(model)
    why = differs(model) or crashes(model)
    if why is not None:
        raise Unsupported(why)
    threads = run_threads(settings.kernel_threads)
    PROBES.check(data, threads.counts, settings.onnxruntime_load_seconds, settings.max_graph_bytes)
    return open_checked(model, data, threads, settings, spinning=spinning)


def load_in_workers(data: bytes, settings: Settings) -> IsolatedOrtModel:
    """A model for the isolated workers, once a probe process opened it as a worker will (a
    load refused when onnxruntime cannot open it, as Triton's is)."""
    model = load_isolated(data, settings)
    PROBES.check(data, worker_threads(settings.fallback_workers).counts,
                 settings.onnxruntime_load_seconds, settings.max_graph_bytes)  # fmt: skip
    return model


def isolated(config: Any, sent: bool, settings: Settings) -> bool:
    """Whether a repository model runs in the isolated workers: its bytes came from a client
    (a `file:` load), unless OPSERVE_CLIENT_MODELS_IN_PROCESS; or its configuration asks
    (parameter `isolated: "true"`, the operator's choice for a model it does not trust)."""
    return (sent and not settings.client_models_in_process) or asks_isolated(config)


def asks_isolated(config: Any) -> bool:
    """Whether a configuration asks for the isolated workers (parameter `isolated`)."""
    if config is None or ISOLATED not in config.parameters:
        return False
    wanted = config.parameters[ISOLATED].string_value.strip().lower()
    if wanted not in ("true", "false"):
        raise InvalidInput(f"parameter {ISOLATED!r} is {wanted[:100]!r}; it is 'true' or "
                           "'false'")  # fmt: skip
    return wanted == "true"


def spinning(config: Any) -> bool:
    """Whether the operator asked for a model's lone runs on a spinning pool, as onnxruntime's
    defaults run (parameter `session.intra_op.allow_spinning: "1"`, onnxruntime's own key and
    values; "0" by default): faster lone runs for a host whose cores the operator gives to the
    server, for about 40 ms of a core after each run (docs/models.md, "Speed"). A model in
    the isolated workers never spins: a worker's cores are shared among clients."""
    if config is None or SPINNING not in config.parameters:
        return False
    wanted = config.parameters[SPINNING].string_value
    if wanted not in ("0", "1"):
        raise InvalidInput(f"parameter {SPINNING!r} is {wanted[:100]!r}; it is '1' (a lone "
                           "run's pool threads spin waiting for work) or '0'")  # fmt: skip
    return wanted == "1"


def from_a_load_request(config: Any, own: Any | None) -> Any:
    """`config`, which a load request sent (a client's: repository control is open to any
    client, as Triton's is), checked against the model's own configuration (`own`, its
    folder's config.pbtxt: the operator's): it may not take the model out of the isolated
    workers (parameter `isolated`) nor ask for a spinning pool the operator's does not; it
    may ask for the workers, and it may leave out or repeat the operator's choices (a
    configuration read back from the server carries them). 400 otherwise."""
    if asks_isolated(own) and not asks_isolated(config):
        raise InvalidInput(f"parameter {ISOLATED!r}: the model's config.pbtxt puts it in the "
                           "isolated workers, and a load request may not take it out")  # fmt: skip
    if spinning(config) and not spinning(own):
        raise InvalidInput(f"parameter {SPINNING!r}: a spinning pool is the operator's choice, "
                           "made in the model's config.pbtxt, not a load request's: its CPU "
                           "is every client's")  # fmt: skip
    return config


class PostedSessions:
    """Posted models on onnxruntime, the least recently used dropped: checked once (their
    sessions are opened in the isolated workers, which keep them by digest), or opened in this
    process with OPSERVE_CLIENT_MODELS_IN_PROCESS.

    A posted model comes with every call, so finding it must cost less than hashing it:
    hashing (SHA-256) takes 0.57 ms for 786 KB on the development host, comparing bytes about
    0.05 ms. So the kept models are found by their length and first and last bytes, and a
    candidate is taken only when all its bytes are equal (exact: no digest's collision can
    hand a client another's model); a model seen for the first time is hashed once, for the
    workers' key."""

    EDGE = 64  # bytes of each end in the lookup's key

    def __init__(self) -> None:
        # digest -> (the model's bytes, the loaded model)
        self.models: OrderedDict[bytes, tuple[bytes, LoadedModel]] = OrderedDict()
        self.lookup: dict[tuple[int, bytes, bytes], list[bytes]] = {}  # -> digests
        self.lock = threading.Lock()  # posted runs load on several kernel threads

    def _key(self, data: bytes) -> tuple[int, bytes, bytes]:
        return len(data), data[: self.EDGE], data[-self.EDGE :]

    def kept(self, data: bytes) -> LoadedModel | None:
        """The posted model on onnxruntime when it is kept (None: `model` loads it)."""
        key = self._key(data)
        with self.lock:
            for digest in self.lookup.get(key, ()):
                kept, found = self.models[digest]
                if kept == data:
                    self.models.move_to_end(digest)
                    return found
        return None

    def model(self, data: bytes, settings: Settings) -> LoadedModel:
        """The posted model on onnxruntime (422 with the reason if it cannot)."""
        found = self.kept(data)
        if found is not None:
            return found
        key = self._key(data)
        digest = model_digest(data)
        try:
            # no probe for the workers: the worker's own open is as isolated, and its time
            # counts against the request's deadline
            found = (load_ort(data, settings) if settings.client_models_in_process
                     else load_isolated(data, settings))  # fmt: skip
        except Unsupported as exc:
            raise InvalidInput(f"onnxruntime cannot run the model: {exc}; the exact engine "
                               "may (leave out \"engine\")", loc=("engine",)) from None  # fmt: skip
        with self.lock:
            if digest not in self.models:
                self.lookup.setdefault(key, []).append(digest)
            self.models[digest] = (data, found)
            self.models.move_to_end(digest)
            while len(self.models) > settings.onnxruntime_sessions:
                dropped, (old, _model) = self.models.popitem(last=False)
                old_key = self._key(old)
                siblings = self.lookup[old_key]
                siblings.remove(dropped)
                if not siblings:
                    del self.lookup[old_key]
        return found


POSTED = PostedSessions()
"""The process's posted models."""
