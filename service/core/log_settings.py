"""Triton's logging extension: the running process's log levels and format, read and changed
by `GET|POST /v2/logging` and gRPC `LogSettings` (the doors convert; this checks and applies).

Triton switches each level on and off by itself (info off, errors on), which `logging`'s one
threshold cannot say: a filter on the service's handlers gates each level, and the loggers'
thresholds are lowered to let through what the filter may pass. The access log writes its
lines itself (service/telemetry/access_log.py): OPSERVE_ACCESS_LOG, not these, turns it off."""

import logging
from collections.abc import Mapping
from typing import Any

from service.errors import BadRequest, Unsupported
from service.log_format import Iso8601Formatter, JsonFormatter

LOGGERS = ("opserve", "uvicorn", "uvicorn.error", "uvicorn.access")
FORMATS = ("default", "ISO8601")
"""`default`: opserve's JSON lines (log_format.py); `ISO8601`: Triton's ISO8601 text record."""
SWITCHES = ("log_info", "log_warning", "log_error")
MAX_VERBOSE_LEVEL = 2**32 - 1  # Triton's is a uint32 on gRPC


class LogSettings:
    """The levels and format of this process's logs, starting from OPSERVE_LOG_LEVEL."""

    def __init__(self, level: str) -> None:
        rank = logging.getLevelName(level.upper())
        rank = rank if isinstance(rank, int) else logging.INFO
        self.values: dict[str, Any] = {
            "log_file": "",  # stderr; Triton's clients read the key
            "log_info": rank <= logging.INFO,
            "log_warning": rank <= logging.WARNING,
            "log_error": rank <= logging.ERROR,
            "log_verbose_level": 1 if rank <= logging.DEBUG else 0,
            "log_format": "default",
        }
        self._gate = _Gate(self.values)

    def report(self) -> dict[str, Any]:
        """The settings in Triton's JSON form."""
        return dict(self.values)

    def update(self, changes: Mapping[str, Any]) -> dict[str, Any]:
        """Check every change (a null leaves its setting as it is; unknown keys are ignored,
        as Triton does), then apply them all at once; the settings after."""
        checked = {key: _checked(key, value) for key, value in changes.items()
                   if key in self.values and value is not None}  # fmt: skip
        self.values.update(checked)
        self._apply()
        return self.report()

    def _apply(self) -> None:
        verbose = self.values["log_verbose_level"] > 0
        formatter = Iso8601Formatter() if self.values["log_format"] == "ISO8601" else (
            JsonFormatter())  # fmt: skip
        for name in LOGGERS:
            logger = logging.getLogger(name)
            logger.setLevel(logging.DEBUG if verbose else logging.INFO)  # the gate decides
            for handler in logger.handlers:
                if self._gate not in handler.filters:
                    handler.addFilter(self._gate)
                handler.setFormatter(formatter)


def _checked(key: str, value: Any) -> Any:
    """A change's value when it is one Triton takes; else refused, naming the setting."""
    if key == "log_file":
        raise Unsupported("log file location can not be updated through network protocol")
    if key in SWITCHES:
        if not isinstance(value, bool):
            raise BadRequest(f"invalid value for log setting '{key}': expected a boolean, "
                             f"got {str(value)[:100]!r}")  # fmt: skip
        return value
    if key == "log_verbose_level":
        if isinstance(value, bool) or not isinstance(value, int) or not (
                0 <= value <= MAX_VERBOSE_LEVEL):  # fmt: skip
            raise BadRequest(f"invalid value for log setting 'log_verbose_level': expected an "
                             f"unsigned integer, got {str(value)[:100]!r}")  # fmt: skip
        return value
    if value not in FORMATS:
        raise BadRequest(f"invalid argument for log setting 'log_format': expected "
                         f"'default' or 'ISO8601', got {str(value)[:100]!r}")  # fmt: skip
    return value


class _Gate(logging.Filter):
    """Passes a record whose level is switched on (below INFO: a verbose level above 0)."""

    def __init__(self, values: dict[str, Any]) -> None:
        super().__init__()
        self.values = values

    def filter(self, record: logging.LogRecord) -> bool:
        level = record.levelno
        if level >= logging.ERROR:
            return bool(self.values["log_error"])
        if level >= logging.WARNING:
            return bool(self.values["log_warning"])
        if level >= logging.INFO:
            return bool(self.values["log_info"])
        return bool(self.values["log_verbose_level"] > 0)
