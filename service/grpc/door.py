"""Every gRPC call's way in and out, for every service served (inference, health, reflection):
admitted under OPSERVE_GRPC_MAX_CALLS (the inference service's calls in one count, health's and
reflection's in another, so that probes cannot shut out inference, nor inference the probes),
a stream (ModelStreamInfer, Watch, reflection) under OPSERVE_GRPC_MAX_STREAMS instead (in two
counts likewise) and, for ModelStreamInfer, under a call slot only while one of its messages
is served (`Incoming.served`): open streams are bounded, silent ones hold no slot a call needs
(call_slots.py), its messages read under the body deadline (a unary call's) or the idle
deadline (a stream's) and held to the memory budget (messages.py), a refusal turned into its
status (status.py), and one metrics count and access-log line with the request id (the
client's `x-request-id` metadata or a new one, sent back in the trailing metadata).

Every method that takes one message is registered as if it took a stream of them: the bytes
on the wire are the same, but grpc.aio reads a unary call's message before any code of ours
runs, so a client that sent headers and never its message would hold a call we neither count
nor time. Read here, the message has a deadline (DEADLINE_EXCEEDED), and the call a place in
the count from its first moment. A method whose answer may be large writes it itself under the
send timeout (`send`); a client that never reads it is cut off with RESOURCE_EXHAUSTED.
"""

import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

import grpc
from google.protobuf.descriptor import ServiceDescriptor
from google.protobuf.message_factory import GetMessageClass

from service.codecs.compression import INLINE_COMPRESSED_BYTES
from service.core.call_slots import STREAMS, CallSlots, client_of
from service.core.dataplane import DataPlane
from service.core.deadlines import body_timeout, within
from service.core.memory_budget import MemoryBudget, Reservation
from service.core.peer_uid import endpoint_of_grpc_peer
from service.core.settings_requests import check_settings_size
from service.core.trace_context import TraceContext
from service.errors import BadRequest, Overloaded, RequestTimeout, ServiceError
from service.grpc import wire
from service.grpc.messages import Messages, Parse, Read
from service.grpc.status import Code, refusal
from service.telemetry.recorder import MODEL_LABELS, Telemetry
from service.telemetry.request_id import request_id

REQUEST_ID = "x-request-id"
MODEL_FIELDS = {"ModelInfer": ("model_name", "model_version"), "ModelMetadata": ("name", "version"),
                "ModelReady": ("name", "version"), "ModelConfig": ("name", "version"),
                "ModelStatistics": ("name", "version")}  # fmt: skip
"""The inference methods whose calls are labelled with their model (as HTTP's model routes)."""
Behavior = Callable[[Any, grpc.aio.ServicerContext], Awaitable[Any]]
M = TypeVar("M", bound=Callable[..., Any])


class NotReading(Overloaded):
    """A client that took none of an answer within the send timeout (no retry hint: it is the
    client that must change)."""

    retry_after: int | None = None  # type: ignore[assignment]


class StreamIdle(RequestTimeout):
    """A stream that sent no request within the idle deadline."""


SETTINGS_METHODS = frozenset({
    "RepositoryIndex", "RepositoryModelUnload", "SystemSharedMemoryStatus",
    "SystemSharedMemoryRegister", "SystemSharedMemoryUnregister", "CudaSharedMemoryStatus",
    "CudaSharedMemoryRegister", "CudaSharedMemoryUnregister", "TraceSetting", "LogSettings",
})  # fmt: skip
"""The methods whose messages are settings or repository requests, as HTTP's routes of the
same names (core/settings_requests.py)."""


def writes_itself(method: M) -> M:
    """Mark a unary method that sends its answer with `send` (registered as streaming out)."""
    method.writes = True  # type: ignore[attr-defined]
    return method


def takes_reservation(method: M) -> M:
    """Mark a unary method called with what its message holds of the memory budget, the
    message's size and its trace context (or None: core/trace_context.py) as third to fifth
    arguments; it releases the first (once its answer is sent) and closes the last."""
    method.takes_reservation = True  # type: ignore[attr-defined]
    return method


