"""The data plane: the one object every front door calls. It owns model lookup, readiness,
metadata and inference (decoding the inputs once, running, answering through the door's
encoder), whatever the wire format; the doors only convert their bytes or messages to the
neutral call (calls.py) and the result back, and map domain errors to their statuses."""

from collections.abc import Callable
from time import perf_counter_ns
from typing import Any, Generic, TypeVar

import numpy as np

from service import __version__
from service.codecs.dtypes import element_type_of
from service.codecs.limits import Limits
from service.codecs.v2_binary import decode_binary
from service.codecs.v2_json import decode_v2_json
from service.codecs.v2_types import datatype_of, from_datatype
from service.core.calls import InferCall, InferInput, InferResult, OutputTensor
from service.core.classification import class_count, classify
from service.core.execution import Execution
from service.core.memory_budget import Reservation
from service.core.model import V2Model
from service.core.models import UNKNOWN, find_model, model_versions, ready_models
from service.core.statistics import Statistics, Timings
from service.errors import (
    InvalidInput,
    NotFound,
    ServiceError,
    Unavailable,
    Unsupported,
    located,
)
from service.kernels.context import KernelContext
from service.settings import Settings

T = TypeVar("T")
EXTENSIONS = ("classification", "model_repository", "model_configuration", "binary_tensor_data",
              "parameters", "statistics")  # fmt: skip
"""Triton's protocol extensions served, named as Triton names them (docs/v2.md)."""
Parse = Callable[[KernelContext], InferCall]
"""The door's decoder: its body or message to the neutral call (claiming what it holds)."""
Encode = Callable[[InferCall, InferResult, KernelContext], T]
"""The door's encoder: the result to its answer (claiming what the answer holds)."""


class DataPlane:
    """Models, readiness, metadata, statistics and inference for every door. `repository()`
    gives the model repository (or None)."""

    def __init__(self, settings: Settings, repository: Callable[[], Any], execution: Execution,
                 limits: Limits) -> None:  # fmt: skip
        self.settings = settings
        self.repository = repository
        self.execution = execution
        self.limits = limits
        self.stats = Statistics()
        self.serving = False  # start-up done and no shutdown begun (the lifespan sets it)

    # --- the server ---

    def server_metadata(self) -> dict[str, Any]:
        """Name, version and the protocol extensions served (api_schemas.v2.ServerMetadata)."""
        return {"name": self.settings.server_name, "version": __version__,
                "extensions": list(EXTENSIONS)}  # fmt: skip

    def server_ready(self) -> bool:
        """Ready to serve: start-up done, no shutdown begun, and with strict readiness and a
        model repository, no repository model failed and one at least ready."""
        if not self.serving:
            return False
        repository = self.repository()
        if not self.settings.strict_readiness or repository is None or repository.root is None:
            return True
        entries = [e for name in repository.names() for e in repository.versions(name).values()]
        return bool(entries) and all(e.model is not None for e in entries)

    # --- models ---

    def model(self, name: str, version: str | None) -> V2Model:
        """The model `name` at `version` (its newest ready one when None): 404 when there is
        none."""
        return find_model(name, version, self.repository())

    def ready_model(self, name: str, version: str | None) -> V2Model:
        """The model, refused with Triton's words when it is not ready."""
        model = self.model(name, version)
        if not model.ready:
            reason = f" ({model.reason})" if model.reason else ""
            if version is None:
                raise NotFound(f"{UNKNOWN}'{name[:100]}' has no available versions{reason}")
            raise Unavailable(f"{UNKNOWN}'{name[:100]}' version {version} is not at ready "
                              f"state{reason}")  # fmt: skip
        return model

    def model_metadata(self, name: str, version: str | None) -> dict[str, Any]:
        """What the model takes and answers (api_schemas.v2.ModelMetadata)."""
        return self.ready_model(name, version).metadata()

    def model_ready(self, name: str, version: str | None) -> bool:
        """Whether the model takes inference requests (404 when there is no such model)."""
        return self.model(name, version).ready

    def model_config(self, name: str, version: str | None) -> dict[str, Any]:
        """The model's configuration as Triton answers it (GET .../config)."""
        return self.ready_model(name, version).config()

    def statistics(self, name: str | None, version: str | None) -> list[dict[str, Any]]:
        """Triton's `model_stats`: of every ready model version, of every ready version of
        `name`, or of one version."""
        if name is None:
            models = ready_models(self.repository())
        else:
            try:
                model = self.model(name, version)
            except NotFound:
                raise InvalidInput(f"requested model '{name[:100]}' is not available") from None
            models = [model] if version is not None else model_versions(model, self.repository())
            models = [m for m in models if m.ready]
            if not models:
                what = f"version is not available for model '{name[:100]}'" if version else (
                    f"'{name[:100]}' is not available")  # fmt: skip
                raise InvalidInput(f"requested model {what}")
        return [self.stats.report(m.name, str(m.version)) for m in models]

    # --- the model repository ---

    def repository_index(self, ready_only: bool) -> list[dict[str, Any]]:
        """Every repository model version with its state (Triton's repository index)."""
        repository = self.repository()
        index = []
        for name in repository.names() if repository is not None else []:
            for number, entry in repository.versions(name).items():
                state = "READY" if entry.model is not None else "UNAVAILABLE"
                if ready_only and state != "READY":
                    continue
                row = {"name": name, "version": str(number), "state": state}
                if entry.error:
                    row["reason"] = entry.error
                index.append(row)
        return index

    async def load(self, name: str, parameters: dict[str, Any], repository: str | None) -> None:
        """Load (or reload) a repository model: explicit model control only."""
        self._control(repository)

    async def unload(self, name: str, parameters: dict[str, Any], repository: str | None) -> None:
        """Unload a repository model: explicit model control only."""
        self._control(repository)

    def _control(self, repository: str | None) -> None:
        if repository:
            raise Unsupported("'repository_name' specification is not supported")
        raise Unavailable("explicit model load / unload is not allowed if polling is enabled")

    # --- inference ---

    async def infer(self, model: V2Model, parse: Parse, encode: Encode[T], held: Reservation,
                    body_bytes: int, small: bool) -> T:  # fmt: skip
        """One inference on a ready `model` (ready_model): run inline when `small` (and the
        model's work allows it), else on a kernel thread under the memory budget
        (execution.py); nothing is decoded before it runs."""
        work = InferWork(model, parse, encode, self.limits, body_bytes)
        stats = self.stats.of(model.name, str(model.version))
        return await self.execution.run(work, held, small and model.inline, stats)


