"""What the service records of every call, through any door: its log line and its metrics.

`Telemetry.record` logs and counts one request under (route, method, model, operator, version,
status); the HTTP door observes its ASGI requests with service/api/observe.py, the gRPC door
calls `started` and `finished` around each call. Every label comes from a bounded set, so no
client can blow up the metrics' cardinality: route templates from the route table (never raw
paths), models, operators and versions only once the service has found them (served
operators, repository models).
"""

import asyncio
import atexit
from collections.abc import MutableMapping
from functools import lru_cache
from typing import Any

from service.errors import ServiceError
from service.operators import registry
from service.telemetry.access_log import AccessLog
from service.telemetry.metrics import Metrics

FLUSH_SECONDS = 0.05
"""The access log's buffered lines are written this long after a request at most."""
SHARE_SECONDS = 0.5
"""This worker's metric totals reach the other workers (metrics.py) this long after a request
at most: a file written and renamed 20 times a second cost 2% of a small request's time."""
OPS_PREFIX = "/v1/ops/"
UNKNOWN = ("unknown", "unknown")
MAX_LABELLED_PATH = 128  # longer /v1/ops paths are labelled unknown without a lookup
MODEL_LABELS = "opserve.model"
"""The scope key where a lane puts (model, operator, version) of the model a request ran on:
only names the service resolved, so the labels stay bounded."""
_NO_MODEL = ("", "", "")
Scope = MutableMapping[str, Any]
"""What a log line shows of a call (client, path, method) and MODEL_LABELS: an ASGI scope, or
the gRPC door's like of one."""
_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "GRPC"})


class Telemetry:
    """The access log (when on) and the metrics of one worker, flushed every 50 ms."""

    def __init__(self, log: AccessLog | None, metrics: Metrics) -> None:
        self.log = log
        self.metrics = metrics
        self.flush_pending = self.share_pending = False
        atexit.register(self.flush)  # lines and totals still buffered when the server stops

    def record(self, scope: Scope, rid: bytes, route: str, status: int, seconds: float,
               bytes_in: int, bytes_out: int) -> None:  # fmt: skip
        """Log and count one request."""
        if route.startswith(OPS_PREFIX):
            operator, version = operator_labels(scope["path"])
            model = operator
        else:  # what a lane found the request was for (MODEL_LABELS), else nothing
            model, operator, version = scope.get(MODEL_LABELS, _NO_MODEL)
        method = scope["method"] if scope["method"] in _METHODS else "other"
        self.metrics.record((route, method, model, operator, version, status), seconds,
                            bytes_in, bytes_out)  # fmt: skip
        if self.log is not None and self.log.record(scope, rid, route, model, operator, version,
                                                    status, seconds, bytes_in, bytes_out):  # fmt: skip
            self.log.flush()

    def started(self) -> None:
        """Count a call that is not an ASGI request (gRPC) in flight until `finished`."""
        self.metrics.in_flight += 1
        self.schedule()

    def finished(self, scope: Scope, rid: bytes, route: str, status: int, seconds: float,
                 bytes_in: int, bytes_out: int) -> None:  # fmt: skip
        """Record a call counted by `started`; `scope` holds what the log line shows (client,
        path, method) and MODEL_LABELS."""
        self.metrics.in_flight -= 1
        self.record(scope, rid, route, status, seconds, bytes_in, bytes_out)
        self.schedule()

    def schedule(self) -> None:
        """Flush (and share the totals) soon: a request started or ended."""
        if not self.flush_pending:
            self.flush_pending = True
            loop = asyncio.get_running_loop()
            loop.call_later(FLUSH_SECONDS, self._flush_log)
            if not self.share_pending:
                self.share_pending = True
                loop.call_later(SHARE_SECONDS, self._share)

    def _flush_log(self) -> None:
        self.flush_pending = False
        if self.log is not None:
            self.log.flush()

    def _share(self) -> None:
        self.share_pending = False
        self.metrics.share()

    def flush(self) -> None:
        """Write the buffered log lines and this worker's metric totals now."""
        self._flush_log()
        self.metrics.flush()


def operator_labels(path: str) -> tuple[str, str]:
    """The operator and schema version a `/v1/ops/...` path runs, or ("unknown", "unknown")."""
    if len(path) > MAX_LABELLED_PATH:  # no operator has so long a name: keep it out of the cache
        return UNKNOWN
    return _operator_labels(path)


@lru_cache(maxsize=1024)  # bounded: a client sending new paths only evicts old entries
def _operator_labels(path: str) -> tuple[str, str]:
    op_type, _, version = path[len(OPS_PREFIX) :].partition("/")
    if version and not (version.isascii() and version.isdigit() and len(version) <= 9):
        return UNKNOWN
    try:
        op = registry.resolve(op_type, int(version) if version else None)
    except ServiceError:
        return UNKNOWN
    return op.op_type, str(op.since_version)
