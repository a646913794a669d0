"""Read request bodies within a size limit and a deadline, never buffering past either."""

import asyncio
import mmap
import os
from collections.abc import Generator
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service.api.responses import dumps
from service.core.deadlines import DEADLINES, body_timeout
from service.core.memory_budget import Reservation
from service.errors import BadRequest, PayloadTooLarge


class ClientGone(Exception):
    """The client disconnected before its body arrived: there is no one to answer."""


MAPPED_BODY_BYTES = 1024 * 1024
"""A body declared at least this long is gathered in an anonymous memory map as it arrives."""


class _Mapped:
    """A body's chunks copied, as they arrive, into a memory map of its declared length: its
    pages become resident only as they are written, and go back to the system when it is
    closed. Kept as separate chunks for seconds, many large bodies arriving at once left the
    heap in holes no later allocation could use (RSS 1.8x the budget's share). Off Linux only:
    there the whole body is copied out of the map on the event loop (`joined`)."""

    def __init__(self, length: int) -> None:
        self.mapped = mmap.mmap(-1, length)
        self.size = 0

    def append(self, chunk: bytes) -> None:
        end = self.size + len(chunk)
        if end > len(self.mapped):
            raise BadRequest("the request body is longer than its Content-Length")
        self.mapped[self.size : end] = chunk
        self.size = end

    async def joined(self) -> bytes:
        return self.mapped[: self.size]

    def close(self) -> None:
        self.mapped.close()


class _MemoryFile:
    """A body's chunks written, as they arrive, into an anonymous memory file (memfd): as a
    memory map, its pages become resident only as they are written and go back when it is
    closed. The whole body is then read out of it by one `pread` on a thread, where the kernel
    copies it, and faults in the new bytes' pages, with the GIL released. Copied out of a
    memory map (a slice: one memcpy and its page faults under the GIL), a 64 MB body held the
    event loop, and every other client's request, 60-88 ms; 16 bodies of 8 MiB ending together
    149-268 ms (docs/api.md, "Known gaps"). Its pages are charged to the process's memory
    cgroup as a map's are, but are not in its RSS (they are never mapped): a reader of the
    process's RSS sees a body only once it is read out."""

    def __init__(self, length: int) -> None:
        self.fd = os.memfd_create("opserve-body", os.MFD_CLOEXEC)
        self.length = length
        self.size = 0

    def append(self, chunk: bytes) -> None:
        end = self.size + len(chunk)
        if end > self.length:
            raise BadRequest("the request body is longer than its Content-Length")
        written = 0
        while written < len(chunk):  # a memory file takes it whole; the loop is for form
            written += os.pwrite(self.fd, memoryview(chunk)[written:], self.size + written)
        self.size = end

    async def joined(self) -> bytes:
        # the thread owns the file from here, and closes it: a request cancelled meanwhile
        # must not close a descriptor that the read still uses (or that is then reused)
        fd, self.fd = self.fd, -1
        return await asyncio.to_thread(_read_whole, fd, self.size)

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def _read_whole(fd: int, size: int) -> bytes:
    """The `size` bytes of memory file `fd` (then closed)."""
    try:
        body = os.pread(fd, size, 0)
        while len(body) < size:  # one read returns at most about 2 GiB
            body += os.pread(fd, size - len(body), len(body))
        return body
    finally:
        os.close(fd)


def _gathered(length: int) -> "_MemoryFile | _Mapped":
    """Where a large body of `length` declared bytes is gathered as it arrives."""
    if hasattr(os, "memfd_create"):
        try:
            return _MemoryFile(length)
        except OSError:  # not allowed here (a sandbox's filter): the memory map serves
            pass
    return _Mapped(length)


async def read_body(
    receive: Receive, max_bytes: int, timeout: float, held: Reservation | None = None,
    expected: int | None = None,
) -> bytes:  # fmt: skip
    """The whole request body: 413 as soon as it streams past `max_bytes`, 408 when it has not
    all arrived within `timeout` seconds (OPSERVE_BODY_TIMEOUT_SECONDS). With `held`, every
    chunk is reserved from the memory budget as it arrives, never before: a client that stalls
    holds only what it sent, and only until the deadline. `expected`: the declared length.

    The deadline is kept from the first wait on. A body that had all arrived with its headers
    (most small ones: uvicorn's `receive()` then finishes without waiting) is taken at once,
    with no deadline and no loop: the deadline's registration and the general read's frames
    cost a small request 5-7% of its time in process."""
    message = _arrived(receive)
    if (
        held is None
        and not isinstance(message, _Resumed)
        and message["type"] == "http.request"
        and not message.get("more_body", False)
    ):
        body = message.get("body", b"")
        if len(body) > max_bytes:
            raise PayloadTooLarge(too_large("streamed in chunks went", max_bytes))
        return bytes(body)
    large = expected is not None and MAPPED_BODY_BYTES <= expected <= max_bytes
    chunks: Any = _gathered(expected) if large else []  # type: ignore[arg-type]
    try:
        return await _read(receive, message, max_bytes, timeout, held, chunks)
    finally:
        if large:
            chunks.close()


