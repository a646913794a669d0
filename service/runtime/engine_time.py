"""The time an engine itself spent in the last run on this thread. A run on onnxruntime records
its `session.run` here, so that the V2 statistics count onnxruntime's time as compute_infer,
and what the service does around it (checking and converting inputs, estimating the run's
memory; checking and claiming outputs) as compute_input and compute_output, as Triton's
onnxruntime backend counts them (core/inference.py). A run on the exact engine records
nothing: its whole run is compute_infer."""

import threading

_LAST = threading.local()


def record(started: int, ended: int) -> None:
    """The engine ran from `started` to `ended` (perf_counter_ns) on this thread."""
    _LAST.span = (started, ended)


def take() -> tuple[int, int] | None:
    """The span recorded on this thread since the last take (None: none), then forgotten."""
    span: tuple[int, int] | None = getattr(_LAST, "span", None)
    _LAST.span = None
    return span
