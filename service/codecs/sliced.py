"""Sequences of Python values converted a slice at a time, so that no single C call over a
request's millions of values holds the interpreter's lock, and with it the event loop and
every other request, while it runs (the lock is let go between slices)."""

from collections.abc import Sequence
from typing import Any

import numpy as np

SLICE_VALUES = 1 << 18
"""Elements converted at a time from a sequence of Python values. numpy converts a sequence in
one call that holds the interpreter's lock throughout: over a gRPC message's 4 million
int_contents, 175 ms, on a kernel thread, with the event loop and every other request waiting
(a probe beside such calls: 145-187 ms). 262,144 at a time took 7.5 ms each, and 112 ms in
all."""


def sliced_array(values: Sequence[Any], dtype: np.dtype) -> np.ndarray:
    """`values` as a flat array of `dtype`, SLICE_VALUES at a time."""
    if len(values) <= SLICE_VALUES:
        return np.asarray(values, dtype=dtype)
    array = np.empty(len(values), dtype)
    for start in range(0, len(values), SLICE_VALUES):
        array[start : start + SLICE_VALUES] = values[start : start + SLICE_VALUES]
    return array
