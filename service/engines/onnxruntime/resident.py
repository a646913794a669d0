"""What a run whose size the estimate could not follow really held, read from the process (its
peak resident memory, /proc/self/status's VmHWM, over its resident memory when the run
began), and the heap given back after a large one.

The figure is the whole process's: other work at the same time counts in it, so it can only be
too high. The peak is reset (/proc/self/clear_refs) when a watched run begins and no other is
watched, so overlapping watched runs each see the peak of them all. Where it cannot be reset
(off Linux) nothing is measured (0). After a watched run that grew the process by TRIM_BYTES or more, the heap is trimmed at
once: those pages were never claimed, and the budget's idle trim (core/heap_trim.py) waits for
a quiet moment that a busy server may not have. A watch costs about 0.1 ms; a reader of the
process's VmHWM from outside (bench/bench_memory.py) sees it reset by such runs.
"""

import os
import threading

from service.kernels.allocator import trim_heap

TRIM_BYTES = 64 * 1024 * 1024
_STATUS = "/proc/self/status"
_CLEAR = "/proc/self/clear_refs"


class PeakWatch:
    """The process's peak resident memory over what it held when a watched run began."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._watching = 0
        self._reset = False  # whether the peak was reset when the current watches began

    def start(self) -> int:
        """Begin watching a run: the process's resident bytes now (0 off Linux)."""
        with self._lock:
            if self._watching == 0:
                self._reset = _reset_peak()
            self._watching += 1
            return _status_bytes("VmRSS") if self._reset else 0

    def stop(self, began: int) -> int:
        """End the watch begun at `began` bytes: how far the process grew at its peak since
        (0 off Linux); the heap is trimmed when that is TRIM_BYTES or more."""
        with self._lock:
            self._watching -= 1
            grew = max(0, _status_bytes("VmHWM") - began) if began else 0
        if grew >= TRIM_BYTES:
            trim_heap()
        return grew


def _reset_peak() -> bool:
    try:  # os calls: a third of pathlib's time (both are paid on every such run)
        fd = os.open(_CLEAR, os.O_WRONLY)
        try:
            os.write(fd, b"5")  # "5": resets VmHWM to the current VmRSS only (proc(5))
        finally:
            os.close(fd)
    except OSError:
        return False  # no /proc, or not allowed: the peak would be the process's lifetime one
    return True


def _status_bytes(field: str) -> int:
    try:
        fd = os.open(_STATUS, os.O_RDONLY)
        try:
            text = os.read(fd, 8192)
        finally:
            os.close(fd)
        at = text.index(f"\n{field}:".encode()) + len(field) + 2
        return int(text[at : text.index(b"kB", at)]) * 1024
    except (OSError, ValueError):
        return 0


PEAKS = PeakWatch()
"""The process's watch over runs whose size the estimate could not follow."""
