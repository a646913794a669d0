"""ModelStreamInfer: many requests on one stream, as Triton serves them
(stream_infer_handler.cc; notes triton-grpc.md §3).

A reader takes the stream's requests one at a time and answers each (the core runs it inline
or on a kernel thread, as any request); a writer sends the answers in the order they came,
each as a ModelStreamInferResponse, a refused request's with its error text and the request's
id (the stream goes on). One request of a stream at a time keeps a sequence's requests in
their order for free and costs no task per request (a client wanting requests side by side
opens more streams, or calls ModelInfer). Bounds:
- a request takes one of its client's call slots (OPSERVE_GRPC_MAX_CALLS_PER_CLIENT) while it
  is served, from its arrival to its answer made, and the stream none while it waits: a
  request that finds none free is answered with the refusal in the stream, which goes on;
- at most `window` answers wait for the writer: past it the reader stops reading, and HTTP/2
  flow control holds the client back;
- a large request's message is reserved from the memory budget before it is worked on, and
  its share held until its answer is sent;
- an answer the client does not take within the send timeout ends the stream
  (RESOURCE_EXHAUSTED), freeing what it held.
"""

import asyncio
from time import perf_counter_ns
from typing import Protocol

import grpc
from tritonclient.grpc import service_pb2 as pb

from service.core.dataplane import DataPlane
from service.core.memory_budget import MemoryBudget, Reservation
from service.core.trace_context import TraceContext
from service.grpc import wire
from service.grpc.door import Incoming, send
from service.grpc.status import refusal

Answer = tuple[bytes, Reservation, TraceContext | None]  # the trace: closed once it is sent


class Answering(Protocol):
    """What a stream needs of the servicer that opened it (servicer.py), named here so that
    the two modules do not import each other."""

    plane: DataPlane
    budget: MemoryBudget
    send_timeout: float

    async def infer(self, request: pb.ModelInferRequest, held: Reservation,
                    size: int | None = None,
                    trace: TraceContext | None = None) -> tuple[bytes, Reservation]: ...  # fmt: skip

    def trace_context(self, context: grpc.aio.ServicerContext) -> str | None: ...


class InferStream:
    """One ModelStreamInfer call."""

    def __init__(self, servicer: Answering, context: grpc.aio.ServicerContext,
                 window: int) -> None:  # fmt: skip
        self.servicer = servicer
        self.context = context
        self.answers: asyncio.Queue[Answer | None] = asyncio.Queue(window)
        self.stopping = self.busy = False
        self.reader: asyncio.Task[None] | None = None

    async def run(self, requests: Incoming) -> None:
        """Read and answer until the client half-closes (or the server stops the stream)."""
        self.reader = reader = asyncio.create_task(self._read(requests))
        try:
            while (item := await self.answers.get()) is not None:
                answer, held, trace = item
                try:
                    if trace is not None:
                        trace.send()
                    await send(self.context, answer, self.servicer.send_timeout)
                finally:
                    held.release()
                    if trace is not None:
                        trace.close()
            await asyncio.wait([reader])  # it ends once it has marked the end
            if not reader.cancelled():
                reader.result()  # a read that failed fails the stream
        finally:
            reader.cancel()
            while not self.answers.empty():
                left = self.answers.get_nowait()
                if left is not None:
                    left[1].release()
                    if left[2] is not None:
                        left[2].close()

    def stop(self) -> None:
        """End the stream once the requests read so far are answered: a reader waiting for
        the next request stops waiting; one at work finishes it first."""
        self.stopping = True
        if self.reader is not None and not self.busy:
            self.reader.cancel()  # its end marks the end of the answers

    async def _read(self, requests: Incoming) -> None:
        try:
            while not self.stopping:
                held = Reservation(self.servicer.budget)
                # the request's trace stamps (core/trace_context.py), while tracing is on
                trace = TraceContext("GRPC", perf_counter_ns()) if (
                    self.servicer.plane.tracing.on) else None  # fmt: skip
                try:
                    read = await requests.next(held)
                except BaseException:
                    held.release()
                    raise
                if read is None:
                    break
                self.busy = True
                if trace is not None:
                    trace.read()
                with requests.served() as refused:
                    answer = await self._answer(read.message, held, read.size, refused, trace)
                self.busy = False
                await self.answers.put(answer)
        finally:
            if not self.answers.full():
                self.answers.put_nowait(None)
            else:  # the writer is busy with a client that reads slowly: it gets there
                await self.answers.put(None)

    async def _answer(self, request: pb.ModelInferRequest, held: Reservation, size: int,
                      refused: Exception | None, trace: TraceContext | None) -> Answer:  # fmt: skip
        try:
            if refused is not None:  # no call slot free for it
                raise refused
            if trace is not None:
                trace.traceparent = self.servicer.trace_context(self.context)
            answer, held = await self.servicer.infer(request, held, size, trace)
            return wire.streamed(answer), held, trace
        except Exception as exc:  # answered in the stream, which goes on (Triton's way)
            _code, details, _hint = refusal(exc)
            failed = pb.ModelStreamInferResponse(error_message=details,
                                                 infer_response=pb.ModelInferResponse(id=request.id))  # fmt: skip
            return failed.SerializeToString(), held, trace
