"""The data plane: the one object every front door calls. It owns model lookup, readiness,
metadata and inference (decoding the inputs once, running, answering through the door's
encoder), whatever the wire format; the doors only convert their bytes or messages to the
neutral call (calls.py) and the result back, and map domain errors to their statuses."""

from collections.abc import Callable
from typing import Any, Generic, TypeVar

import numpy as np

from service.codecs.dtypes import element_type_of
from service.codecs.limits import Limits
from service.codecs.v2_binary import decode_binary
from service.codecs.v2_json import decode_v2_json
from service.codecs.v2_types import datatype_of, from_datatype
from service.core.calls import InferCall, InferInput, InferResult, OutputTensor
from service.core.execution import Execution
from service.core.memory_budget import Reservation
from service.core.model import V2Model
from service.core.models import find_model
from service.errors import InvalidInput, ModelNotReady, ServiceError, located
from service.kernels.context import KernelContext

T = TypeVar("T")
Parse = Callable[[KernelContext], InferCall]
"""The door's decoder: its body or message to the neutral call (claiming what it holds)."""
Encode = Callable[[InferCall, InferResult, KernelContext], T]
"""The door's encoder: the result to its answer (claiming what the answer holds)."""


class DataPlane:
    """Models, readiness, metadata and inference for every door. `repository()` gives the
    model repository (or None)."""

    def __init__(self, repository: Callable[[], Any], execution: Execution,
                 limits: Limits) -> None:  # fmt: skip
        self.repository = repository
        self.execution = execution
        self.limits = limits

    def model(self, name: str, version: str | None) -> V2Model:
        """The model `name` at `version` (its newest when None): 404 when there is none."""
        return find_model(name, version, self.repository())

    def model_metadata(self, name: str, version: str | None) -> dict[str, Any]:
        """What the model takes and answers (api_schemas.v2.ModelMetadata)."""
        return self.model(name, version).metadata()

    def model_ready(self, name: str, version: str | None) -> bool:
        """Whether the model takes inference requests."""
        return self.model(name, version).ready

    async def infer(self, model: V2Model, parse: Parse, encode: Encode[T], held: Reservation,
                    body_bytes: int, small: bool) -> T:  # fmt: skip
        """One inference on `model`: refused before anything is decoded when the model is not
        ready; run inline when `small` (and the model's work allows it), else on a kernel
        thread under the memory budget (execution.py)."""
        if not model.ready:
            raise ModelNotReady(f"{model.label} is not ready: {model.reason}")
        work = InferWork(model, parse, encode, self.limits, body_bytes)
        return await self.execution.run(work, held, small and model.inline)


class InferWork(Generic[T]):
    """One inference as execution.py's Work: parse, decode every input once, run, encode.
    Inputs decoded inline are kept when the work moves to a thread (their memory is then part
    of `holding`), so they are never decoded twice."""

    __slots__ = ("body_bytes", "call", "encode", "inputs", "limits", "model", "parse")

    def __init__(self, model: V2Model, parse: Parse, encode: Encode[T], limits: Limits,
                 body_bytes: int) -> None:  # fmt: skip
        self.model = model
        self.parse = parse
        self.encode = encode
        self.limits = limits
        self.body_bytes = body_bytes
        self.call: InferCall | None = None
        self.inputs: dict[str, np.ndarray] | None = None

    @property
    def holding(self) -> int:
        decoded = sum(a.nbytes for a in self.inputs.values()) if self.inputs is not None else 0
        return self.body_bytes + decoded

    def __call__(self, ctx: KernelContext) -> T:
        try:
            if self.call is not None and self.inputs is not None:  # decoded inline, now on a thread
                call, inputs = self.call, self.inputs
            else:
                call = self.parse(ctx)
                inputs = decode_inputs(call.inputs, self.limits)
                if ctx.claims is None:  # inline: kept, should the work move to a thread
                    self.call, self.inputs = call, inputs
            result = self._run(call, inputs, ctx.for_format(call.answer_form))
            return self.encode(call, result, ctx)
        except ServiceError as exc:  # named as on v1: `Tile-13: inputs.repeats: ...`
            exc.operator = exc.operator or self.model.label
            raise

    def _run(self, call: InferCall, inputs: dict[str, np.ndarray],
             ctx: KernelContext) -> InferResult:  # fmt: skip
        model = self.model
        wanted = [o.name for o in call.outputs] if call.outputs else None
        arrays = model.infer(inputs, call.parameters, wanted, ctx)
        outputs = [OutputTensor(name, datatype_of(element_type_of(array)), list(array.shape),
                                array) for name, array in arrays.items()]  # fmt: skip
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
