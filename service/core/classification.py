"""Triton's classification extension: an output asked for with `classification: k` is answered
as its top k entries, each the BYTES string "value:index[:label]".

As Triton (server src/classification.cc): the top k are found per batch row when the model
batches (max_batch_size > 0), else over the whole tensor; k past the element count gives them
all; values print as C's std::to_string does (floats with six decimals, integers as they
are); the label is the output's label file line `index`, left out when there is none. Ties go
to the lower index (Triton's order among ties is unspecified).
"""

from collections.abc import Sequence
from typing import Any

import numpy as np

from service.errors import InvalidInput, PayloadTooLarge

MAX_ELEMENTS = 1_000_000  # Triton's bound on a classified tensor
_KINDS = frozenset("uif")  # unsigned, signed integers and floats; bool is "b"


def class_count(parameters: dict[str, Any], name: str) -> int:
    """The k a requested output asks for (0: answer the tensor itself)."""
    k = parameters.get("classification", 0)
    if isinstance(k, bool) or not isinstance(k, int) or k < 0:
        raise InvalidInput(f"classification must be a non-negative integer, not {k!r:.40}",
                           loc=("outputs", name))  # fmt: skip
    return k


def classify(array: np.ndarray, k: int, batched: bool, labels: Sequence[str] | None,
             datatype: str) -> np.ndarray:  # fmt: skip
    """The top `k` entries of `array` as "value:index[:label]" strings: shape [batch, k'] when
    `batched`, else [k'] (k' = min(k, entries per row))."""
    if array.dtype.kind not in _KINDS or array.dtype.itemsize > 8 or datatype in ("FP16", "BF16"):
        raise InvalidInput(f"class result not available for output due to unsupported type "
                           f"'{datatype}'")  # fmt: skip
    if array.size > MAX_ELEMENTS:
        raise PayloadTooLarge("classification output tensor too large")
    rows = array.reshape(array.shape[0], -1) if batched and array.ndim else array.reshape(1, -1)
    top = min(k, rows.shape[1])
    out = np.empty((rows.shape[0], top), dtype=object)
    for r, row in enumerate(rows):
        # ~x reverses an integer order without overflow; -x a float's: a stable ascending sort
        # of the key is then descending by value, ties by index.
        key = -row if row.dtype.kind == "f" else ~row
        for c, index in enumerate(np.argsort(key, kind="stable")[:top]):
            out[r, c] = _entry(row[index], int(index), labels)
    return out if batched and array.ndim else out.reshape(top)


def _entry(value: np.generic, index: int, labels: Sequence[str] | None) -> str:
    shown = f"{float(value):f}" if isinstance(value, np.floating) else str(int(value))
    label = labels[index] if labels is not None and index < len(labels) else ""
    return f"{shown}:{index}:{label}" if label else f"{shown}:{index}"
