"""One JSON access-log line per request, written to stdout in batches.

uvicorn's access log goes through `logging` for every request (a record, a formatter, a
locked handler and a write), which costs more than a small operator call itself. Here a line
is one `orjson.dumps` into a buffer, and the buffer is written at most every 50 ms (or at 256
lines; `service/api/telemetry.py` keeps the time), so logging stays on at little cost. A crash
can lose the last 50 ms of lines; the service's other logs go through `logging`, as JSON too
(`service/log_format.py`). orjson escapes control characters, so a client cannot forge a line.
"""

import sys
import time
from typing import TextIO

import orjson
from starlette.types import Scope

FLUSH_LINES = 256
CLIENT_GONE = 499  # nginx's status for a client that closed the connection before the answer
MAX_TARGET = 512  # characters of a request target kept in a line


class AccessLog:
    """`{"time", "request_id", "client", "method", "path", "route", "model", "operator",
    "version", "status", "duration_ms", "bytes_in", "bytes_out"}` per request, one JSON object a
    line."""

    def __init__(self, stream: TextIO | None = None) -> None:
        self.stream = stream
        self.lines: list[bytes] = []
        self._second = -1
        self._stamp = ""

    def record(self, scope: Scope, request_id: bytes, route: str, model: str, operator: str,
               version: str, status: int, seconds: float, bytes_in: int,
               bytes_out: int) -> bool:  # fmt: skip
        """Buffer the line of one request; True when the buffer is full and wants a flush."""
        client = scope.get("client") or ("-", 0)
        target = scope.get("raw_path") or scope["path"].encode("utf-8", "surrogateescape")
        if query := scope.get("query_string", b""):
            target += b"?" + query
        self.lines.append(orjson.dumps({
            "time": self._now(), "request_id": request_id.decode("ascii"),
            "client": f"{client[0]}:{client[1]}", "method": scope["method"],
            "path": _shortened(target), "route": route, "model": model, "operator": operator,
            "version": version,
            "status": status, "duration_ms": seconds * 1000,
            "bytes_in": bytes_in, "bytes_out": bytes_out,
        }))  # fmt: skip
        return len(self.lines) >= FLUSH_LINES

    def _now(self) -> str:
        now = time.time()
        if int(now) != self._second:  # one strftime per second, not per request
            self._second = int(now)
            self._stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now))
        return self._stamp

    def flush(self) -> None:
        """Write the buffered lines now."""
        if self.lines:
            stream = self.stream or sys.stdout
            stream.write(b"\n".join(self.lines).decode() + "\n")
            stream.flush()
            self.lines.clear()


def _shortened(target: bytes) -> str:
    """The request target as sent (percent-encoding kept), shortened."""
    text = target.decode("latin-1")
    if len(text) > MAX_TARGET:
        text = f"{text[:MAX_TARGET]}...({len(text)} chars)"
    return text
