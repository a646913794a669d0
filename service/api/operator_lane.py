"""The operator routes as one raw ASGI app: the hot path of the service.

`OperatorLane` answers `/v1/ops/{op_type}/{version}` (GET describes, POST runs) and
`/v1/ops/{op_type}` (POST runs the newest). FastAPI routes those paths to it, so method
matching and the 405 answer stay FastAPI's; `operator_shortcut` also sends operator POSTs
to it straight from the entry pipeline, past Starlette's per-request middleware, routing
and Request objects, which cost more than a small operator call itself. Either way in,
the same code runs and errors render through the same functions as every other route.
"""

import asyncio
from time import perf_counter, perf_counter_ns

from pydantic import ValidationError
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service.api.access_log import CLIENT_GONE
from service.api.body_limit import ClientGone, content_length, read_body, too_large
from service.api.content_type import JSON, check_content_type
from service.api.errors import service_error_content, unexpected_content, validation_error_content
from service.api.lane import Guards, Lane
from service.api.request_id import HEADER as REQUEST_ID
from service.api.request_id import request_id
from service.api.responses import dumps
from service.api.send_answer import SLICE_BYTES, Answer, refusal_headers, send_answer
from service.api.telemetry import MAX_LABELLED_PATH, Telemetry, cut_short
from service.codecs.json_tensor import json_body_memory
from service.codecs.limits import Limits
from service.codecs.wire import encode_answer
from service.core.execution import Execution
from service.core.memory_budget import MemoryBudget, Reservation
from service.core.offload import INLINE_BODY_BYTES
from service.core.statistics import Statistics, Timings
from service.errors import NotFound, PayloadTooLarge, RunCancelled, ServiceError
from service.kernels.context import KernelContext
from service.operators import registry
from service.operators.catalog import describe
from service.operators.invoke import invoke
from service.operators.registry import OpVersion

PREFIX = "/v1/ops/"
_JSON = [(b"content-type", b"application/json")]

__all__ = ["ClientGone", "OperatorLane", "operator_shortcut", "read_body", "resolve_path"]


class OperatorLane(Lane):
    """GET describes and POST runs the operator version a `/v1/ops/...` path names."""

    def __init__(self, execution: Execution, budget: MemoryBudget, guards: Guards,
                 limits: Limits, statistics: Statistics) -> None:  # fmt: skip
        super().__init__(execution, budget, guards)
        self.limits = limits
        self.statistics = statistics  # the data plane's: v1 calls count for their V2 model

    async def _serve(self, scope: Scope, receive: Receive, send: Send, held: Reservation) -> int:
        op: OpVersion | None = None
        headers = list(_JSON)
        try:
            op = resolve_path(scope["path"])
            if scope["method"] == "POST":
                content = await self._post(op, scope, receive, held)
            else:
                content = dumps(describe(op).model_dump(mode="json"))
            status = 200
        except (ClientGone, RunCancelled):
            return CLIENT_GONE
        except ServiceError as exc:
            status, content = exc.status_code, dumps(service_error_content(exc, _name(op)))
            headers += refusal_headers(exc)
        except ValidationError as exc:
            status, content = 422, dumps(validation_error_content(exc, _name(op)))
        except Exception:
            status, content = 500, dumps(unexpected_content(scope["method"], scope["path"]))
        return await send_answer(send, scope, status, headers, content, self.offloader,
                                 self.send_timeout)  # fmt: skip

    async def _post(
        self, op: OpVersion, scope: Scope, receive: Receive, held: Reservation
    ) -> Answer:
        check_content_type(scope, JSON)
        declared = content_length(scope)
        if declared is not None and declared > self.max_request_bytes:
            raise PayloadTooLarge(too_large(f"of {declared} bytes (Content-Length) is",
                                            self.max_request_bytes))  # fmt: skip
        # small: nothing is reserved for the body, so it never waits behind large requests
        small = declared is not None and declared <= INLINE_BODY_BYTES
        body = await read_body(receive, self.max_request_bytes, self.body_timeout,
                               None if small else held, declared)  # fmt: skip
        stats = self.statistics.of(op.op_type, str(op.since_version))
        # no client watch: one kernel, bounded by the output limit, has no point to stop at
        return await self.execution.run(OperatorWork(op, body, self.limits), held, small, stats)


class OperatorWork:
    """One v1 operator call as execution.py's Work: validate, decode, run, encode."""

    __slots__ = ("body", "limits", "op", "timings")

    def __init__(self, op: OpVersion, body: bytes, limits: Limits) -> None:
        self.op, self.body, self.limits = op, body, limits
        self.timings = Timings()

    @property
    def holding(self) -> int:
        return len(self.body)

    def __call__(self, ctx: KernelContext) -> Answer:
        # One step from body to answer: its whole time counts as compute_infer (docs/v2.md).
        self.timings.started = start = perf_counter_ns()
        if ctx.claims is None:
            answer: Answer = dumps(invoke(self.op, self.body, self.limits, ctx))
        else:
            ctx.claims.claim(json_body_memory(self.body))  # what parsing and decoding hold
            answer = encode_answer(invoke(self.op, self.body, self.limits, ctx, stream=True), dumps)
        self.timings.compute_infer = perf_counter_ns() - start
        return answer


def resolve_path(path: str) -> OpVersion:
    """The version a path names: `/v1/ops/Shape/17` is Shape-15, `/v1/ops/Shape` the newest."""
    op_type, _, version = path[len(PREFIX) :].partition("/")
    if not version:
        return registry.resolve(op_type)
    if not (version.isascii() and version.isdigit() and len(version) <= 9):
        raise NotFound(f"{op_type} has no version {version[:20]!r}: versions are opset numbers")
    return registry.resolve(op_type, int(version))


