"""One access-log line per request, written to stdout in batches.

uvicorn's access log goes through `logging` for every request (a record, a formatter, a
locked handler and a write), which costs more than a small operator call itself. This pure
ASGI middleware formats one line per request into a buffer and writes the buffer at most
every 50 ms (or at 256 lines), so logging stays on at little cost. A crash can lose the
last 50 ms of lines; the service's own warnings and errors still go through `logging`.
"""

import asyncio
import atexit
import sys
import time
from typing import TextIO

from starlette.types import ASGIApp, Message, Receive, Scope, Send

FLUSH_SECONDS = 0.05
FLUSH_LINES = 256
CLIENT_GONE = 499  # nginx's status for a client that closed the connection before the answer
MAX_TARGET = 512  # characters of a request target kept in a line
# Control characters, quotes and backslashes are written as \xNN: a client cannot forge a line.
_ESCAPES = {c: f"\\x{c:02x}" for c in [*range(0x20), 0x22, 0x5C, 0x7F]}


class AccessLogMiddleware:
    """`<time> <client> "<method> <path> HTTP/<v>" <status> <ms>` per HTTP request."""

    def __init__(self, app: ASGIApp, stream: TextIO | None = None) -> None:
        self.app = app
        self.stream = stream
        self.lines: list[str] = []
        self.flush_pending = False
        self._second = -1
        self._stamp = ""
        atexit.register(self.flush)  # lines still buffered when the server stops

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        status = CLIENT_GONE  # the app returned without answering: the client went away

        async def send_with_status(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_with_status)
        except BaseException:
            if status == CLIENT_GONE:
                status = 500  # what the server answers for an exception before a response
            raise
        finally:
            self.record(scope, status, time.perf_counter() - start)

    def record(self, scope: Scope, status: int, seconds: float) -> None:
        """Buffer the line of one answered request."""
        client = scope.get("client") or ("-", 0)
        target = scope.get("raw_path") or scope["path"].encode("utf-8", "surrogateescape")
        if query := scope.get("query_string", b""):
            target += b"?" + query
        self.lines.append(
            f'{self._now()} {client[0]}:{client[1]} "{scope["method"]} {_printable(target)} '
            f'HTTP/{scope["http_version"]}" {status} {seconds * 1000:.2f}ms\n'
        )
        if len(self.lines) >= FLUSH_LINES:
            self.flush()
        elif not self.flush_pending:
            self.flush_pending = True
            asyncio.get_running_loop().call_later(FLUSH_SECONDS, self.flush)

    def _now(self) -> str:
        now = time.time()
        if int(now) != self._second:  # one strftime per second, not per request
            self._second = int(now)
            self._stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(now))
        return self._stamp + "Z"

    def flush(self) -> None:
        """Write the buffered lines now."""
        self.flush_pending = False
        if self.lines:
            stream = self.stream or sys.stdout
            stream.write("".join(self.lines))
            stream.flush()
            self.lines.clear()


def _printable(target: bytes) -> str:
    """The request target as sent (percent-encoding kept), shortened, with no control chars."""
    text = target.decode("latin-1")
    if len(text) > MAX_TARGET:
        text = f"{text[:MAX_TARGET]}...({len(text)} chars)"
    return text.translate(_ESCAPES)
