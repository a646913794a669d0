"""What the entry pipeline records of every request: its id, its log line and its metrics.

`Telemetry.observe(app, scope, receive, send, route)` runs any lane's ASGI app for one request,
counting the bytes in and out, stamping `X-Request-ID` on the answer, and then records one
access-log line and the metrics under (route template, model, operator, version, status).
Every label comes from a bounded set, so no client can blow up the metrics' cardinality: route
templates from the route table (never raw paths), models, operators and versions only once
the service has found them (served operators, repository models).
"""

import asyncio
import atexit
import time
from functools import lru_cache

from starlette.routing import BaseRoute, Match
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service.api.access_log import CLIENT_GONE, AccessLog
from service.api.metrics import Metrics
from service.api.request_id import HEADER, request_id
from service.errors import ServiceError
from service.operators import registry

FLUSH_SECONDS = 0.05
"""The access log's buffered lines are written this long after a request at most."""
SHARE_SECONDS = 0.5
"""This worker's metric totals reach the other workers (metrics.py) this long after a request
at most: a file written and renamed 20 times a second cost 2% of a small request's time."""
OPS_PREFIX = "/v1/ops/"
UNMATCHED = "unmatched"  # the route label of a path no route matches
UNKNOWN = ("unknown", "unknown")
MAX_LABELLED_PATH = 128  # longer /v1/ops paths are labelled unknown without a lookup
MODEL_LABELS = "opserve.model"
"""The scope key where a lane puts (model, operator, version) of the model a request ran on:
only names the service resolved, so the labels stay bounded."""
_NO_MODEL = ("", "", "")
_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "GRPC"})


class Telemetry:
    """The access log (when on) and the metrics of one worker, flushed every 50 ms."""

    def __init__(self, log: AccessLog | None, metrics: Metrics) -> None:
        self.log = log
        self.metrics = metrics
        self.flush_pending = self.share_pending = False
        self.routes: list[BaseRoute] = []
        atexit.register(self.flush)  # lines and totals still buffered when the server stops

    def middleware(self, app: ASGIApp, routes: list[BaseRoute]) -> ASGIApp:
        """`app` observed, its route label the path template of the route in `routes` that
        matched."""
        self.routes = routes

        async def observed(scope: Scope, receive: Receive, send: Send) -> None:
            if scope["type"] != "http":
                await app(scope, receive, send)
            else:
                await self.observe(app, scope, receive, send, None)

        return observed

    async def observe(self, app: ASGIApp, scope: Scope, receive: Receive, send: Send,
                      route: str | None) -> None:  # fmt: skip
        """Run `app` for this request and record it under `route` (None: the matched route's)."""
        sent_id = declared = None
        for name, value in scope["headers"]:
            if name == b"content-length":
                declared = value
            elif name == HEADER:
                sent_id = value
        rid = request_id(sent_id)
        start = time.perf_counter()
        status = CLIENT_GONE  # the app returned without answering: the client went away
        bytes_out = 0

        async def stamped_send(message: Message) -> None:
            nonlocal status, bytes_out
            if message["type"] == "http.response.start":
                status = message["status"]
                message["headers"] = [*message.get("headers", ()), (HEADER, rid)]
            else:
                bytes_out += len(message.get("body", b""))
            await send(message)

        # body bytes: as declared, or as read for a chunked body (a wrapper on every read costs)
        bytes_in = [int(declared)] if declared is not None and declared.isdigit() else [0]
        if declared is None:
            receive = _counting(receive, bytes_in)
        self.metrics.in_flight += 1
        self.schedule()  # shares the in-flight count even if the request takes long
        try:
            await app(scope, receive, stamped_send)
        except asyncio.CancelledError:
            status = await cut_short(send, started=status != CLIENT_GONE)
        except BaseException:
            if status == CLIENT_GONE:
                status = 500  # what the server answers for an exception before a response
            raise
        finally:
            self.metrics.in_flight -= 1
            seconds = time.perf_counter() - start
            self.record(scope, rid, route, status, seconds, bytes_in[0], bytes_out)
            self.schedule()  # a flush that ran while the request was in flight missed it

    def record(self, scope: Scope, rid: bytes, route: str | None, status: int, seconds: float,
               bytes_in: int, bytes_out: int) -> None:  # fmt: skip
        """Log and count one request."""
        route = route or route_template(scope, self.routes)
        if route.startswith(OPS_PREFIX):
            operator, version = operator_labels(scope["path"])
            model = operator
        else:  # what a lane found the request was for (MODEL_LABELS), else nothing
            model, operator, version = scope.get(MODEL_LABELS, _NO_MODEL)
        method = scope["method"] if scope["method"] in _METHODS else "other"
        self.metrics.record((route, method, model, operator, version, status), seconds,
                            bytes_in, bytes_out)  # fmt: skip
        if self.log is not None and self.log.record(scope, rid, route, model, operator, version,
                                                    status, seconds, bytes_in, bytes_out):  # fmt: skip
            self.log.flush()

    def started(self) -> None:
        """Count a call that is not an ASGI request (gRPC) in flight until `finished`."""
        self.metrics.in_flight += 1
        self.schedule()

    def finished(self, scope: Scope, rid: bytes, route: str, status: int, seconds: float,
                 bytes_in: int, bytes_out: int) -> None:  # fmt: skip
        """Record a call counted by `started`; `scope` holds what the log line shows (client,
        path, method) and MODEL_LABELS."""
        self.metrics.in_flight -= 1
        self.record(scope, rid, route, status, seconds, bytes_in, bytes_out)
        self.schedule()

    def schedule(self) -> None:
        """Flush (and share the totals) soon: a request started or ended."""
        if not self.flush_pending:
            self.flush_pending = True
            loop = asyncio.get_running_loop()
            loop.call_later(FLUSH_SECONDS, self._flush_log)
            if not self.share_pending:
                self.share_pending = True
                loop.call_later(SHARE_SECONDS, self._share)

    def _flush_log(self) -> None:
        self.flush_pending = False
        if self.log is not None:
            self.log.flush()

    def _share(self) -> None:
        self.share_pending = False
        self.metrics.share()

    def flush(self) -> None:
        """Write the buffered log lines and this worker's metric totals now."""
        self._flush_log()
        self.metrics.flush()


