"""One JSON access-log line per request, written to stdout in batches.

uvicorn's access log goes through `logging` for every request (a record, a formatter, a
locked handler and a write), which costs more than a small operator call itself. Here a
request's fields are kept in a buffer, and at most every 50 ms (or at 32 requests;
`service/telemetry/recorder.py` keeps the time) their lines are made, one `orjson.dumps` each, and
written at once, so logging stays on at little cost. A crash
can lose the last 50 ms of lines; the service's other logs go through `logging`, as JSON too
(`service/log_format.py`). orjson escapes control characters, so a client cannot forge a line.
"""

import sys
import time
from collections.abc import Mapping
from typing import Any, TextIO

import orjson

FLUSH_LINES = 32
"""Lines buffered before a write, at most: making a line costs 3-4 us on the server, so 256 of
them (50 ms at 5,000 requests/s) paused every request in flight for about 0.9 ms, which
showed in the p99 at 16 connections; 32 pause it for 0.15 ms, at the same cost per line."""
CLIENT_GONE = 499  # nginx's status for a client that closed the connection before the answer
MAX_TARGET = 512  # characters of a request target kept in a line


class AccessLog:
    """`{"time", "request_id", "client", "method", "path", "route", "model", "operator",
    "version", "status", "duration_ms", "bytes_in", "bytes_out"}` per request, one JSON object a
    line."""

    def __init__(self, stream: TextIO | None = None) -> None:
        self.stream = stream
        self.lines: list[tuple] = []  # each request's fields, made into its line by flush
        self._second = -1
        self._stamp = ""

    def record(self, scope: Mapping[str, Any], request_id: bytes, route: str, model: str, operator: str,
               version: str, status: int, seconds: float, bytes_in: int,
               bytes_out: int) -> bool:  # fmt: skip
        """Buffer the line of one request; True when the buffer is full and wants a flush.
        Only its fields are kept here (not the scope, with its headers); flush makes the
        lines, in one loop, which costs a small request less."""
        self.lines.append((time.time(), scope.get("client"), scope["method"],
                           scope.get("raw_path") or scope["path"], scope.get("query_string"),
                           request_id, route, model, operator, version, status, seconds,
                           bytes_in, bytes_out))  # fmt: skip
        return len(self.lines) >= FLUSH_LINES

    def _line(self, now: float, client: tuple[str, int] | None, method: str, path: bytes | str,
              query: bytes | None, request_id: bytes, route: str, model: str, operator: str,
              version: str, status: int, seconds: float, bytes_in: int,
              bytes_out: int) -> bytes:  # fmt: skip
        client = client or ("-", 0)
        target = path if isinstance(path, bytes) else path.encode("utf-8", "surrogateescape")
        if query:
            target += b"?" + query
        return orjson.dumps({
            "time": self._stamp_of(now), "request_id": request_id.decode("ascii"),
            "client": f"{client[0]}:{client[1]}", "method": method,
            "path": _shortened(target), "route": route, "model": model, "operator": operator,
            "version": version,
            "status": status, "duration_ms": seconds * 1000,
            "bytes_in": bytes_in, "bytes_out": bytes_out,
        })  # fmt: skip

    def _stamp_of(self, now: float) -> str:
        if int(now) != self._second:  # one strftime per second, not per request
            self._second = int(now)
            self._stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now))
        return self._stamp

    def flush(self) -> None:
        """Write the buffered lines now."""
        if self.lines:
            stream = self.stream or sys.stdout
            taken, self.lines = self.lines, []  # taken first: a line that failed is not kept
            made = [self._line(*fields) for fields in taken]
            stream.write(b"\n".join(made).decode() + "\n")
            stream.flush()


def _shortened(target: bytes) -> str:
    """The request target as sent (percent-encoding kept), shortened."""
    text = target.decode("latin-1")
    if len(text) > MAX_TARGET:
        text = f"{text[:MAX_TARGET]}...({len(text)} chars)"
    return text
