"""The trace extension's settings, as Triton's TraceManager keeps them: the start's (OPSERVE_
TRACE_*), the global ones set over the network on top, and each model's on top of those. A
setting cleared (null) falls back a layer; a model left with none uses the global settings.
Checked here for both doors (they only convert their messages to `changes`)."""

from collections.abc import Mapping
from typing import Any

from service.errors import BadRequest, Unsupported
from service.settings import Settings

LEVELS = ("TIMESTAMPS", "TENSORS")
FIELDS = ("trace_level", "trace_rate", "trace_count", "log_frequency")
UINT32 = 2**32 - 1
INT32 = 2**31 - 1
Fields = dict[str, Any]  # trace_level (a tuple of names, () for OFF), trace_rate, ...


class TraceSettings:
    """The three layers; `effective(model)` is what a model's requests are traced by."""

    def __init__(self, settings: Settings) -> None:
        level = () if settings.trace_level == "OFF" else (settings.trace_level,)
        self.default: Fields = {"trace_level": level, "trace_rate": settings.trace_rate,
                                "trace_count": settings.trace_count,
                                "log_frequency": settings.trace_log_frequency}  # fmt: skip
        self.given: Fields = {}  # the global layer: only what was set
        self.models: dict[str, Fields] = {}

    def effective(self, model: str | None) -> Fields:
        """The start's settings, under the global ones set, under the model's."""
        found = self.default | self.given
        return found | self.models[model] if model in self.models else found

    def update(self, model: str | None, changes: Mapping[str, Any]) -> None:
        """Apply checked `changes` (a None clears a setting) to the global layer or a model's."""
        layer = dict(self.given if model is None else self.models.get(model, {}))
        for key, value in checked(changes).items():
            if value is None:
                layer.pop(key, None)
            else:
                layer[key] = value
        if model is None:
            self.given = layer
        elif layer:
            self.models[model] = layer
        else:
            self.models.pop(model, None)  # nothing of its own: the global settings


def checked(changes: Mapping[str, Any]) -> Fields:
    """The changes Triton takes, parsed; unknown keys ignored (Triton's way); anything else
    refused naming the setting, before any is applied."""
    if "trace_file" in changes:
        raise Unsupported("trace file location can not be updated through network protocol")
    parsed: Fields = {}
    for key in FIELDS:
        if key in changes:
            value = changes[key]
            parsed[key] = None if value is None else (
                _level(value) if key == "trace_level" else _number(key, value))  # fmt: skip
    return parsed


def _level(value: Any) -> tuple[str, ...]:
    names = [value] if isinstance(value, str) else value
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names) or not names:
        raise BadRequest("invalid value for trace setting 'trace_level': expected a list of "
                         "OFF, TIMESTAMPS or TENSORS")  # fmt: skip
    if "OFF" in names:
        if len(names) > 1:
            raise BadRequest("Expect only one trace level 'OFF' is specified")  # Triton's
        return ()
    wrong = [name for name in names if name not in LEVELS]
    if wrong:
        raise BadRequest(f"invalid value for trace setting 'trace_level': "
                         f"{wrong[0][:100]!r} is not OFF, TIMESTAMPS or TENSORS")  # fmt: skip
    return tuple(level for level in LEVELS if level in names)


def _number(key: str, value: Any) -> int:
    """Triton's settings are strings of integers (`"100"`); a JSON integer is taken too."""
    low, high = (-1, INT32) if key == "trace_count" else (0, UINT32)
    if isinstance(value, str) and value.strip().lstrip("+-").isdigit():
        number = int(value)
    elif isinstance(value, int) and not isinstance(value, bool):
        number = value
    else:
        raise BadRequest(f"Unable to parse '{key}', got: {str(value)[:100]}")
    if not low <= number <= high:
        raise BadRequest(f"Unable to parse '{key}', value is out of range [ {low}, {high} ], "
                         f"got: {number}")  # fmt: skip
    return number
