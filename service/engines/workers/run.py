"""One run in a fallback worker process (workers/worker.py): the model loaded (or found in
the cache), the inputs taken from shared memory, shape inference's sizes checked, the graph
run on the kernels and onnx.reference, the result packed back. Every failure is an answer."""

import mmap
from collections import OrderedDict
from typing import Any

import numpy as np
import onnx
import onnx.shape_inference

from service.codecs.dtypes import by_enum
from service.engines.onnxruntime.session import Granted, Threads
from service.engines.workers.limits import pool_threads_bytes, widen_address_space
from service.engines.workers.transport import pack, unpack
from service.errors import InvalidInput, PayloadTooLarge, ServiceError
from service.kernels.context import KernelContext
from service.runtime.graph import LoadedModel, RunResult
from service.runtime.plan import checked, load_model
from service.settings import Settings

MiB = 1024 * 1024
NODE_BYTES = 256  # of the shared file where the worker names the node it runs
CACHED_MODELS = 8  # loaded models kept, by digest (the server, workers/pool.py, mirrors the order)
LOADING = "(loading the model)"  # what the worker runs while it opens a model
RUNNING_ORT = "the onnxruntime session"
ORT = "onnxruntime"  # the engine of a client's model (onnxruntime/isolated.py)
OVER_LIMIT = ("the run passed its isolated worker's memory limit (OPSERVE_ISOLATED_WORKER_BYTES; "
              "by default from OPSERVE_MAX_GRAPH_BYTES and OPSERVE_MAX_REQUEST_BYTES)")  # fmt: skip
INFERRED_MODEL_BYTES = 64 * MiB  # larger models are not shape-inferred before a run
SESSION_FACTOR = 2  # a session's memory, in models, as the load probe allows it (probe.py)


class Progress:
    """The worker's run control: writes the node about to run where the server reads it (a
    small file in shared memory, mapped once)."""

    fallback = None  # runs here, in this process

    def __init__(self, running: str) -> None:
        with open(running, "r+b") as file:
            self.mapped = mmap.mmap(file.fileno(), NODE_BYTES)
        self.last = ""

    def check(self, node: str) -> None:
        self.last = node
        text = node.encode("utf-8", "replace")[: NODE_BYTES - 1]
        self.mapped[: len(text) + 1] = text + b"\0"


class Runner:
    """The models this worker loaded, and the runs it serves."""

    def __init__(self, limits: dict[str, Any], running: str, directory: str | None) -> None:
        self.settings = Settings(**limits, reference_fallback=True)
        self.directory = directory  # where large results are written (tensor_transport)
        self.progress = Progress(running)
        self.granted = Granted()
        self.widened: dict[bytes, int] = {}  # the limit's widening for each model held
        self.models: OrderedDict[bytes, tuple[LoadedModel, onnx.ModelProto | None]] = (
            OrderedDict())  # fmt: skip
        self.inferred: OrderedDict[tuple[Any, ...], None] = OrderedDict()

    def serve(self, message: tuple[Any, ...]) -> tuple[str, Any]:
        """("ok", packed result), ("error", (class name, status, detail, loc, operator)), or
        ("missing", None) when the model was not sent and is not cached."""
        digest, engine, source, packed_inputs, outputs, trace, threads = message
        self.granted.given = threads  # the intra-op threads the server took for this run
        if source is None and digest not in self.models:
            return ("missing", None)  # the server sends the model again
        try:
            model, proto = self._model(digest, engine, source)
            inputs = {name: unpack(value) for name, value in packed_inputs.items()}
            if proto is not None:
                self._check_sizes(digest, proto, inputs)
            ctx = KernelContext(model.max_graph_bytes, output_format=None,
                                control=self.progress)  # fmt: skip
            if engine == ORT:
                self.progress.check(RUNNING_ORT)
            result = model.run(inputs, outputs, trace=trace, ctx=ctx)
            return ("ok", _packed(result, self.directory))
        except InvalidInput as exc:
            if engine == ORT and _out_of_memory(exc.detail):
                return ("error", ("PayloadTooLarge", 413, OVER_LIMIT, (), self._running()))
            return ("error", (type(exc).__name__, exc.status_code, exc.detail, exc.loc,
                              exc.operator))  # fmt: skip
        except ServiceError as exc:
            return ("error", (type(exc).__name__, exc.status_code, exc.detail, exc.loc,
                              exc.operator))  # fmt: skip
        except MemoryError:
            return ("error", ("PayloadTooLarge", 413, OVER_LIMIT, (), self._running()))
        except Exception as exc:  # onnx.reference's errors on bad input are the client's
            text = f"{type(exc).__name__}: {exc}"[:500]
            return ("error", ("InvalidInput", 422, f"the run failed: {text}", (),
                              self._running()))  # fmt: skip

    def _running(self) -> str | None:
        return self.progress.last or None

    def _model(self, digest: bytes, engine: str, source: bytes | None) -> tuple[LoadedModel, Any]:
        found = self.models.get(digest)
        if found is not None:
            self.models.move_to_end(digest)
            return found
        assert source is not None
        self.progress.check(LOADING)
        proto = None
        model = (
            self._opened_in_room(digest, source)
            if engine == ORT
            else load_model(source, self.settings)
        )
        if engine != ORT and len(source) <= INFERRED_MODEL_BYTES:
            proto = onnx.ModelProto()
            proto.ParseFromString(source)
        self.models[digest] = (model, proto)
        while len(self.models) > CACHED_MODELS:
            dropped, _model = self.models.popitem(last=False)
            del _model  # its sessions closed and their threads ended (glibc may keep up to
            # 40 MiB of their stacks mapped for the next threads: bounded, not growing)
            widen_address_space(-self.widened.pop(dropped, 0))
        return model, proto

    def _opened_in_room(self, digest: bytes, source: bytes) -> LoadedModel:
        """A client's model opened on onnxruntime, the address-space limit widened for as long
        as it is held by what the server's choice of sessions adds, which is not the run's
        room: its sessions' pool threads' stacks (limits.pool_threads_bytes), and for each
        session past the first, twice the model, as the load probe allows a session (a
        model the worker held in one session before must still leave its run the room)."""
        from service.engines.onnxruntime.session import worker_threads

        threads = worker_threads(self.settings.fallback_workers)
        more_sessions = len(threads.counts) - 1
        widened = widen_address_space(pool_threads_bytes(threads.counts)
                                      + more_sessions * SESSION_FACTOR * len(source))  # fmt: skip
        try:
            model = _opened(source, self.settings, threads, self.granted)
        except BaseException:
            widen_address_space(-widened)
            raise
        self.widened[digest] = widened
        return model

    def _check_sizes(self, digest: bytes, proto: Any, inputs: dict[str, np.ndarray]) -> None:
        """Shape inference with the inputs' shapes: a value whose size it knows and which is
        over OPSERVE_MAX_OUTPUT_BYTES is refused before anything runs (cached per shapes)."""
        key = (digest, *((n, a.dtype.str, a.shape) for n, a in sorted(inputs.items())))
        if key in self.inferred:
            return
        fed = onnx.ModelProto()
        fed.CopyFrom(proto)
        for info in fed.graph.input:
            array = inputs.get(info.name)
            if array is not None and info.type.HasField("tensor_type"):
                shape = info.type.tensor_type.shape
                shape.Clear()
                for dim in array.shape:
                    shape.dim.add().dim_value = dim
        try:
            graph = onnx.shape_inference.infer_shapes(fed, data_prop=True).graph
        except Exception:  # inference is a help here, not a check
            return
        producer = {name: node for node in graph.node for name in node.output}
        for info in [*graph.value_info, *graph.output]:
            _check_value(info, producer, self.settings.max_output_bytes)
        self.inferred[key] = None
        while len(self.inferred) > 256:
            self.inferred.popitem(last=False)


