"""The KServe V2 model routes as one raw ASGI app, in front of FastAPI like the operator lane.

`/v2/models/{name}[/versions/{v}]` (GET: metadata), `.../ready` (GET) and `.../infer` (POST)
are answered here, straight from the entry pipeline; FastAPI only documents them
(api/v2.py). Errors are `{"error": "<text>"}` with Triton's status codes: our 422 is
Triton's 400 (INVALID_ARG); 404, 413, 415 and 503 keep theirs (docs/v2.md).
"""

import re
from collections.abc import Callable
from functools import partial
from typing import Any

from pydantic import ValidationError
from starlette.types import ASGIApp, Receive, Scope, Send

from service.api.access_log import CLIENT_GONE
from service.api.body_limit import ClientGone, content_length, read_body, too_large
from service.api.errors import unexpected_content
from service.api.lane import Lane
from service.api.responses import dumps
from service.api.send_answer import Answer, refusal_headers, send_answer
from service.api.telemetry import UNMATCHED, Telemetry
from service.api.v2_codec import infer
from service.codecs import compression
from service.codecs.json_tensor import json_body_memory
from service.codecs.limits import Limits
from service.core.memory_budget import MemoryBudget, Reservation
from service.core.model import V2Model
from service.core.models import find_model
from service.core.offload import INLINE_BODY_BYTES, INLINE_OUTPUT_BYTES, Offloader
from service.errors import BadRequest, NotFound, PayloadTooLarge, ServiceError, UnsupportedMediaType
from service.kernels.context import KernelContext, RunOffLoop

PREFIX = "/v2/models/"
_PATH = re.compile(r"/v2/models/([^/]+)(?:/versions/([^/]+))?(?:/(infer|ready))?")
_METHODS = {None: "GET", "ready": "GET", "infer": "POST"}
# "Simple" cross-site requests a browser sends without asking: never run them.
_REFUSED_TYPES = ("application/x-www-form-urlencoded", "multipart/form-data", "text/plain")
Headers = list[tuple[bytes, bytes]]


class MethodNotAllowed(ServiceError):
    status_code = 405

    def __init__(self, method: str, allowed: str) -> None:
        super().__init__(f"{method} is not allowed here; use {allowed}")
        self.allowed = allowed