def operator_shortcut(lane: OperatorLane, app: ASGIApp, telemetry: Telemetry) -> ASGIApp:
    """An ASGI app that hands `POST /v1/ops/<op_type>[/<version>]` to `lane`, the rest to `app`.

    The lane enforces the body limit as it reads, and telemetry (request id, access log line,
    metrics) is recorded here, so operator requests pass through no middleware wrapper at all;
    a small call of a served version is answered in one step (OneStep)."""
    one_step = OneStep(lane, telemetry)

    async def entry(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST":
            op = one_step.served(scope["path"])
            if op is not None:
                await one_step(op, scope, receive, send)
                return
            rest = scope["path"][len(PREFIX) :] if scope["path"].startswith(PREFIX) else ""
            if rest and rest.count("/") <= 1 and "" not in rest.split("/"):
                await telemetry.observe(lane, scope, receive, send, route_label(rest))
                return
        await app(scope, receive, send)

    return entry


def route_label(rest: str) -> str:
    """The route's template for logs and metrics (a bounded label, not the path)."""
    return "/v1/ops/{op_type}/{version}" if "/" in rest else "/v1/ops/{op_type}"


class OneStep:
    """The most common call, a small JSON POST to a served version that succeeds, answered in
    one step: one scan of the headers, the body read under its deadline, the work run inline,
    the answer sent with its request id, and its telemetry and statistics recorded by the
    same functions the general path uses. It leaves out only the general path's layers (the
    telemetry wrapper around `send`, the lane's reservation and error handling, the execution's
    thread logic): together they cost a small call more than its kernel. Anything else (another
    Content-Type, no length or a large one, any refusal or failure, an output for a kernel
    thread, a large answer) is handed to the general path before anything is sent, with the body
    (or the read's failure) replayed, so the general path stays the one place for every
    refusal, thread hop and error text."""

    MAX_PATHS = 1024  # paths of served versions remembered (bounded: cleared when full)

    def __init__(self, lane: OperatorLane, telemetry: Telemetry) -> None:
        self.lane, self.telemetry = lane, telemetry
        self.max_body = min(INLINE_BODY_BYTES, lane.max_request_bytes)
        self.ops: dict[str, tuple[OpVersion, str]] = {}

    def served(self, path: str) -> tuple[OpVersion, str] | None:
        """The version a `/v1/ops/...` path runs and its route label; None for any other path."""
        found = self.ops.get(path)
        if found is None and path.startswith(PREFIX) and len(path) <= MAX_LABELLED_PATH:
            rest = path[len(PREFIX) :]
            if rest and rest.count("/") <= 1 and "" not in rest.split("/"):
                try:
                    found = (resolve_path(path), route_label(rest))
                except ServiceError:
                    return None  # the general path answers it (404)
                if len(self.ops) >= self.MAX_PATHS:
                    self.ops.clear()
                self.ops[path] = found
        return found

    async def __call__(self, served: tuple[OpVersion, str], scope: Scope, receive: Receive,
                       send: Send) -> None:  # fmt: skip
        op, route = served
        declared = media = sent_id = None
        for name, value in scope["headers"]:  # the first length and type, as the lane reads
            if name == b"content-length" and declared is None:
                declared = value
            elif name == b"content-type" and media is None:
                media = value
            elif name == REQUEST_ID:  # the last, as telemetry reads it
                sent_id = value
        length = int(declared) if declared is not None and declared.isdigit() else None
        if media != b"application/json" or length is None or length > self.max_body:
            await self.telemetry.observe(self.lane, scope, receive, send, route)
            return
        telemetry, lane = self.telemetry, self.lane
        rid = request_id(sent_id)
        start = perf_counter()
        telemetry.metrics.in_flight += 1
        telemetry.schedule()
        replay: Receive | None = None
        content = b""
        status, started = CLIENT_GONE, False
        try:
            try:
                body = await read_body(receive, lane.max_request_bytes, lane.body_timeout, None,
                                       length)  # fmt: skip
            except (ServiceError, ClientGone) as failed:
                replay = _replayed(receive, None, failed)
            else:
                stats = lane.statistics.of(op.op_type, str(op.since_version))
                arrived = perf_counter_ns()
                work = OperatorWork(op, body, lane.limits)
                try:
                    answer: Answer | None = work(lane.execution.inline)
                except Exception:  # a refusal, an output for a thread, a bug
                    answer = None
                if isinstance(answer, bytes) and len(answer) <= SLICE_BYTES:
                    content = answer
                else:  # refused, failed, or an answer sent in slices: the general path's
                    replay = _replayed(receive, body, None)
            if replay is None:
                stats.succeeded(arrived, work.timings)
                headers = [*_JSON, (b"content-length", b"%d" % len(content)), (REQUEST_ID, rid)]
                started = True
                await send({"type": "http.response.start", "status": 200, "headers": headers})
                await send({"type": "http.response.body", "body": content})
                status = 200
        except asyncio.CancelledError:  # shutdown's grace period is over (as telemetry.observe)
            status = await cut_short(send, started)
        finally:
            telemetry.metrics.in_flight -= 1
        if replay is not None:  # the general path answers, observed as any request
            await telemetry.observe(lane, scope, replay, send, route)
            return
        sent = len(content) if status == 200 else 0
        telemetry.record(scope, rid, route, status, perf_counter() - start, length, sent)
        telemetry.schedule()


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


def _name(op: OpVersion | None) -> str | None:
    return op.name if op else None
