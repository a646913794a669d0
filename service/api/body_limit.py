"""Read request bodies within a size limit and a deadline, never buffering past either."""

import asyncio

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service.api.memory_budget import Reservation
from service.api.responses import dumps
from service.errors import PayloadTooLarge, RequestTimeout


class ClientGone(Exception):
    """The client disconnected before its body arrived: there is no one to answer."""


async def read_body(
    receive: Receive, max_bytes: int, timeout: float, held: Reservation | None = None
) -> bytes:
    """The whole request body: 413 as soon as it streams past `max_bytes`, 408 when it has not
    all arrived within `timeout` seconds (OPSERVE_BODY_TIMEOUT_SECONDS). With `held`, every
    chunk is reserved from the memory budget as it arrives, never before: a client that stalls
    holds only what it sent, and only until the deadline."""
    try:
        async with asyncio.timeout(timeout):
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
                if held is not None:
                    await held.grow(len(chunk))
                chunks.append(chunk)
                if not message.get("more_body", False):
                    break
    except TimeoutError:
        raise RequestTimeout(
            f"the request body did not arrive within {timeout:g} s "
            f"(OPSERVE_BODY_TIMEOUT_SECONDS); {size} bytes came"
        ) from None
    if len(chunks) == 1:
        return chunks[0]
    if held is not None:
        await held.grow(size)  # the joined copy, while the chunks still exist
    body = b"".join(chunks)
    del chunks
    if held is not None:
        held.shrink(size)
    return body


class BodyLimitMiddleware:
    """Pure ASGI (no per-request task or buffering): 413 on a Content-Length over the limit,
    and an error raised inside the endpoint's body read once the streamed bytes pass it."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = content_length(scope)
        if declared is not None and declared > self.max_bytes:
            await _send_413(send, self._message(f"of {declared} bytes (Content-Length) is"))
            return
        seen = 0

        async def limited_receive() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_bytes:
                    raise PayloadTooLarge(self._message("streamed in chunks went"))
            return message

        await self.app(scope, limited_receive, send)

    def _message(self, what: str) -> str:
        return too_large(what, self.max_bytes)


def too_large(what: str, max_bytes: int) -> str:
    """The 413 message for a body over the limit."""
    return f"request body {what} over the limit of {max_bytes} bytes (OPSERVE_MAX_REQUEST_BYTES)"


def content_length(scope: Scope) -> int | None:
    """The declared body size, None when the body is chunked (or the header is unreadable)."""
    for name, value in scope["headers"]:
        if name == b"content-length":
            return int(value) if value.isdigit() and len(value) < 19 else None
    return None


async def _send_413(send: Send, detail: str) -> None:
    body = dumps({"detail": detail, "errors": None})
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
               (b"connection", b"close")]  # fmt: skip
    await send({"type": "http.response.start", "status": 413, "headers": headers})
    await send({"type": "http.response.body", "body": body})