async def cut_short(send: Send, started: bool) -> int:
    """uvicorn cancels the requests still running when the shutdown's grace period ends: cut
    short, not failed (499 in the log), answered 503 if nothing was sent yet, and no traceback
    from uvicorn. The status to record."""
    if not started:
        await _refuse_shutting_down(send)
    return CLIENT_GONE


async def _refuse_shutting_down(send: Send) -> None:
    """A 503 for a request cut short by shutdown (the connection closes after it)."""
    body = b'{"detail":"the server is shutting down; retry"}'
    headers = [(b"content-type", b"application/json"), (b"connection", b"close"),
               (b"content-length", b"%d" % len(body)), (b"retry-after", b"1")]  # fmt: skip
    try:
        await send({"type": "http.response.start", "status": 503, "headers": headers})
        await send({"type": "http.response.body", "body": body})
    except Exception:  # the connection is already gone
        pass


def _counting(receive: Receive, total: list[int]) -> Receive:
    """`receive`, adding the body bytes it reads to `total[0]`."""

    async def counted() -> Message:
        message = await receive()
        total[0] += len(message.get("body", b""))
        return message

    return counted


def route_template(scope: Scope, routes: list[BaseRoute]) -> str:
    """The path template of the route that answered (`/v1/ops/{op_type}/{version}`)."""
    route = scope.get("route")  # FastAPI's routes name themselves
    if route is None and "path_params" in scope:
        # A plain route or a mount matched: find it again (only their rare requests pay this).
        probe = {"type": "http", "path": scope["path"], "root_path": "", "method": scope["method"]}
        route = next((r for r in routes if r.matches(probe)[0] is not Match.NONE), None)
    return getattr(route, "path", None) or UNMATCHED


def operator_labels(path: str) -> tuple[str, str]:
    """The operator and schema version a `/v1/ops/...` path runs, or ("unknown", "unknown")."""
    if len(path) > MAX_LABELLED_PATH:  # no operator has so long a name: keep it out of the cache
        return UNKNOWN
    return _operator_labels(path)


@lru_cache(maxsize=1024)  # bounded: a client sending new paths only evicts old entries
def _operator_labels(path: str) -> tuple[str, str]:
    op_type, _, version = path[len(OPS_PREFIX) :].partition("/")
    if version and not (version.isascii() and version.isdigit() and len(version) <= 9):
        return UNKNOWN
    try:
        op = registry.resolve(op_type, int(version) if version else None)
    except ServiceError:
        return UNKNOWN
    return op.op_type, str(op.since_version)
