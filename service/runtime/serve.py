"""One model run from decoded request options to the response object; knows nothing of HTTP."""

from typing import Any

import pybase64

from api_schemas.models import ModelRunOptions, PostedRunOptions
from service.codecs.dtypes import element_type_of
from service.codecs.limits import Limits
from service.codecs.wire import decode_tensor, encode_tensor
from service.engines.choice import POSTED
from service.errors import InvalidInput, located
from service.kernels.context import KernelContext, RunOffLoop
from service.runtime.graph import LoadedModel, TensorSpec
from service.runtime.model_loader import RepositoryEntry
from service.runtime.plan import LOAD_MEMORY_FACTOR, load_model
from service.settings import Settings


def run_model(model: LoadedModel, options: ModelRunOptions, limits: Limits,
              ctx: KernelContext | None = None) -> dict[str, Any]:  # fmt: skip
    """Decode the inputs, run, encode outputs (and the trace) in the requested form. Under a
    request's `ctx` (off the event loop), the run is held to its limits, claims and deadline,
    and large tensors are left to be encoded as they are sent (wire.encode_answer)."""
    inputs = {}
    for name, wire in options.inputs.items():
        with located("inputs", name):
            inputs[name] = decode_tensor(wire, limits)
    form = options.output_format
    if ctx is not None:
        ctx = ctx.for_format(form)
    result = model.run(inputs, options.outputs, trace=options.trace, ctx=ctx)
    stream = ctx is not None and ctx.inline_bytes is None  # inline, the outputs are small
    outputs = {name: encode_tensor(array, form, stream) for name, array in result.outputs.items()}
    body: dict[str, Any] = {
        "outputs": outputs,
        "nodes": [vars(report) for report in result.nodes],
    }
    if result.trace is not None:
        body["trace"] = [
            {"name": e.name, "node": e.node, "op_type": e.op_type, "version": e.version,
             "ran_on": e.ran_on, "dtype": element_type_of(e.value).name,
             "shape": list(e.value.shape), "microseconds": round(e.microseconds, 1),
             "value": encode_tensor(e.value, form, stream)}
            for e in result.trace if hasattr(e.value, "shape")
        ]  # fmt: skip
    return body


def run_posted(model: str | bytes, options: PostedRunOptions, settings: Settings,
               limits: Limits, ctx: KernelContext | None = None) -> dict[str, Any]:  # fmt: skip
    """Load a posted model (`str`: base64 from a JSON body; `bytes`: a file part) and run it
    on the engine it asks for (a trace: on the exact engine); under `ctx`, what loading
    holds is claimed first. Inline (a small request on the event loop), only a model kept
    on onnxruntime runs (in the workers: the loop awaits its run); any other is loaded, or
    its graph run, on a thread (RunOffLoop)."""
    if isinstance(model, str):
        try:
            model = pybase64.b64decode(model, validate=True)
        except ValueError as exc:
            raise InvalidInput(f"model is not valid base64: {exc}", loc=("model",)) from None
    if ctx is not None and ctx.inline_bytes is not None:
        kept = None
        if options.engine == "onnxruntime" and not options.trace:
            kept = POSTED.kept(model)
        if kept is None:
            raise RunOffLoop
        return run_model(kept, options, limits, ctx)
    if ctx is not None and ctx.claims is not None:
        ctx.claims.claim(LOAD_MEMORY_FACTOR * len(model))
    if options.engine == "onnxruntime" and not options.trace:
        return run_model(POSTED.model(model, settings), options, limits, ctx)
    return run_model(load_model(model, settings), options, limits, ctx)


def run_entry(entry: RepositoryEntry, options: ModelRunOptions, limits: Limits,
              ctx: KernelContext | None = None) -> dict[str, Any]:  # fmt: skip
    """Run a repository model's graph as it is (its configuration is V2's); a model that is
    not ready answers why (422)."""
    model = entry.model  # held for the run: an unload may free the entry meanwhile
    if not entry.ready or model is None:
        raise InvalidInput(f"model {entry.name!r} version {entry.version} is not ready: "
                           f"{entry.error or entry.state.lower()}")  # fmt: skip
    if not isinstance(model, LoadedModel):  # an ensemble: a pipeline of models, not a graph
        raise InvalidInput(f"model {entry.name!r} is an ensemble, which runs over V2 only "
                           f"(POST /v2/models/{entry.name}/infer)")  # fmt: skip
    return run_model(model, options, limits, ctx)


def describe_entry(entry: RepositoryEntry) -> dict[str, Any]:
    """A version's state for `GET /v1/models`."""
    model = entry.model
    defaults = set(model.initializers) if model else set()
    return {
        "version": entry.version, "ready": entry.ready, "reason": entry.error,
        "engine": model.engine if model else None,
        "engine_reason": (model.engine_reason or None) if model else None,
        "inputs": [_info(s, s.name in defaults) for s in model.inputs] if model else [],
        "outputs": [_info(s, False) for s in model.outputs] if model else [],
    }  # fmt: skip


def _info(spec: TensorSpec, optional: bool) -> dict[str, Any]:
    from service.codecs.dtypes import by_enum

    dtype = by_enum(spec.elem_type).name if spec.elem_type else None
    shape = list(spec.shape) if spec.shape is not None else None
    return {"name": spec.name, "dtype": dtype, "shape": shape, "optional": optional}
