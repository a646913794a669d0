"""Send a large answer so that a client that does not read it holds up only itself.

The answer goes out in slices, each handed to the server only once the one before was taken
(uvicorn's flow control holds `send` while the socket's buffer is full); streamed chunks are
encoded on a kernel thread meanwhile. A client that takes nothing for `timeout` seconds loses
its answer (ClientStalled), so the memory the answer holds is freed.
"""

import asyncio
import logging

from starlette.types import Scope, Send

from service.codecs.wire import Chunks
from service.core.offload import Offloader
from service.errors import ServiceError
from service.telemetry.access_log import CLIENT_GONE

SLICE_BYTES = 4 * 1024 * 1024
"""Answers are sent in slices of this size at most, so a client that does not read holds up
the sender (uvicorn's flow control) instead of piling the whole answer in the socket buffer."""

Answer = bytes | Chunks
Headers = list[tuple[bytes, bytes]]
log = logging.getLogger("opserve")


class ClientStalled(Exception):
    """The client stopped reading its answer for longer than the send timeout."""


def refusal_headers(exc: ServiceError) -> Headers:
    """What a refusal adds to its headers: the connection closes where the body may be unread
    (408, 413, 503), and a 503 says when to retry."""
    headers: Headers = []
    if exc.status_code in (408, 413, 503):
        headers.append((b"connection", b"close"))
    retry = getattr(exc, "retry_after", None)  # Overloaded's, and the cluster store's
    if retry is not None:
        headers.append((b"retry-after", str(retry).encode()))
    return headers


async def send_answer(send: Send, scope: Scope, status: int, headers: Headers, content: Answer,
                      offloader: Offloader, timeout: float) -> int:  # fmt: skip
    """Send a whole response, a large body in slices; the status sent, or CLIENT_GONE when the
    client stopped reading (returning unfinished makes uvicorn close the connection)."""
    length = len(content) if isinstance(content, bytes) else content.length
    if length is not None:
        headers = [*headers, (b"content-length", str(length).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    if isinstance(content, bytes) and len(content) <= SLICE_BYTES:
        await send({"type": "http.response.body", "body": content})
        return status
    try:
        await send_large(send, content, offloader, timeout)
    except ClientStalled:
        log.warning("answer to %s abandoned: the client read nothing for %g s",
                    scope["path"], timeout)  # fmt: skip
        return CLIENT_GONE
    except (OSError, RuntimeError):  # uvloop: the transport closed under the send
        return CLIENT_GONE
    return status


async def send_large(send: Send, content: Answer, offloader: Offloader, timeout: float) -> None:
    """Send the body of an answer whose start was sent, in slices, within `timeout` each."""
    chunks = iter([content]) if isinstance(content, bytes) else content.chunks
    upcoming: asyncio.Future[bytes | memoryview | None] | None = offloader.next_on_thread(chunks)
    try:
        while (chunk := await upcoming) is not None:  # type: ignore[misc]
            upcoming = offloader.next_on_thread(chunks)
            for start in range(0, len(chunk), SLICE_BYTES):
                piece = chunk[start : start + SLICE_BYTES] if len(chunk) > SLICE_BYTES else chunk
                await _send_within(send, piece, True, timeout)
        upcoming = None
        await _send_within(send, b"", False, timeout)
    finally:
        if upcoming is not None:
            upcoming.cancel()


async def _send_within(send: Send, body: bytes | memoryview, more: bool, timeout: float) -> None:
    try:
        async with asyncio.timeout(timeout):
            await send({"type": "http.response.body", "body": body, "more_body": more})
    except TimeoutError:
        raise ClientStalled from None
