"""The operator routes as one raw ASGI app: the hot path of the service.

`OperatorLane` answers `/v1/ops/{op_type}/{version}` (GET describes, POST runs) and
`/v1/ops/{op_type}` (POST runs the newest). FastAPI routes those paths to it, so method
matching and the 405 answer stay FastAPI's; `operator_shortcut` also sends operator POSTs
to it straight from the entry pipeline, past Starlette's per-request middleware, routing
and Request objects, which cost more than a small operator call itself. Either way in,
the same code runs and errors render through the same functions as every other route.
"""

from time import perf_counter_ns

from pydantic import ValidationError
from starlette.types import ASGIApp, Receive, Scope, Send

from service.api.body_limit import ClientGone, content_length, read_body, too_large
from service.api.content_type import JSON, check_content_type
from service.api.errors import service_error_content, unexpected_content, validation_error_content
from service.api.lane import Guards, Lane
from service.api.observe import observe
from service.api.one_step import OneStep, Prepared
from service.api.responses import dumps
from service.api.send_answer import Answer, refusal_headers, send_answer
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
from service.telemetry.access_log import CLIENT_GONE
from service.telemetry.recorder import MAX_LABELLED_PATH, Telemetry

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
        # no client watch: one kernel, bounded by the output limit, has no point to stop at
        work, stats = self.work(op, body)
        return await self.execution.run(work, held, small, stats)

    def work(self, op: OpVersion, body: bytes) -> Prepared:
        """The call's work and the statistics it counts in (its version's, as on V2)."""
        return OperatorWork(op, body, self.limits), self.statistics.of(op.op_type, op.version_label)


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
            # what parsing and decoding hold, and no more values than the parse may take
            ctx.claims.claim(json_body_memory(self.body, self.limits.max_json_items))
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
    a small call of a served version is answered in one step (one_step.py)."""
    one_step = OneStep(lane, telemetry, compresses=False)
    served = ServedPaths()

    async def entry(scope: Scope, receive: Receive, send: Send) -> None:
        # every other path (V2's first) passes on after one prefix test
        if (
            scope["type"] == "http"
            and scope["method"] == "POST"
            and scope["path"].startswith(PREFIX)
        ):
            found = served.get(scope["path"])
            if found is not None:
                op, route = found
                call = one_step.small_call(scope)
                if call is None:
                    await observe(telemetry, lane, scope, receive, send, route)
                else:
                    await one_step(scope, receive, send, route, call,
                                   lambda body, _json_length: lane.work(op, body))  # fmt: skip
                return
            other = operator_route(scope["path"])
            if other is not None:  # not a served version: the lane answers it (404)
                await observe(telemetry, lane, scope, receive, send, other)
                return
        await app(scope, receive, send)

    return entry


class ServedPaths:
    """The version each `/v1/ops/...` path of a served version runs, and its route label, found
    once per path (at most MAX_PATHS remembered: cleared when full)."""

    MAX_PATHS = 1024

    def __init__(self) -> None:
        self.ops: dict[str, tuple[OpVersion, str]] = {}

    def get(self, path: str) -> tuple[OpVersion, str] | None:
        """None for a path that names no served version (the general path answers it)."""
        found = self.ops.get(path)
        if found is None and len(path) <= MAX_LABELLED_PATH:
            route = operator_route(path)
            if route is None:
                return None
            try:
                found = (resolve_path(path), route)
            except ServiceError:
                return None
            if len(self.ops) >= self.MAX_PATHS:
                self.ops.clear()
            self.ops[path] = found
        return found


def operator_route(path: str) -> str | None:
    """The route template of a `/v1/ops/<op_type>[/<version>]` path, for logs and metrics (a
    bounded label, not the path); None for any other path."""
    rest = path[len(PREFIX) :] if path.startswith(PREFIX) else ""
    if not rest or rest.count("/") > 1 or "" in rest.split("/"):
        return None
    return "/v1/ops/{op_type}/{version}" if "/" in rest else "/v1/ops/{op_type}"


def _name(op: OpVersion | None) -> str | None:
    return op.name if op else None
