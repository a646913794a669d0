"""ModelStreamInfer: many requests on one stream, as Triton serves them
(stream_infer_handler.cc; notes triton-grpc.md §3).

A reader takes the stream's requests as they come and starts each one's work at once; a
writer answers them in the order they came, each as a ModelStreamInferResponse, a refused one
with its error text and the request's id (the stream goes on). Bounds:
- at most `window` requests read and not yet answered: past it the reader stops reading, and
  HTTP/2 flow control holds the client back;
- a large request's message is reserved from the memory budget before the next one is read;
- an answer the client does not take within the send timeout ends the stream
  (RESOURCE_EXHAUSTED), freeing what it held.
The requests of one sequence start in the order they came (each waits for the one before it
to be done: the core runs them one at a time anyway); others run side by side.
"""

import asyncio
from collections.abc import Hashable
from typing import TYPE_CHECKING, Any

import grpc
from tritonclient.grpc import service_pb2 as pb

from service.core.memory_budget import Reservation
from service.core.offload import INLINE_BODY_BYTES
from service.grpc import wire
from service.grpc.converters import parameters_of
from service.grpc.door import send
from service.grpc.status import refusal

if TYPE_CHECKING:
    from service.grpc.servicer import Servicer

Answer = tuple[bytes, Reservation]


class InferStream:
    """One ModelStreamInfer call."""

    def __init__(self, servicer: "Servicer", context: grpc.aio.ServicerContext,
                 window: int) -> None:  # fmt: skip
        self.servicer = servicer
        self.context = context
        self.slots = asyncio.Semaphore(window)
        self.answers: asyncio.Queue[asyncio.Task[Answer] | None] = asyncio.Queue()
        self.holds: set[Reservation] = set()
        self.sequences: dict[Hashable, asyncio.Task[Answer]] = {}

    async def run(self, requests: Any) -> None:
        """Read and answer until the client half-closes (or the server stops the stream)."""
        reader = asyncio.create_task(self._read())
        try:
            while (task := await self.answers.get()) is not None:
                answer, held = await task
                try:
                    await send(self.context, answer, self.servicer.send_timeout)
                finally:
                    held.release()
                    self.holds.discard(held)
                    self.slots.release()
            if reader.done():
                reader.result()  # a read that failed fails the stream
        finally:
            reader.cancel()
            while not self.answers.empty():
                left = self.answers.get_nowait()
                if left is not None:
                    left.cancel()
            for held in self.holds:
                held.release()

    def stop(self) -> None:
        """End the stream once the requests read so far are answered."""
        self.answers.put_nowait(None)

    async def _read(self) -> None:
        try:
            while True:
                await self.slots.acquire()
                request = await self.context.read()
                if request is grpc.aio.EOF:
                    break
                held = Reservation(self.servicer.budget)
                self.holds.add(held)
                size = request.ByteSize()
                error = None
                if size > INLINE_BODY_BYTES:
                    try:  # before the next is read: what the reader holds stays in the budget
                        await held.grow(size)
                    except Exception as exc:
                        error = exc
                self.answers.put_nowait(self._start(request, held, error))
        finally:
            self.answers.put_nowait(None)

    def _start(self, request: pb.ModelInferRequest, held: Reservation,
               error: Exception | None) -> "asyncio.Task[Answer]":  # fmt: skip
        key = _sequence(request)
        before = self.sequences.get(key) if key is not None else None
        task = asyncio.create_task(self._answer(request, held, error, before))
        if key is not None:
            self.sequences[key] = task
            task.add_done_callback(lambda done: self._forget(key, done))
        return task

    def _forget(self, key: Hashable, task: "asyncio.Task[Answer]") -> None:
        if self.sequences.get(key) is task:
            del self.sequences[key]

    async def _answer(self, request: pb.ModelInferRequest, held: Reservation,
                      error: Exception | None,
                      before: "asyncio.Task[Answer] | None") -> Answer:  # fmt: skip
        try:
            if before is not None:
                await asyncio.wait([before])
            if error is not None:
                raise error
            answer, held = await self.servicer.infer(request, held)
            return wire.streamed(answer), held
        except Exception as exc:  # answered in the stream, which goes on (Triton's way)
            _code, details, _hint = refusal(exc)
            failed = pb.ModelStreamInferResponse(error_message=details,
                                                 infer_response=pb.ModelInferResponse(id=request.id))  # fmt: skip
            held.release()
            return failed.SerializeToString(), held


def _sequence(request: pb.ModelInferRequest) -> Hashable | None:
    """The model and sequence a request belongs to, if it names a sequence."""
    if "sequence_id" not in request.parameters:
        return None
    value = parameters_of({"sequence_id": request.parameters["sequence_id"]})["sequence_id"]
    return (request.model_name, request.model_version, value)
