"""Every gRPC call's way in and out, for every service served (inference, health, reflection):
admitted under OPSERVE_GRPC_MAX_CALLS, its message read under the body deadline, a refusal
turned into its status (status.py), and one metrics count and access-log line with the request
id (the client's `x-request-id` metadata or a new one, sent back in the trailing metadata).

Every method that takes one message is registered as if it took a stream of them: the bytes
on the wire are the same, but grpc.aio reads a unary call's message before any code of ours
runs, so a client that sent headers and never its message would hold a call we neither count
nor time. Read here, the message has a deadline (DEADLINE_EXCEEDED), and the call a place in
the count from its first moment. A method whose answer may be large writes it itself under the
send timeout (`send`); a client that never reads it is cut off with RESOURCE_EXHAUSTED.
"""

import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import grpc
from google.protobuf.descriptor import ServiceDescriptor
from google.protobuf.message_factory import GetMessageClass

from service.core.call_slots import CallSlots, client_of
from service.core.dataplane import DataPlane
from service.core.deadlines import before_deadline, within
from service.core.peer_uid import endpoint_of_grpc_peer
from service.errors import BadRequest, Overloaded, RequestTimeout, ServiceError
from service.grpc import wire
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


def writes_itself(method: M) -> M:
    """Mark a unary method that sends its answer with `send` (registered as streaming out)."""
    method.writes = True  # type: ignore[attr-defined]
    return method


async def send(context: grpc.aio.ServicerContext, message: Any, timeout: float) -> None:
    """Write one answer; RESOURCE_EXHAUSTED when the client takes none of it within `timeout`
    (kept by the body deadlines' ticker: asyncio.timeout costs 4.3-5.4 us a write, this 0.5)."""
    await within(context.write(message), timeout, lambda: NotReading(
        f"the client read none of the answer within {timeout:g} s "
        "(OPSERVE_SEND_TIMEOUT_SECONDS)"))  # fmt: skip


async def next_message(context: grpc.aio.ServicerContext, idle_seconds: float) -> Any:
    """A stream's next message (or EOF); DEADLINE_EXCEEDED when none comes within
    `idle_seconds` (OPSERVE_GRPC_IDLE_SECONDS): a silent stream holds its slot no longer."""
    return await within(context.read(), idle_seconds, lambda: RequestTimeout(
        f"the stream sent no message within {idle_seconds:g} s (OPSERVE_GRPC_IDLE_SECONDS)"))  # fmt: skip


class Door:
    """The gRPC door of one worker: its handlers, its count of calls and their telemetry."""

    def __init__(self, plane: DataPlane, telemetry: Telemetry, slots: CallSlots,
                 body_timeout: float, send_timeout: float, idle_seconds: float) -> None:  # fmt: skip
        self.plane = plane
        self.telemetry = telemetry
        self.slots = slots
        self.body_timeout = body_timeout
        self.send_timeout = send_timeout
        self.idle_seconds = idle_seconds

    def handlers(self, service: ServiceDescriptor, servicer: Any) -> dict[str, Any]:
        """A method handler for every method of `service`, by its full name."""
        found = {}
        for method in service.methods:
            route = f"/{service.full_name}/{method.name}"
            parse = GetMessageClass(method.input_type).FromString
            behavior = getattr(servicer, method.name)
            if method.client_streaming:
                found[route] = grpc.stream_stream_rpc_method_handler(
                    self.streaming(route, behavior), parse, wire.serialize
                )
            else:
                fields = MODEL_FIELDS.get(method.name) if service.name == "GRPCInferenceService" else None  # fmt: skip
                writes = method.server_streaming or getattr(behavior, "writes", False)
                made = grpc.stream_stream_rpc_method_handler if writes else (
                    grpc.stream_unary_rpc_method_handler)  # fmt: skip
                found[route] = made(self.unary(route, behavior, fields, writes), parse,
                                    wire.serialize)  # fmt: skip
        return found

    def unary(self, route: str, behavior: Behavior, fields: tuple[str, str] | None = None,
              writes: bool = False) -> Behavior:  # fmt: skip
        """A call of one message: read under the deadline, then answered by `behavior` (which,
        when it `writes`, sends its answer itself and returns the bytes it sent)."""

        async def call(requests: Any, context: grpc.aio.ServicerContext) -> Any:
            record = self._begin(route, context)
            try:
                self._admit(record)
                request = await before_deadline(context.read(), self.body_timeout)
                if request is grpc.aio.EOF:
                    raise BadRequest("the call ended before its request message")
                record.bytes_in = request.ByteSize()
                if fields is not None:
                    name, version = (getattr(request, field) for field in fields)
                    record.scope[MODEL_LABELS] = self.plane.labels(name, version or None)
                answer = await behavior(request, context)
                record.bytes_out = (answer or 0) if writes else _size(answer)
                return None if writes else answer
            except Exception as exc:
                await self._refuse(record, context, exc)
            finally:
                self._end(record, context)

        return call

    def streaming(self, route: str, behavior: Callable[..., Any]) -> Behavior:
        """A call that streams messages in: `behavior` reads them (and writes, or yields)."""

        async def call(requests: AsyncIterator[Any], context: grpc.aio.ServicerContext) -> None:
            record = self._begin(route, context)
            try:
                self._admit(record)
                answers = behavior(self.messages(context), context)
                if isinstance(answers, AsyncIterator):  # an async generator (reflection)
                    async for answer in answers:
                        await send(context, answer, self.send_timeout)
                else:
                    await answers
            except Exception as exc:
                await self._refuse(record, context, exc)
            finally:
                self._end(record, context)

        return call

    async def messages(self, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
        """A stream's messages until the client half-closes, each within the idle deadline."""
        while (message := await next_message(context, self.idle_seconds)) is not grpc.aio.EOF:
            yield message

    def refusing(self, route: str, error: ServiceError) -> Behavior:
        """A call answered with `error` whatever it sends (a refused API key)."""

        async def call(requests: Any, context: grpc.aio.ServicerContext) -> None:
            record = self._begin(route, context)
            try:
                await self._refuse(record, context, error)
            finally:
                self._end(record, context)

        return call

    def _begin(self, route: str, context: grpc.aio.ServicerContext) -> "_Record":
        sent = next((m.value for m in context.invocation_metadata() if m.key == REQUEST_ID), None)
        rid = request_id(sent.encode("latin-1") if isinstance(sent, str) else sent)
        record = _Record(route, rid, _client(context.peer()))
        record.refused = self.slots.take(client_of(record.client[0]))
        context.set_trailing_metadata(((REQUEST_ID, rid.decode()),))
        self.telemetry.started()
        return record

    @staticmethod
    def _admit(record: "_Record") -> None:
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

    def _end(self, record: "_Record", context: grpc.aio.ServicerContext) -> None:
        if record.refused is None:
            self.slots.give(client_of(record.client[0]))
        if record.status is None:  # no refusal: done, or the client went away
            record.status = Code.CANCELLED if context.cancelled() else Code.OK
        if self.telemetry.log is not None:
            record.scope["client"] = record.client
        seconds = time.perf_counter() - record.start
        self.telemetry.finished(record.scope, record.rid, record.route, record.status.value[0],
                                seconds, record.bytes_in, record.bytes_out)  # fmt: skip


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