class InferWork(Generic[T]):
    """One inference as execution.py's Work: parse, decode every input once, run, encode.
    Inputs decoded inline are kept when the work moves to a thread (their memory is then part
    of `holding`), so they are never decoded twice."""

    __slots__ = ("body_bytes", "call", "encode", "inputs", "limits", "model", "parse", "timings")

    def __init__(self, model: V2Model, parse: Parse, encode: Encode[T], limits: Limits,
                 body_bytes: int) -> None:  # fmt: skip
        self.model = model
        self.parse = parse
        self.encode = encode
        self.limits = limits
        self.body_bytes = body_bytes
        self.call: InferCall | None = None
        self.inputs: dict[str, np.ndarray] | None = None
        self.timings = Timings()

    @property
    def holding(self) -> int:
        decoded = sum(a.nbytes for a in self.inputs.values()) if self.inputs is not None else 0
        return self.body_bytes + decoded

    def __call__(self, ctx: KernelContext) -> T:
        timings = self.timings
        timings.started = start = perf_counter_ns()
        try:
            if self.call is not None and self.inputs is not None:  # decoded inline, now on a thread
                call, inputs = self.call, self.inputs
            else:
                call = self.parse(ctx)
                inputs = decode_inputs(call.inputs, self.limits)
                if ctx.claims is None:  # inline: kept, should the work move to a thread
                    self.call, self.inputs = call, inputs
            timings.compute_input = (ran := perf_counter_ns()) - start
            result = self._run(call, inputs, ctx.for_format(call.answer_form))
            timings.compute_infer = (encoded := perf_counter_ns()) - ran
            answer = self.encode(call, result, ctx)
            timings.compute_output = perf_counter_ns() - encoded
            return answer
        except ServiceError as exc:  # named as on v1: `Tile-13: inputs.repeats: ...`
            exc.operator = exc.operator or self.model.label
            raise

    def _run(self, call: InferCall, inputs: dict[str, np.ndarray],
             ctx: KernelContext) -> InferResult:  # fmt: skip
        model = self.model
        wanted = [o.name for o in call.outputs] if call.outputs else None
        arrays = model.infer(inputs, call.parameters, wanted, ctx)
        asked = {o.name: o.parameters for o in call.outputs} if call.outputs else {}
        outputs = []
        for name, array in arrays.items():
            datatype = datatype_of(element_type_of(array))
            k = class_count(asked[name], name) if name in asked else 0
            if k:
                labels = model.labels(name)
                array = classify(array, k, model.max_batch_size > 0, labels, datatype)
                datatype = "BYTES"
            outputs.append(OutputTensor(name, datatype, list(array.shape), array))
        return InferResult(model.name, str(model.version), call.id, outputs)


def decode_inputs(inputs: list[InferInput], limits: Limits) -> dict[str, np.ndarray]:
    """Every input's array, by name; a name given twice is refused."""
    decoded: dict[str, np.ndarray] = {}
    for item in inputs:
        with located("inputs", item.name):
            if item.name in decoded:
                raise InvalidInput(f"input {item.name!r} is given twice")
            decoded[item.name] = decode_input(item, limits)
    return decoded


def decode_input(item: InferInput, limits: Limits) -> np.ndarray:
    """The array of one input: from its raw bytes, else from its JSON data."""
    if item.raw is not None:
        raw = item.raw if isinstance(item.raw, memoryview) else memoryview(item.raw)
        return decode_binary(from_datatype(item.datatype), item.shape, raw, limits)
    return decode_v2_json(item.datatype, item.shape, item.data, limits)