def _opened(source: bytes, settings: Settings, threads: Threads,
            granted: Granted) -> LoadedModel:  # fmt: skip
    """A client's model opened on onnxruntime here: checked again (this process trusts no
    message more than the server trusts its client), opened without the crash screen, which
    the worker does not need (a crash ends this process and fails one run); a session for
    each thread count a run may be given, each run on the one `granted` names."""
    from service.engines.workers.limits import import_onnxruntime

    import_onnxruntime()
    from service.engines.onnxruntime.opened import open_checked
    from service.engines.onnxruntime.session import Unsupported

    try:
        return open_checked(checked(source, settings), source, threads, settings, granted)
    except Unsupported as exc:
        raise InvalidInput(f"onnxruntime cannot run the model: {exc}") from None


def _out_of_memory(detail: str) -> bool:
    """Whether onnxruntime's error was an allocation the address-space limit refused."""
    return "bad_alloc" in detail or "Failed to allocate memory" in detail


def _check_value(info: Any, producer: dict[str, Any], limit: int) -> None:
    tensor = info.type.tensor_type
    if not info.type.HasField("tensor_type") or not tensor.HasField("shape"):
        return
    dims = tensor.shape.dim
    if not all(d.HasField("dim_value") for d in dims) or not tensor.elem_type:
        return
    try:
        itemsize = by_enum(tensor.elem_type).np_dtype.itemsize
    except ServiceError:
        return
    nbytes = int(np.prod([d.dim_value for d in dims], dtype=object)) * itemsize
    if nbytes > limit:
        node = producer.get(info.name)
        named = f"node {node.name[:100]!r} ({node.op_type})" if node is not None else info.name
        shape = [d.dim_value for d in dims]
        raise PayloadTooLarge(f"{named} would make {info.name[:100]!r} of shape {shape} "
                              f"({nbytes} bytes), over the limit of {limit} "
                              "(OPSERVE_MAX_OUTPUT_BYTES); refused before it ran")  # fmt: skip


def _packed(result: RunResult, directory: str | None) -> dict[str, Any]:
    made: list[str] = []
    trace = None
    if result.trace is not None:
        trace = [(e.name, e.node, e.op_type, e.version, e.ran_on, pack(e.value, made, directory),
                  e.microseconds) for e in result.trace]  # fmt: skip
    return {"outputs": {n: pack(a, made, directory) for n, a in result.outputs.items()},
            "nodes": result.nodes, "trace": trace}  # fmt: skip


__all__ = ["InvalidInput", "Runner"]