def sent_as_is_if_long(context: grpc.aio.ServicerContext, size: int) -> None:
    """Send the next message (of `size` bytes) uncompressed when it is longer than
    INLINE_COMPRESSED_BYTES, whatever OPSERVE_GRPC_COMPRESSION says: grpc compresses a
    message on the thread that sends it, this server's event loop, where one 32 MiB answer in
    gzip held every other client's request 0.86 s (a health probe beside it). grpc has no way
    to send a message compressed elsewhere (HTTP's long answers are compressed on a kernel
    thread instead), so a long one goes as it is: random float32 shrinks by 7-10 % at zlib's
    level 1, and a client reads either, compression being per message in gRPC."""
    if size > INLINE_COMPRESSED_BYTES:
        context.disable_next_message_compression()


async def send(context: grpc.aio.ServicerContext, message: Any, timeout: float) -> None:
    """Write one answer (sent_as_is_if_long); RESOURCE_EXHAUSTED when the client takes none of
    it within `timeout` (kept by the body deadlines' ticker: asyncio.timeout costs 4.3-5.4 us
    a write, this 0.5)."""
    sent_as_is_if_long(context, _size(message))
    await within(context.write(message), timeout, lambda: NotReading(
        f"the client read none of the answer within {timeout:g} s "
        "(OPSERVE_SEND_TIMEOUT_SECONDS)"))  # fmt: skip


