"""Small successful calls answered in one step, on v1 operators and on V2 operator models.

The general path of a request goes through layers that each earn their place for some
request: telemetry's wrapper around `send`, the lane's memory reservation and error handling,
the execution's thread logic. For the most common call, a small JSON POST that succeeds, those
layers together cost more than its kernel. Here such a call is answered in one step: one scan
of the headers, the body read under its deadline (body_limit.read_body), the lane's own work
run inline under the execution's shared context, the answer sent with its request id, and its
statistics, access-log line and metrics recorded by the same functions the general path calls.

Anything else goes to the general path, before anything is sent: a header that asks for more
(another Content-Type, no or a large Content-Length, a compressed body; binary data except on V2,
whose one step takes tritonclient's binary form), any refusal or failure of the read or of
the work, an output that needs a kernel thread or could make an answer too large for one piece
(over SLICE_BYTES), an answer sent in slices, an answer to compress (Accept-Encoding) that
is too long to compress on the event loop (codecs/compression.py's INLINE_COMPRESSED_BYTES; a
shorter one is compressed here, as the general path would). The body read (or the read's
failure) is replayed to it, so the general path stays the one place for every refusal,
thread hop and error text; tests/api/test_one_step.py holds the two paths to equal answers, log lines,
metrics and statistics.
"""

import asyncio
from collections.abc import Callable
from time import perf_counter, perf_counter_ns

from starlette.types import Message, Receive, Scope, Send

from service.api.body_limit import ClientGone, byte_count, read_body
from service.api.lane import Lane
from service.api.observe import cut_short, observe
from service.api.send_answer import SLICE_BYTES, Headers
from service.codecs import compression
from service.core.execution import Work
from service.core.fallback import fell_back
from service.core.offload import INLINE_BODY_BYTES
from service.core.statistics import ModelStatistics
from service.errors import ServiceError
from service.telemetry.access_log import CLIENT_GONE
from service.telemetry.recorder import Telemetry
from service.telemetry.request_id import HEADER as REQUEST_ID
from service.telemetry.request_id import request_id

JSON_HEADERS: Headers = [(b"content-type", b"application/json")]
HEADER_LENGTH = b"inference-header-content-length"
_BINARY_MEDIA = (None, b"application/json", b"application/octet-stream")
"""What V2 clients send with binary data: tritonclient sends no Content-Type."""

Prepared = tuple[Work, ModelStatistics]
"""A call's work (its answer: the JSON bytes, or V2's (status, headers, bytes)) and the
statistics it counts in."""
SmallCall = tuple[int, bytes | None, int | None, bytes | None]
"""What small_call found: the body's length, the request id sent, the length of the JSON part
when binary data follows it (V2's binary extension), and the Accept-Encoding header on a lane
that compresses answers (V2)."""


