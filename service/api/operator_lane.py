"""The operator routes as one raw ASGI app: the hot path of the service.

`OperatorLane` answers `/v1/ops/{op_type}/{version}` (GET describes, POST runs) and
`/v1/ops/{op_type}` (POST runs the newest). FastAPI routes those paths to it, so method
matching and the 405 answer stay FastAPI's; `operator_shortcut` also sends operator POSTs
to it straight from the entry pipeline, past Starlette's per-request middleware, routing
and Request objects, which cost more than a small operator call itself. Either way in,
the same code runs and errors render through the same functions as every other route.
"""

import logging
from functools import partial

from pydantic import ValidationError
from starlette.types import ASGIApp, Receive, Scope, Send

from service.api.access_log import CLIENT_GONE
from service.api.body_limit import content_length, too_large
from service.api.errors import service_error_content, unexpected_content, validation_error_content
from service.api.offload import Offloader
from service.api.responses import dumps
from service.api.telemetry import Telemetry
from service.codecs.limits import Limits
from service.errors import NotFound, PayloadTooLarge, ServiceError
from service.kernels.context import KernelContext
from service.operators import registry
from service.operators.catalog import describe
from service.operators.invoke import invoke
from service.operators.registry import OpVersion

PREFIX = "/v1/ops/"
_JSON = [(b"content-type", b"application/json")]
log = logging.getLogger("opserve")


class ClientGone(Exception):
    """The client disconnected before its body arrived: there is no one to answer."""


class OperatorLane:
    """GET describes and POST runs the operator version a `/v1/ops/...` path names."""

    def __init__(
        self, limits: Limits, max_output_bytes: int, max_request_bytes: int, offloader: Offloader
    ) -> None:
        self.limits = limits
        self.max_output_bytes = max_output_bytes
        self.max_request_bytes = max_request_bytes
        self.offloader = offloader

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self.serve(scope, receive, send)

    async def serve(self, scope: Scope, receive: Receive, send: Send) -> int:
        """Answer the request; the status sent (499 when the client left first)."""
        op: OpVersion | None = None
        try:
            op = resolve_path(scope["path"])
            if scope["method"] == "POST":
                declared = content_length(scope)
                if declared is not None and declared > self.max_request_bytes:
                    raise PayloadTooLarge(too_large(f"of {declared} bytes (Content-Length) is",
                                                    self.max_request_bytes))  # fmt: skip
                read = partial(read_body, receive, self.max_request_bytes)
                content = await self.offloader.run(read, declared, partial(self._run, op))
            else:
                content = dumps(describe(op).model_dump(mode="json"))
            status = 200
        except ClientGone:
            return CLIENT_GONE
        except ServiceError as exc:
            status, content = exc.status_code, dumps(service_error_content(exc, _name(op)))
        except ValidationError as exc:
            status, content = 422, dumps(validation_error_content(exc, _name(op)))
        except Exception:
            status, content = 500, dumps(unexpected_content(scope["method"], scope["path"]))
        headers = [*_JSON, (b"content-length", str(len(content)).encode())]
        if status == 413:  # the body may be unread: the connection cannot carry another request
            headers.append((b"connection", b"close"))
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": content})
        return status

    def _run(self, op: OpVersion, body: bytes, inline_bytes: int | None) -> bytes:
        ctx = KernelContext(self.max_output_bytes, inline_bytes)
        return dumps(invoke(op, body, self.limits, ctx))


def resolve_path(path: str) -> OpVersion:
    """The version a path names: `/v1/ops/Shape/17` is Shape-15, `/v1/ops/Shape` the newest."""
    op_type, _, version = path[len(PREFIX) :].partition("/")
    if not version:
        return registry.resolve(op_type)
    if not (version.isascii() and version.isdigit() and len(version) <= 9):
        raise NotFound(f"{op_type} has no version {version[:20]!r}: versions are opset numbers")
    return registry.resolve(op_type, int(version))


async def read_body(receive: Receive, max_bytes: int) -> bytes:
    """The whole request body, refused (413) as soon as it streams past `max_bytes`."""
    chunks = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientGone
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > max_bytes:
            raise PayloadTooLarge(too_large("streamed in chunks went", max_bytes))
        chunks.append(chunk)
        if not message.get("more_body", False):
            return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def operator_shortcut(lane: OperatorLane, app: ASGIApp, telemetry: Telemetry) -> ASGIApp:
    """An ASGI app that hands `POST /v1/ops/<op_type>[/<version>]` to `lane`, the rest to `app`.

    The lane enforces the body limit as it reads, and telemetry (request id, access log line,
    metrics) is recorded here, so operator requests pass through no middleware wrapper at all."""

    async def entry(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST":
            rest = scope["path"][len(PREFIX) :] if scope["path"].startswith(PREFIX) else ""
            if rest and rest.count("/") <= 1 and "" not in rest.split("/"):
                # the route's template for logs and metrics (a bounded label, not the path)
                route = "/v1/ops/{op_type}/{version}" if "/" in rest else "/v1/ops/{op_type}"
                await telemetry.observe(lane, scope, receive, send, route)
                return
        await app(scope, receive, send)

    return entry


def _name(op: OpVersion | None) -> str | None:
    return op.name if op else None
