"""The KServe V2 door over HTTP: every `/v2` route as one raw ASGI app, in front of FastAPI
like the operator lane.

Each request is matched against Triton's routes (v2_routes.py), its method checked, and its
handler run; infer is answered here. FastAPI only documents these routes (api/v2.py). Every
answer that is an error is `{"error": "<text>"}` with Triton's status codes (V2_STATUS).
"""

from collections.abc import Callable
from time import perf_counter_ns

from pydantic import ValidationError
from starlette.types import ASGIApp, Receive, Scope, Send

from service.api import v2_routes
from service.api.body_limit import ClientGone, content_length, read_body, too_large, until_gone
from service.api.content_type import V2_TYPES, check_content_type
from service.api.errors import unexpected_content
from service.api.lane import Guards, Lane
from service.api.observe import UNMATCHED, observe
from service.api.one_step import OneStep, Prepared
from service.api.responses import dumps
from service.api.send_answer import Answer, refusal_headers, send_answer
from service.api.v2_codec import answer_headers, encode_result, parse_request
from service.api.v2_operator_call import OperatorCall
from service.api.v2_routes import V2Request
from service.codecs import compression
from service.codecs.json_tensor import json_body_memory
from service.codecs.wire import Chunks
from service.core.calls import InferCall, InferResult
from service.core.dataplane import DataPlane
from service.core.memory_budget import MemoryBudget, Reservation
from service.core.model import V2Model
from service.core.offload import INLINE_BODY_BYTES
from service.core.operator_model import OperatorModel
from service.core.trace_context import TraceContext
from service.errors import (
    AlreadyExists,
    BadRequest,
    InvalidInput,
    ModelNotReady,
    NotFound,
    PayloadTooLarge,
    RunCancelled,
    ServiceError,
)
from service.kernels.context import KernelContext, RunOffLoop
from service.telemetry.access_log import CLIENT_GONE
from service.telemetry.recorder import MODEL_LABELS, Telemetry

PREFIX = "/v2"
Headers = list[tuple[bytes, bytes]]


class MethodNotAllowed(ServiceError):
    status_code = 405

    def __init__(self, method: str, allowed: str) -> None:
        super().__init__("Method Not Allowed")  # Triton's words
        self.allowed = allowed


class V2Lane(Lane):
    """Answers the V2 model routes through the data plane. Large requests are held to the
    memory budget, body deadline and send timeout exactly as on the operator lane."""

    def __init__(self, plane: DataPlane, budget: MemoryBudget, guards: Guards) -> None:
        super().__init__(plane.execution, budget, guards)
        self.plane = plane

    async def _serve(self, scope: Scope, receive: Receive, send: Send, held: Reservation) -> int:
        headers: Headers = [(b"content-type", b"application/json")]
        content: Answer
        # the trace's receive and send stamps (core/trace_context.py), while tracing is on
        trace = TraceContext("HTTP", perf_counter_ns()) if self.plane.tracing.on else None
        try:
            try:
                status, headers, content = await self._answer(scope, receive, held, trace)
            except (ClientGone, RunCancelled):
                return CLIENT_GONE
            except ServiceError as exc:
                status, content = v2_status(exc), dumps({"error": str(exc)})
                if isinstance(exc, MethodNotAllowed):
                    headers.append((b"allow", exc.allowed.encode()))
                headers += refusal_headers(exc)
            except ValidationError as exc:
                status, content = 400, dumps({"error": str(exc.errors()[0]["msg"])})
            except Exception:
                detail = unexpected_content(scope["method"], scope["path"])["detail"]
                status, content = 500, dumps({"error": detail})
            if trace is not None:
                trace.send()
            return await send_answer(send, scope, status, headers, content, self.offloader,
                                     self.send_timeout)  # fmt: skip
        finally:
            if trace is not None:
                trace.close()

    async def _answer(
        self, scope: Scope, receive: Receive, held: Reservation, trace: TraceContext | None
    ) -> tuple[int, Headers, Answer]:
        matched = scope.get(MATCHED) or v2_routes.resolve(scope["path"])
        if matched is None:
            raise NotFound("Not Found")
        route, groups, (_label, method, handler) = matched
        if scope["method"] != method and scope["method"] not in method.split(", "):
            raise MethodNotAllowed(scope["method"], method)
        if handler is None:  # infer: one lookup gives the model and the telemetry's labels
            model = self.plane.ready_model(str(groups[0]), groups[1])
            scope[MODEL_LABELS] = self.plane.model_labels(model)
            return await self._infer(model, scope, receive, held, trace)
        if route is v2_routes.MODEL_ROUTE:  # labelled with the model, once it is found
            scope[MODEL_LABELS] = self.plane.labels(str(groups[0]), groups[1])
        request = V2Request(self.plane, scope, receive, held, groups, self.max_request_bytes,
                            self.body_timeout)  # fmt: skip
        return await handler(request)

    async def _infer(
        self,
        model: V2Model,
        scope: Scope,
        receive: Receive,
        held: Reservation,
        trace: TraceContext | None,
    ) -> tuple[int, Headers, Answer]:
        # what V2 clients send, or none (tritonclient); a browser's cross-site form types not
        check_content_type(scope, V2_TYPES, missing_ok=True)
        head = _headers(scope)
        declared = content_length(scope)
        if declared is not None and declared > self.max_request_bytes:
            raise PayloadTooLarge(too_large(f"of {declared} bytes (Content-Length) is",
                                            self.max_request_bytes))  # fmt: skip
        header_length = _header_length(head.get("inference-header-content-length"))
        coding = head.get("content-encoding", "")
        # small: nothing is reserved for the body, so it never waits behind large requests.
        # A compressed body may inflate far past its size: never small.
        small = declared is not None and declared <= INLINE_BODY_BYTES and not coding
        body = await read_body(receive, self.max_request_bytes, self.body_timeout,
                               None if small else held, declared)  # fmt: skip
        if trace is not None:
            trace.read()
            trace.traceparent = head.get("traceparent")
        accept = head.get("accept-encoding", "")
        wire = V2Wire(body, header_length, coding, accept, self.max_request_bytes,
                      self.plane.limits.max_json_items)  # fmt: skip
        return await self.plane.infer(model, wire.parse, wire.encode, held, len(body), small,
                                      until_gone(receive), trace)  # fmt: skip


