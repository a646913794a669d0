"""Give the heap's freed memory back to the system once large requests have stopped.

The allocator keeps freed output-sized blocks in the heap, so that back-to-back large requests
reuse warm pages (kernels/allocator.py); but once they stop, what they left stays resident, and
a block still in use above freed ones keeps glibc from returning any of them. So when the memory
budget falls idle (no large request holds any of it) and stays idle for a moment
(OPSERVE_HEAP_TRIM_SECONDS, 1 s), one `trim_heap` returns every freed page. Small requests never
touch the budget, so they neither start nor put off a trim. The wait runs on a short-lived thread of its own, started when the
budget falls idle and ended after its trim, so no event loop is needed (the budget is released
from HTTP's loop and from gRPC's callbacks alike) and an app that never serves a large request
never starts one. An idle() while it waits only notes the time: the budget may fall idle on
every request (cluster mode's sequence steps claim their state from it), and waking the thread
each time cost a cluster step a third of a millisecond (bench/bench_sequences.py).
"""

import gc
import threading
import time
from collections.abc import Callable

from service.kernels.allocator import trim_heap

QUIET_SECONDS = 1.0
"""How long the budget must stay idle before the heap is trimmed by default
(OPSERVE_HEAP_TRIM_SECONDS): a client sending large requests more often than this keeps its
warm pages."""


def collect_and_trim() -> bool:
    """Collect the garbage in reference cycles, then trim the heap: a refused large request
    leaves its buffers in a cycle (its exception's traceback holds the frames that made them),
    and what a collection frees after a trim stays resident until the next one (seen on gRPC:
    +58 to +122 MiB left 10 s after a burst of 8 large calls, back to idle with this)."""
    gc.collect()
    return trim_heap()


class HeapTrim:
    """Trim the heap (`trim`) once `busy()` has been false for `quiet` seconds after the last
    `idle()`: every idle() starts the wait again."""

    def __init__(self, busy: Callable[[], bool], quiet: float = QUIET_SECONDS,
                 trim: Callable[[], object] = collect_and_trim) -> None:  # fmt: skip
        self.busy = busy
        self.quiet = quiet
        self.trim = trim
        self.trims = 0  # done so far (for tests and curiosity)
        self._lock = threading.Lock()
        self._last = 0.0  # time.monotonic() of the last idle()
        self._waiter: threading.Thread | None = None

    def idle(self) -> None:
        """The budget has just fallen idle: trim once it has stayed so for `quiet` seconds."""
        with self._lock:
            self._last = time.monotonic()
            if self._waiter is not None:
                return  # the waiting thread finds the new time when its sleep ends
            self._waiter = threading.Thread(target=self._wait, name="opserve-heap-trim",
                                            daemon=True)  # fmt: skip
            self._waiter.start()

    def _wait(self) -> None:
        while True:
            with self._lock:
                left = self._last + self.quiet - time.monotonic()
                if left <= 0:  # quiet since the last idle(): this thread ends (and trims)
                    self._waiter = None
                    break
            time.sleep(left)
        if not self.busy():
            self.trim()
            self.trims += 1
