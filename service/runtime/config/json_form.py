"""A model configuration as JSON, both ways, as Triton's ModelConfigToJson / JsonToModelConfig.

Out: protobuf JSON with proto field names and every field without presence printed (defaults,
[] and {}), enums by name, fields in declaration order, floats as C++ prints them (1, not 1.0),
and int64/uint64 fields, which protobuf writes as strings, turned back into numbers exactly at
the paths Triton fixes (INT64_PATHS); the others stay strings, as in Triton (LEFT_AS_STRINGS).
In: protobuf JSON for load overrides; "16" for an int field parses, as tritonclient sends it.
"""

from typing import Any

from google.protobuf import json_format
from google.protobuf.descriptor import Descriptor, FieldDescriptor

from service.errors import InvalidInput
from service.runtime.config.messages import ModelConfig

# Paths of the int64/uint64 fields Triton's ModelConfigToJson converts back to numbers; "*"
# is every element of a list or every value of a map.
INT64_PATHS: tuple[tuple[str, ...], ...] = (
    ("input", "*", "dims"), ("input", "*", "reshape", "shape"),
    ("output", "*", "dims"), ("output", "*", "reshape", "shape"),
    ("version_policy", "specific", "versions"),
    ("dynamic_batching", "max_queue_delay_microseconds"),
    ("dynamic_batching", "priority_levels"), ("dynamic_batching", "default_priority_level"),
    ("dynamic_batching", "default_queue_policy", "default_timeout_microseconds"),
    ("dynamic_batching", "priority_queue_policy", "*", "default_timeout_microseconds"),
    ("sequence_batching", "max_sequence_idle_microseconds"),
    ("sequence_batching", "oldest", "max_queue_delay_microseconds"),
    ("sequence_batching", "direct", "max_queue_delay_microseconds"),
    ("sequence_batching", "state", "*", "dims"),
    ("ensemble_scheduling", "step", "*", "model_version"),
    ("model_warmup", "*", "inputs", "*", "dims"),
)  # fmt: skip
# The 64-bit fields Triton leaves as strings: initial_state dims (its fix-up looks for them in
# the wrong object), CUDA graph dims, secondary device ids; map keys are JSON strings anyway.
LEFT_AS_STRINGS: tuple[tuple[str, ...], ...] = (
    ("sequence_batching", "state", "*", "initial_state", "*", "dims"),
    ("optimization", "cuda", "graph_spec", "*", "input", "*", "dim"),
    ("optimization", "cuda", "graph_spec", "*", "graph_lower_bound", "input", "*", "dim"),
    ("instance_group", "*", "secondary_devices", "*", "device_id"),
    ("dynamic_batching", "priority_queue_policy", "<key>"),
)  # fmt: skip


def config_json(config: Any) -> dict[str, Any]:
    """The JSON object Triton answers on GET /v2/models/{m}/config."""
    raw = json_format.MessageToDict(config, preserving_proto_field_name=True,
                                    always_print_fields_with_no_presence=True)  # fmt: skip
    rendered = _ordered(raw, config.DESCRIPTOR)
    for path in INT64_PATHS:
        _to_numbers(rendered, path)
    return rendered


def _ordered(value: dict[str, Any], descriptor: Descriptor) -> dict[str, Any]:
    """`value` with its keys in declaration order (MessageToDict puts set fields first)."""
    return {f.name: _field(value[f.name], f) for f in descriptor.fields if f.name in value}


def _field(value: Any, field: FieldDescriptor) -> Any:
    message = field.message_type
    if message is not None and message.GetOptions().map_entry:
        inner = message.fields_by_name["value"]
        return {key: _single(item, inner) for key, item in value.items()}
    if isinstance(value, list):  # a repeated field (MessageToDict's only lists)
        return [_single(item, field) for item in value]
    return _single(value, field)


def _single(value: Any, field: FieldDescriptor) -> Any:
    if field.message_type is not None:
        return _ordered(value, field.message_type)
    if isinstance(value, float) and value.is_integer():
        return int(value)  # C++ protobuf prints 1.0f as 1
    return value


def _to_numbers(value: Any, path: tuple[str, ...]) -> None:
    """Turn the strings at the end of `path` into ints, wherever the path exists."""
    head, rest = path[0], path[1:]
    if head == "*":
        for child in value.values() if isinstance(value, dict) else value:
            _to_numbers(child, rest)
    elif isinstance(value, dict) and head in value:
        if rest:
            _to_numbers(value[head], rest)
        else:
            found = value[head]
            value[head] = [int(v) for v in found] if isinstance(found, list) else int(found)


def config_from_json(text: str | bytes) -> Any:
    """A ModelConfig from a load override's JSON; InvalidInput with the parser's words."""
    config = ModelConfig()
    try:
        json_format.Parse(text, config, ignore_unknown_fields=False)
    except (json_format.ParseError, ValueError, RecursionError) as exc:
        detail = str(exc) if len(str(exc)) <= 300 else str(exc)[:300] + "..."
        raise InvalidInput(f"Invalid config override: {detail}") from None
    return config