class V2Wire:
    """One V2 body's parse and encode, for the data plane (bound to the body's headers)."""

    __slots__ = ("accept", "answer", "body", "coding", "header_length", "max_json_items",
                 "max_request_bytes")  # fmt: skip

    def __init__(self, body: bytes, header_length: int | None, coding: str, accept: str,
                 max_request_bytes: int, max_json_items: int) -> None:  # fmt: skip
        self.body, self.header_length, self.coding = body, header_length, coding
        # the coding the client accepts answers in (Accept-Encoding), if any
        self.accept, self.answer = accept, compression.accepted(accept) if accept else None
        self.max_request_bytes, self.max_json_items = max_request_bytes, max_json_items

    def parse(self, ctx: KernelContext) -> InferCall:
        # Inflating is bounded by the body limit as it goes; what it made is claimed after.
        body = compression.inflate(self.body, self.coding, self.max_request_bytes)
        if ctx.claims is not None:
            json_part = body if self.header_length is None else body[: self.header_length]
            ctx.claims.claim(json_body_memory(json_part, self.max_json_items)
                             + (len(body) if self.coding else 0))  # fmt: skip
        return parse_request(body, self.header_length)

    def encode(
        self, call: InferCall, result: InferResult, ctx: KernelContext
    ) -> tuple[int, Headers, Answer]:
        # compressed too, a large answer's JSON text is made a chunk at a time (streamed): one
        # orjson call over a whole 128 MB text held the GIL, and every other request, 0.3-2 s
        stream = ctx.inline_bytes is None
        content, json_length = encode_result(call, result, stream)
        headers = answer_headers(json_length)
        answer = self.answer
        if answer is not None and isinstance(content, bytes):  # a short one goes as it is
            answer = compression.answer_coding(self.accept, answer, len(content))
        if answer is not None:
            if _too_long_inline(content, ctx):
                raise RunOffLoop  # compressed on a thread instead, not run again (InferWork)
            claim = ctx.claims.claim if ctx.claims is not None else compression.unclaimed
            pieces = [content] if isinstance(content, bytes) else content.chunks
            packed = compression.deflate(pieces, answer, claim)
            content = b"".join(packed) if isinstance(content, bytes) else (
                Chunks(iter(packed), sum(map(len, packed))))  # fmt: skip
            headers.append((b"content-encoding", answer.encode()))
        return 200, headers, content


