"""Triton's inference.GRPCInferenceService over the data plane: each method converts its
message, calls the core and converts the answer back; refusals are the core's domain errors
(the door turns them into statuses). Model control, shared memory, trace and log settings are
in control.py; ModelStreamInfer's bookkeeping in stream.py."""

from time import perf_counter_ns
from typing import Any, TypeAlias

import grpc
from google.protobuf import json_format
from tritonclient.grpc import model_config_pb2, service_pb2_grpc
from tritonclient.grpc import service_pb2 as pb

from service.core.dataplane import DataPlane
from service.core.fallback import fell_back
from service.core.memory_budget import MemoryBudget, Reservation
from service.core.offload import INLINE_BODY_BYTES
from service.core.operator_model import OperatorModel
from service.core.trace_context import TraceContext
from service.errors import NotFound
from service.grpc.control import Control
from service.grpc.converters import GrpcWire
from service.grpc.door import Incoming, takes_reservation
from service.grpc.operator_call import RawOperatorCall
from service.grpc.stream import InferStream

Context: TypeAlias = grpc.aio.ServicerContext
SERVICE = pb.DESCRIPTOR.services_by_name["GRPCInferenceService"]


class Servicer(Control, service_pb2_grpc.GRPCInferenceServiceServicer):
    """Every method of the service; `Door.handlers(SERVICE, servicer)` registers them."""

    def __init__(self, plane: DataPlane, budget: MemoryBudget, send_timeout: float,
                 stream_window: int = 16) -> None:  # fmt: skip
        self.plane = plane
        self.budget = budget
        self.send_timeout = send_timeout
        self.stream_window = stream_window
        self.streams: set[InferStream] = set()

    async def ServerLive(self, request: pb.ServerLiveRequest, context: Context) -> Any:
        return pb.ServerLiveResponse(live=self.plane.server_live() is None)

    async def ServerReady(self, request: pb.ServerReadyRequest, context: Context) -> Any:
        return pb.ServerReadyResponse(ready=self.plane.server_ready())

    async def ModelReady(self, request: pb.ModelReadyRequest, context: Context) -> Any:
        """Ready or not; an unknown model is not ready, with no error (Triton, core#508)."""
        try:
            ready = self.plane.model_ready(request.name, request.version or None)
        except NotFound:
            ready = False
        return pb.ModelReadyResponse(ready=ready)

    async def ServerMetadata(self, request: pb.ServerMetadataRequest, context: Context) -> Any:
        return pb.ServerMetadataResponse(**self.plane.server_metadata())

    async def ModelMetadata(self, request: pb.ModelMetadataRequest, context: Context) -> Any:
        found = self.plane.model_metadata(request.name, request.version or None)
        tensors = {side: [pb.ModelMetadataResponse.TensorMetadata(
            name=t["name"], datatype=t["datatype"], shape=t["shape"]) for t in found[side]]
            for side in ("inputs", "outputs")}  # fmt: skip
        return pb.ModelMetadataResponse(name=found["name"], versions=found["versions"],
                                        platform=found["platform"], **tensors)  # fmt: skip

    async def ModelConfig(self, request: pb.ModelConfigRequest, context: Context) -> Any:
        config = self.plane.model_config(request.name, request.version or None)
        parsed = json_format.ParseDict(config, model_config_pb2.ModelConfig(),
                                       ignore_unknown_fields=True)  # fmt: skip
        return pb.ModelConfigResponse(config=parsed)

    async def ModelStatistics(self, request: pb.ModelStatisticsRequest, context: Context) -> Any:
        stats = await self.plane.statistics(request.name or None, request.version or None)
        return json_format.ParseDict({"model_stats": stats}, pb.ModelStatisticsResponse())

    @takes_reservation
    async def ModelInfer(self, request: pb.ModelInferRequest, context: Context,
                         held: Reservation | None = None, size: int | None = None,
                         trace: TraceContext | None = None) -> bytes:  # fmt: skip
        """One inference. Its answer is returned for grpc to send with the status, in one
        operation (writing it ourselves costs a third more per call); what a large one holds
        of the memory budget (from its message's arrival on: `held`, the door's) stays held
        until the call is over, and its `trace` (the door's) is closed then."""
        if trace is not None:
            context.add_done_callback(lambda _context: trace.close())
            trace.traceparent = self.trace_context(context)
        answer, held = await self.infer(request, held or Reservation(self.budget), size, trace)
        if held.held:
            context.add_done_callback(lambda _context: held.release())
        if trace is not None:
            trace.send()
        return answer

    async def infer(self, request: pb.ModelInferRequest, held: Reservation,
                    size: int | None = None,
                    trace: TraceContext | None = None) -> tuple[bytes, Reservation]:  # fmt: skip
        """The serialized answer to `request`, and what it holds of the memory budget (the
        message's `size`, grown before any work unless it is small; released by the caller).
        The door knows the size: ByteSize() serializes the message (75 ms and a transient 96
        MiB for a 48 MiB one)."""
        try:
            model = self.plane.ready_model(request.model_name, request.model_version or None)
            if size is None:
                size = request.ByteSize()
            small = size <= INLINE_BODY_BYTES
            if small and isinstance(model, OperatorModel) and not self.plane.tracing.on:
                answer = self._one_step(model, request)
                if answer is not None:
                    return answer, held
            if not small and held.held < size:
                await held.grow(size - held.held)
            wire = GrpcWire(request, size)
            answer = await self.plane.infer(model, wire.parse, wire.encode, held, size, small,
                                            trace=trace)  # fmt: skip
        except BaseException:
            held.release()
            raise
        return answer, held

    def _one_step(self, model: OperatorModel, request: pb.ModelInferRequest) -> bytes | None:
        """The answer to a small message on an operator version by its own work, inline
        (operator_call.py), counted in the version's statistics; None when that work declines
        it or fails (a refusal, an output too large to make inline): the general path then
        answers it, or refuses it in its words."""
        work = RawOperatorCall(model, request, self.plane.limits)
        arrived = perf_counter_ns()
        try:
            answer = work(self.plane.execution.inline)
        except Exception as exc:
            fell_back(exc)
            return None
        self.plane.stats.of(model.name, str(model.version)).succeeded(arrived, work.timings)
        return answer

    def trace_context(self, context: Context) -> str | None:
        """The caller's W3C traceparent, when the trace extension can follow it (its
        OpenTelemetry mode): read only then."""
        if self.plane.tracing.otel is None:
            return None
        for key, value in context.invocation_metadata() or ():
            if key == "traceparent":
                return value if isinstance(value, str) else None
        return None

    async def ModelStreamInfer(self, requests: Incoming, context: Context) -> None:
        """Many requests on one stream, answered in their order; a refused one is answered
        with its error in the stream, which goes on (Triton's way)."""
        stream = InferStream(self, context, self.stream_window)
        self.streams.add(stream)
        try:
            await stream.run(requests)
        finally:
            self.streams.discard(stream)

    def stop_streams(self) -> None:
        """Shutting down: every stream ends once the requests it has read are answered."""
        for stream in self.streams:
            stream.stop()
