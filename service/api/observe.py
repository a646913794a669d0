"""The HTTP door's telemetry: every ASGI request run under `observe`, which counts its bytes in
and out, stamps `X-Request-ID` on the answer, and hands the request to the recorder
(service/telemetry/recorder.py) for its access-log line and metrics."""

import asyncio
import time

from starlette.routing import BaseRoute, Match
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service.telemetry.access_log import CLIENT_GONE
from service.telemetry.recorder import Telemetry
from service.telemetry.request_id import HEADER, request_id

UNMATCHED = "unmatched"  # the route label of a path no route matches


def observed(telemetry: Telemetry, app: ASGIApp, routes: list[BaseRoute]) -> ASGIApp:
    """`app` observed, its route label the path template of the route in `routes` that
    matched."""

    async def observed_app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await app(scope, receive, send)
        else:
            await observe(telemetry, app, scope, receive, send, None, routes)

    return observed_app


async def observe(telemetry: Telemetry, app: ASGIApp, scope: Scope, receive: Receive, send: Send,
                  route: str | None, routes: list[BaseRoute] | None = None) -> None:  # fmt: skip
    """Run `app` for this request and record it under `route` (None: the template of the route
    in `routes` that matched)."""
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
    telemetry.metrics.in_flight += 1
    telemetry.schedule()  # shares the in-flight count even if the request takes long
    try:
        await app(scope, receive, stamped_send)
    except asyncio.CancelledError:
        status = await cut_short(send, started=status != CLIENT_GONE)
    except BaseException:
        if status == CLIENT_GONE:
            status = 500  # what the server answers for an exception before a response
        raise
    finally:
        telemetry.metrics.in_flight -= 1
        seconds = time.perf_counter() - start
        telemetry.record(scope, rid, route or route_template(scope, routes or []), status,
                         seconds, bytes_in[0], bytes_out)  # fmt: skip
        telemetry.schedule()  # a flush that ran while the request was in flight missed it


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