class V2Lane(Lane):
    """Answers the V2 model routes; `repository()` gives the model repository (or None).
    Large requests are held to the memory budget, body deadline and send timeout exactly as
    on the operator lane (operator_lane.py)."""

    def __init__(self, limits: Limits, max_output_bytes: int, max_request_bytes: int,
                 offloader: Offloader, repository: Callable[[], Any],
                 budget: MemoryBudget | None = None, body_timeout: float = 60.0,
                 send_timeout: float = 60.0, max_answer_bytes: int | None = None) -> None:  # fmt: skip
        super().__init__(limits, max_output_bytes, max_request_bytes, offloader, budget,
                         body_timeout, send_timeout, max_answer_bytes)  # fmt: skip
        self.repository = repository

    async def _serve(self, scope: Scope, receive: Receive, send: Send, held: Reservation) -> int:
        headers: Headers = [(b"content-type", b"application/json")]
        content: Answer
        try:
            status, headers, content = await self._answer(scope, receive, held)
        except ClientGone:
            return CLIENT_GONE
        except ServiceError as exc:
            # Triton answers INVALID_ARG with 400; our 422 is that.
            status = 400 if exc.status_code == 422 else exc.status_code
            content = dumps({"error": str(exc)})
            if isinstance(exc, MethodNotAllowed):
                headers.append((b"allow", exc.allowed.encode()))
            headers += refusal_headers(exc)
        except ValidationError as exc:
            status, content = 400, dumps({"error": str(exc.errors()[0]["msg"])})
        except Exception:
            detail = unexpected_content(scope["method"], scope["path"])["detail"]
            status, content = 500, dumps({"error": detail})
        return await send_answer(send, scope, status, headers, content, self.offloader,
                                 self.send_timeout)  # fmt: skip

    async def _answer(
        self, scope: Scope, receive: Receive, held: Reservation
    ) -> tuple[int, Headers, Answer]:
        match = _PATH.fullmatch(scope["path"])
        if match is None:
            raise NotFound(f"no V2 route {scope['path'][:100]!r}")
        name, version, action = match.groups()
        if scope["method"] != _METHODS[action]:
            raise MethodNotAllowed(scope["method"], _METHODS[action])
        model = find_model(name, version, self.repository())
        json_type = [(b"content-type", b"application/json")]
        if action is None:
            return 200, json_type, dumps(model.metadata())
        if action == "ready":
            return (200 if model.ready else 400), [], b""
        return await self._infer(model, scope, receive, held)

    async def _infer(
        self, model: V2Model, scope: Scope, receive: Receive, held: Reservation
    ) -> tuple[int, Headers, Answer]:
        head = _headers(scope)
        content_type = head.get("content-type", "").split(";")[0].strip().lower()
        if content_type in _REFUSED_TYPES:
            raise UnsupportedMediaType(f"Content-Type {content_type} is not accepted; send "
                                       "application/json, application/octet-stream or none")  # fmt: skip
        declared = content_length(scope)
        if declared is not None and declared > self.max_request_bytes:
            raise PayloadTooLarge(too_large(f"of {declared} bytes (Content-Length) is",
                                            self.max_request_bytes))  # fmt: skip
        header_length = _header_length(head.get("inference-header-content-length"))
        coding = head.get("content-encoding", "")
        answer = compression.accepted(head.get("accept-encoding", ""))
        work = partial(self._run, model, header_length, coding, answer)
        # A compressed body may inflate far past its size: never inline.
        if declared is not None and declared <= INLINE_BODY_BYTES and not coding:
            # small: nothing is reserved, so it never waits behind large requests
            body = await read_body(receive, self.max_request_bytes, self.body_timeout)
            try:
                return work(body, INLINE_OUTPUT_BYTES, None)
            except RunOffLoop:  # the output is large: start again on a thread, budgeted
                await held.grow(len(body))
        else:
            body = await read_body(receive, self.max_request_bytes, self.body_timeout, held)
        return await held.run(lambda: self.offloader.on_thread(work, body, None, held))

    def _run(self, model: V2Model, header_length: int | None, coding: str, answer: str | None,
             body: bytes, inline_bytes: int | None,
             held: Reservation | None) -> tuple[int, Headers, Answer]:  # fmt: skip
        # Inflating is bounded by the body limit as it goes; what it made is claimed after.
        body = compression.inflate(body, coding, self.max_request_bytes)
        if held is not None:
            json_part = body if header_length is None else body[:header_length]
            held.claim(json_body_memory(json_part) + (len(body) if coding else 0))
        ctx = KernelContext(self.max_output_bytes, inline_bytes,
                            max_answer_bytes=self.max_answer_bytes,
                            claim=held.claim if held is not None else None)  # fmt: skip
        content, json_length = infer(model, body, header_length, self.limits, ctx)
        headers: Headers = [(b"content-type", b"application/json")]
        if json_length is not None:
            headers = [(b"content-type", b"application/octet-stream"),
                       (b"inference-header-content-length", str(json_length).encode())]  # fmt: skip
        if answer is not None:
            if held is not None and not isinstance(content, bytes):
                held.claim(2 * (content.length or 0))  # the joined answer and its compressed copy
            whole = content if isinstance(content, bytes) else b"".join(content.chunks)
            content = compression.deflate(whole, answer)
            headers.append((b"content-encoding", answer.encode()))
        return 200, headers, content


def _headers(scope: Scope) -> dict[str, str]:
    return {name.decode("latin-1"): value.decode("latin-1") for name, value in scope["headers"]}


def _header_length(value: str | None) -> int | None:
    if value is None:
        return None
    count = value.strip()
    if not (count.isascii() and count.isdigit() and len(count) < 19):  # "²".isdigit() is True
        raise BadRequest(f"Inference-Header-Content-Length {value[:30]!r} is not a byte count")
    return int(count)


def v2_shortcut(lane: V2Lane, app: ASGIApp, telemetry: Telemetry) -> ASGIApp:
    """An ASGI app that hands every `/v2/models[/...]` request to `lane`, the rest to `app`;
    telemetry (request id, access log, metrics) is recorded here, as for the operator lane."""

    async def entry(scope: Scope, receive: Receive, send: Send) -> None:
        path = scope["path"] if scope["type"] == "http" else ""
        if path.startswith(PREFIX) or path == PREFIX[:-1]:  # /v2/models: a V2 error too
            await telemetry.observe(lane, scope, receive, send, route_template(path))
            return
        await app(scope, receive, send)

    return entry


def route_template(path: str) -> str:
    """The V2 route a path names, as a bounded label for logs and metrics."""
    found = _PATH.fullmatch(path)
    if found is None:
        return UNMATCHED
    _name, version, action = found.groups()
    versioned = "/versions/{version}" if version is not None else ""
    return f"/v2/models/{{name}}{versioned}{f'/{action}' if action else ''}"
