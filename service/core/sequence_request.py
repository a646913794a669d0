"""The sequence parameters of one request (Triton's sequence_id, sequence_start and
sequence_end), read and checked the same for every door and every model."""

from collections.abc import Mapping
from dataclasses import dataclass

from service.errors import InvalidInput, Unsupported

MAX_ID = 2**64 - 1
MAX_ID_BYTES = 128
Parameters = Mapping[str, bool | int | float | str]


@dataclass(frozen=True, slots=True)
class SequenceRequest:
    """The sequence parameters of one request; `id` 0 or "" means none was given."""

    id: int | str
    start: bool = False
    end: bool = False


def sequence_request(parameters: Parameters) -> SequenceRequest | None:
    """The request's sequence_id, sequence_start and sequence_end; None when it sends none.
    Their types are checked whatever the model (Triton's HTTP door does); a model without
    sequence batching then ignores them, as Triton does."""
    if not any(k in parameters for k in ("sequence_id", "sequence_start", "sequence_end")):
        return None
    seq_id = parameters.get("sequence_id", 0)
    if isinstance(seq_id, bool) or not isinstance(seq_id, int | str) or (
        isinstance(seq_id, int) and not 0 <= seq_id <= MAX_ID
    ):  # fmt: skip
        raise InvalidInput("Unable to parse 'sequence_id': expected an unsigned 64-bit integer "
                           f"or a string, got {_shown(seq_id)}")  # fmt: skip
    if isinstance(seq_id, str) and len(seq_id[: MAX_ID_BYTES + 1].encode()) > MAX_ID_BYTES:
        # Triton's status (UNSUPPORTED) and text; it counts bytes, as we do
        raise Unsupported("string correlation ID cannot be longer than 128 characters")
    return SequenceRequest(seq_id, _flag(parameters, "sequence_start"),
                           _flag(parameters, "sequence_end"))  # fmt: skip


def _flag(parameters: Parameters, key: str) -> bool:
    value = parameters.get(key, False)
    if not isinstance(value, bool):
        raise InvalidInput(f"Unable to parse '{key}': expected a boolean, got {_shown(value)}")
    return value


def _shown(value: object) -> str:
    return f"{type(value).__name__} {str(value)[:40]!r}"
