"""uvicorn's httptools protocol with two guards against clients that hold connections open:
a deadline for each request's headers, and a bound on open connections.

uvicorn times out idle kept-alive connections, but not a connection that sent nothing yet,
nor headers that arrive a byte at a time: 2,000 such clients held their connections for
minutes and, at the file-descriptor limit, locked every new client out. Here a request's
headers must all arrive within OPSERVE_HEADER_TIMEOUT_SECONDS of the connection's opening (or
of the next request's first byte on a kept-alive one), else the connection gets 408 and is
closed; and a connection past OPSERVE_MAX_CONNECTIONS is answered 503 at once and closed,
a clear refusal instead of a silent wait in the accept queue. (uvicorn's own
limit_concurrency answers 503 only once headers are complete, which a dribbler never is.)
"""

import asyncio
from functools import cache

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from service.settings import Settings


def _answer(status: bytes, text: bytes, extra: bytes = b"") -> bytes:
    return (b"HTTP/1.1 " + status + b"\r\ncontent-type: application/json\r\nconnection: close\r\n"
            + extra + b"content-length: %d\r\n\r\n" % len(text) + text)  # fmt: skip


LATE = _answer(b"408 Request Timeout", b'{"detail":"the request headers did not arrive in time '
               b'(OPSERVE_HEADER_TIMEOUT_SECONDS)"}')  # fmt: skip
FULL = _answer(b"503 Service Unavailable", b'{"detail":"the server has too many open '
               b'connections (OPSERVE_MAX_CONNECTIONS); retry later"}', b"retry-after: 1\r\n")  # fmt: skip


@cache
def limits() -> tuple[float, int]:
    """(header timeout, most connections), from the worker's settings (read once)."""
    settings = Settings()
    return settings.header_timeout_seconds, settings.max_connections


class GuardedHttpTools(HttpToolsProtocol):
    """HttpToolsProtocol with a header deadline and a connection bound."""

    header_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        timeout, most = limits()
        if len(self.connections) > most:
            transport.write(FULL)
            transport.close()
            return
        self.header_timer = self.loop.call_later(timeout, self._headers_late)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        if self.header_timer is None:  # the next request on a kept-alive connection
            self.header_timer = self.loop.call_later(limits()[0], self._headers_late)

    def on_headers_complete(self) -> None:
        self._disarm()
        super().on_headers_complete()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _disarm(self) -> None:
        if self.header_timer is not None:
            self.header_timer.cancel()
            self.header_timer = None

    def _headers_late(self) -> None:
        self.header_timer = None
        if not self.transport.is_closing():
            self.transport.write(LATE)
            self.transport.close()
