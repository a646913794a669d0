"""The service's own logs (uvicorn's and ours, through `logging`) as one JSON object a line.

The access log writes its JSON lines itself (service/telemetry/access_log.py); this formatter gives
the other logs the same shape, so one log pipeline parses both."""

import logging
import time
from typing import Any

import orjson


class JsonFormatter(logging.Formatter):
    """`{"time", "level", "logger", "message"}`, plus `exception` with its traceback."""

    def format(self, record: logging.LogRecord) -> str:
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
        entry = {"time": f"{stamp}.{int(record.msecs):03d}Z", "level": record.levelname.lower(),
                 "logger": record.name, "message": record.getMessage()}  # fmt: skip
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return orjson.dumps(entry).decode()


class Iso8601Formatter(logging.Formatter):
    """Triton's ISO8601 log record (`--log-format ISO8601`, the logging extension's
    `log_format`): `2026-01-02T03:04:05Z I <pid> <logger>:<line>] <message>`."""

    def format(self, record: logging.LogRecord) -> str:
        stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(record.created))
        line = (f"{stamp} {record.levelname[:1]} {record.process} {record.name}:"
                f"{record.lineno}] {record.getMessage()}")  # fmt: skip
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


def logging_config(level: str) -> dict[str, Any]:
    """A `logging.config.dictConfig` for uvicorn and the service: JSON lines on stderr."""
    handler = {"handlers": ["stderr"], "level": level.upper(), "propagate": False}
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {"json": {"()": JsonFormatter}},
        "handlers": {
            "stderr": {
                "class": "logging.StreamHandler",
                "formatter": "json",
                "stream": "ext://sys.stderr",
            }
        },
        "loggers": {"uvicorn": handler, "uvicorn.access": handler, "opserve": handler},
    }