async def _read(receive: Receive, message: "Message | _Resumed", max_bytes: int,
                timeout: float, held: Reservation | None, chunks: Any) -> bytes:  # fmt: skip
    """read_body's loop, from its first `message` (or what to await for it) on."""
    size = 0
    # a read with `held` may wait for memory from the start
    task = DEADLINES.start(timeout) if held is not None else None
    try:
        while True:
            if isinstance(message, _Resumed):  # it has to be waited for
                if task is None:
                    task = DEADLINES.start(timeout)  # no time has passed in the loop so far
                message = await message
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
            message = _arrived(receive)
    except asyncio.CancelledError:
        if task is not None and DEADLINES.expired(task):  # the deadline cancelled the read
            raise body_timeout(timeout) from None
        raise
    finally:
        if task is not None:
            del DEADLINES.steps[task]
    if isinstance(chunks, list) and len(chunks) == 1:
        return bytes(chunks[0])
    if held is not None:
        await held.grow(size)  # the joined copy, while the chunks still exist
    if isinstance(chunks, list):
        body = b"".join(chunks)
        chunks.clear()
    else:
        body = await chunks.joined()
    if held is not None:
        held.shrink(size)
    return body


def _arrived(receive: Receive) -> "Message | _Resumed":
    """The next message when it has arrived already (`receive()` finished without waiting,
    as uvicorn's does for a body that came with the headers), else what to await for it."""
    steps = receive().__await__()
    try:
        # next(), not send(None): ASGI lets a server's awaitable be a plain iterator
        # (granian's has __next__ only), which `await` takes too
        waiting = next(steps)
    except StopIteration as done:
        return done.value
    return _Resumed(steps, waiting)


class _Resumed:
    """The rest of an awaitable that was stepped once by hand (`_arrived`) and is waiting on
    `waiting` (what it yielded: a future, or None for a loop turn). Awaiting it hands that to
    the task, then forwards what the task sends or throws, as `await` itself (PEP 380's
    `yield from`) would have: written out because a started awaitable cannot be awaited
    again. An iterator without send, throw or close is driven as `yield from` drives one."""

    __slots__ = ("steps", "waiting")

    def __init__(self, steps: Any, waiting: Any) -> None:
        self.steps, self.waiting = steps, waiting

    def __await__(self) -> Generator[Any, Any, Message]:
        steps, waiting = self.steps, self.waiting
        while True:
            thrown = None
            try:
                sent = yield waiting
            except GeneratorExit:
                close = getattr(steps, "close", None)
                if close is not None:
                    close()
                raise
            except BaseException as exc:  # a cancellation, above all: the awaitable's to take
                thrown = exc
            # outside the except clause: what the awaitable raises does not chain to `thrown`
            try:
                if thrown is not None:
                    throw = getattr(steps, "throw", None)
                    if throw is None:
                        raise thrown
                    waiting = throw(thrown)
                elif sent is None:
                    waiting = next(steps)
                else:
                    waiting = steps.send(sent)
            except StopIteration as done:
                return done.value


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
            return byte_count(value)
    return None


def byte_count(value: bytes) -> int | None:
    """A header's byte count, None unless it is plain ASCII digits (bytes.isdigit is) short
    enough for a 64-bit size."""
    return int(value) if value.isdigit() and len(value) < 19 else None


async def _send_413(send: Send, detail: str) -> None:
    body = dumps({"detail": detail, "errors": None})
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
               (b"connection", b"close")]  # fmt: skip
    await send({"type": "http.response.start", "status": 413, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def until_gone(receive: Receive) -> Any:
    """A function that returns once the client has gone (its body was read whole: the next
    message the server gives is the disconnect), for core.execution to stop its run."""

    async def gone() -> None:
        while (await receive())["type"] != "http.disconnect":
            pass

    return gone