class OneStep:
    """Answers the small calls of one lane in one step, or hands them to it."""

    def __init__(self, lane: Lane, telemetry: Telemetry, compresses: bool,
                 binary: bool = False, output_format: str = "json") -> None:  # fmt: skip
        self.lane, self.telemetry = lane, telemetry
        # an output whose answer could take more than one piece is refused by its kernel
        # before it is allocated (RunOffLoop) and left to the general path, which sends the
        # answer in slices: made once, not made here, thrown away and made again. The
        # lane's usual answer form is set here too, so most calls use this context as it is.
        self.context = lane.execution.inline.variant(one_piece_bytes=SLICE_BYTES,
                                                     output_format=output_format)  # fmt: skip
        self.compresses = compresses  # the lane compresses answers a client accepts so (V2)
        self.binary = binary  # the lane takes binary data after the JSON (V2)
        self.max_request_bytes = lane.max_request_bytes
        self.body_timeout = lane.body_timeout
        self.max_body = min(INLINE_BODY_BYTES, self.max_request_bytes)

    def small_call(self, scope: Scope) -> SmallCall | None:
        """(body length, request id sent, JSON length) of a call this path may answer, from one
        scan of its headers; None when the general path must."""
        length = media = sent_id = json_length = accept = None
        for name, value in scope["headers"]:
            if name == b"content-length":
                if length is not None:
                    return None  # the lanes read the first: leave the odd request to them
                length = value
            elif name == b"content-type":
                if media is not None:
                    return None
                media = value
            elif name == REQUEST_ID:  # the last, as telemetry reads it
                sent_id = value
            elif name == HEADER_LENGTH:
                if json_length is not None or not self.binary:
                    return None
                json_length = value
            elif name == b"content-encoding":
                return None
            elif name == b"accept-encoding" and self.compresses:
                # read once the answer's length is known (_coding); several lines are one
                # list (RFC 9110, 5.3), as the general path reads them
                accept = value if accept is None else accept + b", " + value
        size = None if length is None else byte_count(length)
        if size is None or size > self.max_body:
            return None
        if json_length is None:
            return (size, sent_id, None, accept) if media == b"application/json" else None
        count = byte_count(json_length)
        if media not in _BINARY_MEDIA or count is None:
            return None  # an odd count is the general path's to refuse, in its words
        return size, sent_id, count, accept

    async def __call__(self, scope: Scope, receive: Receive, send: Send, route: str,
                       call: SmallCall,
                       prepare: Callable[[bytes, int | None], Prepared]) -> None:  # fmt: skip
        """Answer a small call (small_call's `call`), its work made by `prepare(body, JSON
        length)`."""
        telemetry = self.telemetry
        length, sent_id, json_length, accept = call
        rid = request_id(sent_id)
        start = perf_counter()
        telemetry.metrics.in_flight += 1
        telemetry.schedule()
        replay: Receive | None = None
        content = b""
        status, started, sent = CLIENT_GONE, False, 0
        try:
            try:
                body = await read_body(receive, self.max_request_bytes, self.body_timeout, None,
                                       length)  # fmt: skip
            except (ServiceError, ClientGone) as failed:
                replay = _replayed(receive, None, failed)
            else:
                work, stats = prepare(body, json_length)
                arrived = perf_counter_ns()
                try:
                    answer = work(self.context)
                except Exception as exc:  # a refusal, an output for a thread, a bug
                    fell_back(exc)
                    answer = None
                headers, whole = _parts(answer)
                coding = None if whole is None or accept is None else _coding(accept, len(whole))
                if (
                    whole is None
                    or len(whole) > SLICE_BYTES
                    # compressed on a thread: the general path's (which runs the work again,
                    # cheap beside compressing this much)
                    or (coding is not None and len(whole) > compression.INLINE_COMPRESSED_BYTES)
                ):
                    replay = _replayed(receive, body, None)  # the general path's to answer
                elif coding is None:
                    content = whole
                else:  # as the general path compresses it (V2Wire.encode)
                    content = b"".join(compression.deflate([whole], coding))
                    headers = [*headers, (b"content-encoding", coding.encode())]
            if replay is None:
                stats.succeeded(arrived, work.timings)
                headers = [*headers, (b"content-length", b"%d" % len(content)), (REQUEST_ID, rid)]
                # counted as telemetry.observe counts them: each message once handed to send
                started, status = True, 200
                await send({"type": "http.response.start", "status": 200, "headers": headers})
                sent = len(content)
                await send({"type": "http.response.body", "body": content})
        except asyncio.CancelledError:  # shutdown's grace period is over (as telemetry.observe)
            status = await cut_short(send, started)
        except BaseException:  # a send that failed, a bug: still one log line (as observe)
            if not started:
                status = 500  # what the server answers for an exception before a response
            raise
        finally:
            telemetry.metrics.in_flight -= 1
            if replay is None:  # else the general path answers, observed as any request
                telemetry.record(scope, rid, route, status, perf_counter() - start, length, sent)
                telemetry.schedule()
        if replay is not None:
            await observe(telemetry, self.lane, scope, replay, send, route)


def _coding(accept_encoding: bytes, size: int) -> str | None:
    """The coding an answer of `size` bytes is compressed with for this Accept-Encoding (V2),
    as the general path chooses it; None: sent as it is."""
    header = accept_encoding.decode("latin-1")
    return compression.answer_coding(header, compression.accepted(header), size)


def _parts(answer: object) -> tuple[Headers, bytes | None]:
    """The headers and bytes of a work's answer, if they can go in one piece: v1's JSON bytes,
    or V2's (200, headers, bytes)."""
    if isinstance(answer, bytes):
        return JSON_HEADERS, answer
    if isinstance(answer, tuple) and answer[0] == 200 and isinstance(answer[2], bytes):
        return answer[1], answer[2]
    return [], None


def _replayed(receive: Receive, body: bytes | None, failed: Exception | None) -> Receive:
    """`receive` for the general path after a one-step attempt: the body it read first (or its
    read's failure again: the client's disconnect, or the refusal raised), then `receive`."""
    pending = True

    async def replay() -> Message:
        nonlocal pending
        if not pending:
            return await receive()
        pending = False
        if isinstance(failed, ClientGone):
            return {"type": "http.disconnect"}
        if failed is not None:
            raise failed
        return {"type": "http.request", "body": body, "more_body": False}

    return replay