class Door:
    """The gRPC door of one worker: its handlers, its count of calls and their telemetry."""

    def __init__(self, plane: DataPlane, telemetry: Telemetry, budget: MemoryBudget,
                 messages: Messages, max_calls: int, per_client: int, body_timeout: float,
                 send_timeout: float, idle_timeout: float, max_streams: int,
                 streams_per_client: int) -> None:  # fmt: skip
        self.plane = plane
        self.telemetry = telemetry
        self.budget = budget
        self.messages = messages
        self.max_calls = max_calls
        self.body_timeout = body_timeout
        self.send_timeout = send_timeout
        self.idle_timeout = idle_timeout
        self.inference = CallSlots(max_calls, per_client)
        self.others = CallSlots(max_calls, per_client, "health and reflection calls")
        self.inference_streams = CallSlots(max_streams, streams_per_client, "inference streams",
                                           STREAMS)  # fmt: skip
        self.other_streams = CallSlots(max_streams, streams_per_client,
                                       "health and reflection streams", STREAMS)  # fmt: skip

    @property
    def calls(self) -> int:
        """Calls in progress, in both counts (streams only while a message is served)."""
        return self.inference.taken + self.others.taken

    @property
    def streams(self) -> int:
        """Streams open, in both counts."""
        return self.inference_streams.taken + self.other_streams.taken

    def handlers(self, service: ServiceDescriptor, servicer: Any) -> dict[str, Any]:
        """A method handler for every method of `service`, by its full name."""
        found = {}
        inference = service.name == "GRPCInferenceService"
        pool = self.inference if inference else self.others
        streams = self.inference_streams if inference else self.other_streams
        for method in service.methods:
            route = f"/{service.full_name}/{method.name}"
            # messages come as bytes (no deserializer): the door parses them (messages.py)
            parse = GetMessageClass(method.input_type).FromString
            behavior = getattr(servicer, method.name)
            if method.client_streaming:
                found[route] = grpc.stream_stream_rpc_method_handler(
                    self.streaming(route, behavior, parse, streams, pool), None, wire.serialize
                )
            else:
                fields = MODEL_FIELDS.get(method.name) if pool is self.inference else None
                writes = method.server_streaming or getattr(behavior, "writes", False)
                made = grpc.stream_stream_rpc_method_handler if writes else (
                    grpc.stream_unary_rpc_method_handler)  # fmt: skip
                # a stream out (Watch) is open for as long as its client likes: a stream's place
                held = streams if method.server_streaming else pool
                found[route] = made(self.unary(route, behavior, parse, held, fields, writes,
                                               method.name in SETTINGS_METHODS),
                                    None, wire.serialize)  # fmt: skip
        return found

    def unary(self, route: str, behavior: Behavior, parse: Parse, pool: CallSlots,
              fields: tuple[str, str] | None = None, writes: bool = False,
              settings: bool = False) -> Behavior:  # fmt: skip
        """A call of one message: read under the deadline, then answered by `behavior` (which,
        when it `writes`, sends its answer itself and returns the bytes it sent); a
        `settings` message is small (core/settings_requests.py)."""
        handed = getattr(behavior, "takes_reservation", False)
        answering: Any = behavior  # called with the reservation too when `handed`

        def late() -> Exception:
            return body_timeout(self.body_timeout)

        async def call(requests: Any, context: grpc.aio.ServicerContext) -> Any:
            record = self._begin(route, context, pool)
            held = Reservation(self.budget)
            owned = True  # until `behavior` takes it
            # an inference's trace stamps (core/trace_context.py), while tracing is on
            trace = TraceContext("GRPC", time.perf_counter_ns()) if (
                handed and self.plane.tracing.on) else None  # fmt: skip
            try:
                self._admit(record, pool)
                read = await self.messages.read(context, parse, held, self.body_timeout, late,
                                                 leased=True)  # fmt: skip
                if read is None:
                    raise BadRequest("the call ended before its request message")
                if trace is not None:
                    trace.read()
                request, record.bytes_in = read.message, read.wire_bytes
                if settings:
                    check_settings_size(read.size)  # parsed on a thread when it was large
                if fields is not None:
                    name, version = (getattr(request, field) for field in fields)
                    record.scope[MODEL_LABELS] = self.plane.labels(name, version or None)
                if handed:
                    owned = False
                    answer = await answering(request, context, held, read.size, trace)
                else:
                    answer = await behavior(request, context)
                if writes:
                    record.bytes_out = answer or 0
                    return None
                record.bytes_out = _size(answer)
                sent_as_is_if_long(context, record.bytes_out)
                return answer
            except Exception as exc:
                await self._refuse(record, context, exc)
            finally:
                if owned:
                    held.release()
                self._end(record, context, pool)

        return call

    def streaming(self, route: str, behavior: Callable[..., Any], parse: Parse,
                  streams: CallSlots, calls: CallSlots) -> Behavior:  # fmt: skip
        """A call that streams messages in, holding a place of `streams` while open: `behavior`
        reads them from an Incoming (and writes, or yields), which takes a slot of `calls`
        while it serves one when asked (`Incoming.served`)."""

        async def call(requests: AsyncIterator[Any], context: grpc.aio.ServicerContext) -> None:
            record = self._begin(route, context, streams)
            try:
                self._admit(record, streams)
                client = client_of(record.client[0])
                answers = behavior(Incoming(self, context, parse, calls, client), context)
                if isinstance(answers, AsyncIterator):  # an async generator (reflection)
                    async for answer in answers:
                        await send(context, answer, self.send_timeout)
                else:
                    await answers
            except Exception as exc:
                await self._refuse(record, context, exc)
            finally:
                self._end(record, context, streams)

        return call

    def refusing(self, route: str, error: ServiceError) -> Behavior:
        """A call answered with `error` whatever it sends (a refused API key): counted in
        the metrics and the log, never in a count of calls (it holds none of their places)."""

        async def call(requests: Any, context: grpc.aio.ServicerContext) -> None:
            record = self._begin(route, context, None)
            try:
                await self._refuse(record, context, error)
            finally:
                self._end(record, context, None)

        return call

    def _begin(self, route: str, context: grpc.aio.ServicerContext,
               pool: CallSlots | None) -> "_Record":  # fmt: skip
        sent = next((m.value for m in context.invocation_metadata() if m.key == REQUEST_ID), None)
        rid = request_id(sent.encode("latin-1") if isinstance(sent, str) else sent)
        record = _Record(route, rid, _client(context.peer()))
        if pool is not None:
            record.refused = pool.take(client_of(record.client[0]))
        context.set_trailing_metadata(((REQUEST_ID, rid.decode()),))
        self.telemetry.started()
        return record

    @staticmethod
    def _admit(record: "_Record", pool: CallSlots) -> None:
        if record.refused is not None:
            raise record.refused

    async def _refuse(self, record: "_Record", context: grpc.aio.ServicerContext,
                      exc: Exception) -> None:  # fmt: skip
        if isinstance(exc, grpc.aio.AbortError):  # aborted already: its status stands
            record.status = context.code() or Code.UNKNOWN
            raise exc
        code, details, hint = refusal(exc)
        record.status = code
        await context.abort(code, details, ((REQUEST_ID, record.rid.decode()), *hint))

    def _end(self, record: "_Record", context: grpc.aio.ServicerContext,
             pool: CallSlots | None) -> None:  # fmt: skip
        if pool is not None and record.refused is None:
            pool.give(client_of(record.client[0]))
        if record.status is None:  # no refusal: done, or the client went away
            record.status = Code.CANCELLED if context.cancelled() else Code.OK
        if self.telemetry.log is not None:
            record.scope["client"] = record.client
        seconds = time.perf_counter() - record.start
        self.telemetry.finished(record.scope, record.rid, record.route, record.status.value[0],
                                seconds, record.bytes_in, record.bytes_out)  # fmt: skip


