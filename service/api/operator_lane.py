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

from service.api.body_limit import content_length
from service.api.errors import service_error_content, unexpected_content, validation_error_content
from service.api.offload import Offloader
from service.api.responses import dumps
from service.codecs.limits import Limits
from service.errors import NotFound, ServiceError
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

    def __init__(self, limits: Limits, max_output_bytes: int, offloader: Offloader) -> None:
        self.limits = limits
        self.max_output_bytes = max_output_bytes
        self.offloader = offloader

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        op: OpVersion | None = None
        try:
            op = resolve_path(scope["path"])
            if scope["method"] == "POST":
                read = partial(read_body, receive)
                work = partial(self._run, op)
                content = await self.offloader.run(read, content_length(scope), work)
            else:
                content = dumps(describe(op).model_dump(mode="json"))
            status = 200
        except ClientGone:
            return
        except ServiceError as exc:
            status, content = exc.status_code, dumps(service_error_content(exc, _name(op)))
        except ValidationError as exc:
            status, content = 422, dumps(validation_error_content(exc, _name(op)))
        except Exception:
            status, content = 500, dumps(unexpected_content(scope["method"], scope["path"]))
        headers = [*_JSON, (b"content-length", str(len(content)).encode())]
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": content})

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


async def read_body(receive: Receive) -> bytes:
    """The whole request body (the body limit middleware bounds it as it streams in)."""
    chunks = []
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientGone
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            return b"".join(chunks)


def operator_shortcut(lane: OperatorLane, app: ASGIApp) -> ASGIApp:
    """An ASGI app that hands `POST /v1/ops/<op_type>[/<version>]` to `lane`, the rest to `app`."""

    async def entry(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST":
            rest = scope["path"][len(PREFIX) :] if scope["path"].startswith(PREFIX) else ""
            if rest and rest.count("/") <= 1 and "" not in rest.split("/"):
                await lane(scope, receive, send)
                return
        await app(scope, receive, send)

    return entry


def _name(op: OpVersion | None) -> str | None:
    return op.name if op else None