def _too_long_inline(content: Answer, ctx: KernelContext) -> bool:
    """Whether an answer made inline is too long to compress on the event loop (a binary
    answer over 1 MiB comes in parts even inline: its output may take the whole allowance)."""
    if ctx.inline_bytes is None:
        return False
    length = len(content) if isinstance(content, bytes) else content.length
    return length is None or length > compression.INLINE_COMPRESSED_BYTES


V2_STATUS = {InvalidInput: 400, ModelNotReady: 400, AlreadyExists: 400}
"""Where V2's status differs from the domain error's own (v1) one: Triton answers
INVALID_ARG and ALREADY_EXISTS with 400, and infer on a model that is not ready with 400."""


def v2_status(exc: ServiceError) -> int:
    """The HTTP status of a refusal on V2 (Triton's HttpCodeFromError)."""
    for kind in type(exc).__mro__:
        if kind in V2_STATUS:
            return V2_STATUS[kind]
    return exc.status_code


def _headers(scope: Scope) -> dict[str, str]:
    """The request's header fields by name; a field sent several times is one, its values
    joined with ", " as RFC 9110 (5.3) combines them (two Accept-Encoding lines are one list;
    two Inference-Header-Content-Length lines are no byte count)."""
    head: dict[str, str] = {}
    for name, value in scope["headers"]:
        key, text = name.decode("latin-1"), value.decode("latin-1")
        head[key] = f"{head[key]}, {text}" if key in head else text
    return head


def _header_length(value: str | None) -> int | None:
    if value is None:
        return None
    count = value.strip()
    if not (count.isascii() and count.isdigit() and len(count) < 19):  # "²".isdigit() is True
        raise BadRequest(f"Inference-Header-Content-Length {value[:30]!r} is not a byte count")
    return int(count)


def v2_shortcut(lane: V2Lane, app: ASGIApp, telemetry: Telemetry) -> ASGIApp:
    """An ASGI app that hands every `/v2` and `/v2/...` request to `lane`, the rest to `app`;
    telemetry (request id, access log, metrics) is recorded here, as for the operator lane,
    and a small infer call on an operator version is answered in one step (one_step.py), by
    its own work (v2_operator_call.py) rather than the data plane's general one."""
    one_step = OneStep(lane, telemetry, compresses=True, binary=True, output_format="v2_json")
    plane = lane.plane
    # each operator version's labels and work, made once (bounded: one_step_model gives only
    # the served versions)
    known: dict[
        OperatorModel, tuple[tuple[str, str, str], Callable[[bytes, int | None], Prepared]]
    ] = {}

    async def entry(scope: Scope, receive: Receive, send: Send) -> None:
        path = scope["path"] if scope["type"] == "http" else ""
        if path == PREFIX or path.startswith("/v2/"):
            # matched once: its label for telemetry, the rest for the lane (scope[MATCHED])
            scope[MATCHED] = matched = v2_routes.resolve(path)
            label = matched[2][0] if matched is not None else UNMATCHED
            infer = matched is not None and matched[2][2] is None and scope["method"] == "POST"
            call = one_step.small_call(scope) if infer else None
            if call is not None:
                assert matched is not None
                model = plane.one_step_model(str(matched[1][0]), matched[1][1])
                if model is not None:
                    found = known.get(model)
                    if found is None:
                        found = known[model] = _one_step_of(plane, model)
                    scope[MODEL_LABELS], prepare = found
                    await one_step(scope, receive, send, label, call, prepare)
                    return
            await observe(telemetry, lane, scope, receive, send, label)
            return
        await app(scope, receive, send)

    return entry


def _one_step_of(
    plane: DataPlane, model: OperatorModel
) -> tuple[tuple[str, str, str], Callable[[bytes, int | None], Prepared]]:
    """The telemetry labels of an operator version, and how a small call's work is made."""
    stats = plane.stats.of(model.name, str(model.version))

    def prepare(body: bytes, json_length: int | None) -> Prepared:
        return OperatorCall(model, body, json_length, plane.limits), stats

    return plane.model_labels(model), prepare


MATCHED = "opserve.v2_route"
"""The scope key of the V2 route a request's path matched (v2_routes.resolve)."""


def route_template(path: str) -> str:
    """The V2 route a path names, as a bounded label for logs and metrics."""
    return v2_routes.template(path) or UNMATCHED
