"""When a run on onnxruntime may take the event loop instead of a kernel thread.

A thread hop costs 0.1-0.25 ms on a small host (measured on 2 shared cores, bench/
bench_engines.py), as much as a small model's whole run: a quick model's small request pays
more for the hop than for its answer. So, as an operator's small call does (core/offload.py),
it runs inline when three things hold:

- the request is small (the door's rule: its body under INLINE_BODY_BYTES, uncompressed);
- the model is quick: its last QUICK_RUNS runs, inline or on threads, each took at most
  QUICK_RUN_SECONDS (a model starts on threads, and one slow run sends it back there);
- the run's estimated peak (ort_memory.py) is at most the inline output allowance
  (SMALL_BYTES), as an operator's inline output is. Values whose size the estimate cannot
  know count for nothing in it, on a thread as here (an inline run holds no more than one
  on a thread would, and one at a time); the leash bounds what they cost in time.

A run inline is still watched (ort_stop.py): one that outlasts LEASH_SECONDS is stopped and
run again on a thread (RunOffLoop), and the model never runs inline again, since its cost
depends on its inputs. So a client can hold the loop for at most one leash per loaded model
version. The stopper's poll (POLL_SECONDS) is the leash's grain.
"""

from service.runtime.ort_stop import POLL_SECONDS

QUICK_RUN_SECONDS = 0.001
QUICK_RUNS = 16
LEASH_SECONDS = POLL_SECONDS


class InlineGate:
    """One loaded model's record of its runs' times, and whether it may run inline. Written
    from the kernel threads and the loop without a lock: a lost update only delays a
    decision by a run, and `closed` only ever goes from False to True."""

    __slots__ = ("closed", "quick_in_a_row")

    def __init__(self) -> None:
        self.quick_in_a_row = 0
        self.closed = False  # a run outlasted the leash: threads from now on

    @property
    def open(self) -> bool:
        return not self.closed and self.quick_in_a_row >= QUICK_RUNS

    def ran(self, seconds: float) -> None:
        """A run (inline or on a thread) took `seconds`."""
        self.quick_in_a_row = self.quick_in_a_row + 1 if seconds <= QUICK_RUN_SECONDS else 0

    def close(self) -> None:
        self.closed = True