class Incoming:
    """The messages of a client-streaming call, read through the door: each under the idle
    deadline (OPSERVE_GRPC_IDLE_SECONDS), claimed and parsed as messages.py says."""

    def __init__(self, door: Door, context: grpc.aio.ServicerContext, parse: Parse,
                 calls: CallSlots | None = None, client: str = "") -> None:  # fmt: skip
        self.door, self.context, self.parse = door, context, parse
        self.calls, self.client = calls, client

    @contextmanager
    def served(self) -> Iterator[Overloaded | None]:
        """A call slot of the client's while the block serves one message: the refusal when
        none is free (nothing taken; the block answers it in the stream)."""
        refused = self.calls.take(self.client) if self.calls is not None else None
        try:
            yield refused
        finally:
            if self.calls is not None and refused is None:
                self.calls.give(self.client)

    async def next(self, held: Reservation) -> Read | None:
        """The next message (what it holds claimed in `held`), None once the client is done."""
        seconds = self.door.idle_timeout
        return await self.door.messages.read(self.context, self.parse, held, seconds,
                                             lambda: _idle(seconds), leased=False)  # fmt: skip

    def __aiter__(self) -> "Incoming":
        return self

    async def __anext__(self) -> Any:
        held = Reservation(self.door.budget)
        try:
            read = await self.next(held)
        finally:
            held.release()  # small messages (reflection): their memory is not held
        if read is None:
            raise StopAsyncIteration
        return read.message


def _idle(seconds: float) -> StreamIdle:
    return StreamIdle(f"the stream sent no request within {seconds:g} s "
                      "(OPSERVE_GRPC_IDLE_SECONDS)")  # fmt: skip


class _Record:
    """What the telemetry of one call records."""

    __slots__ = ("bytes_in", "bytes_out", "client", "refused", "rid", "route", "scope", "start",
                 "status")  # fmt: skip

    def __init__(self, route: str, rid: bytes, client: tuple[str, int]) -> None:
        self.route, self.rid, self.client = route, rid, client
        self.refused: Overloaded | None = None  # why no call slot was free for it
        self.start = time.perf_counter()
        self.scope: dict[str, Any] = {"path": route, "method": "GRPC"}
        self.bytes_in = self.bytes_out = 0
        self.status: Code | None = None


def _size(answer: Any) -> int:
    return len(answer) if isinstance(answer, bytes) else answer.ByteSize()


def _client(peer: str) -> tuple[str, int]:
    """(host, port) of a peer as grpc names it (`ipv4:127.0.0.1:5000`, `ipv6:%5B::1%5D:5000`);
    another kind of peer (a Unix socket) as its whole name."""
    return endpoint_of_grpc_peer(peer) or (peer, 0)
