"""When a run on onnxruntime may take the event loop instead of a kernel thread.

A thread hop costs 0.1-0.25 ms on a small host (measured on 2 shared cores, bench/
bench_engines.py), as much as a small model's whole run: a quick model's small request pays
more for the hop than for its answer. So, as an operator's small call does (core/offload.py),
it runs inline when all of these hold:

- the request is small (the door's rule: its body under INLINE_BODY_BYTES, uncompressed);
- the model has no subgraph (If, Loop, Scan, or any node holding a graph): a Loop's or
  Scan's time follows the values of their inputs, and onnxruntime looks at
  RunOptions.terminate only between kernels, so a Loop whose body has no kernel to stop
  between runs on past any leash; an If runs the branch a value picks, so quick runs of one
  branch say nothing of the other (one heavy MatMul there held the loop 0.76-2.5 s);
- the model is quick: of its last QUICK_RUNS runs (on threads or inline, answered or failed)
  at most SLOW_RUNS took longer than QUICK_RUN_SECONDS, and since the last run that took
  longer than HELD_SECONDS it ran QUICK_RUNS times at least; a model starts on threads, and
  one run past HELD_SECONDS, or a fifth slow one in sixteen, sends it back. A few slow runs
  are let pass because a quick model's first run after an idle moment is one: the host's
  cores and caches are cold (a 0.45 ms CNN's first run after 0.1 s idle took 1.5-3 ms on
  this VM); with every slow run counting, a model called in bursts of under QUICK_RUNS calls
  never ran inline, and paid the thread hop (0.13 ms) and the kernel thread's cold wake-up
  on every call (2.5 ms a call against 1.6 ms inline, bench/bench_engines.py's turns). A
  run let pass holds the loop at most HELD_SECONDS, which is what any inline run may, and a
  client whose inputs make runs slow gets at most SLOW_RUNS + 1 of every QUICK_RUNS runs
  inline that way (the old rule let one in QUICK_RUNS + 1 pass);
- the run's memory estimate (onnxruntime/memory.py) for these inputs was made already (on a thread:
  making it may infer shapes again), knows every value's size (a data-dependent one, as
  NonZero's: not inline) and is at most the inline output allowance (SMALL_BYTES), as an
  operator's inline output is.

A run inline is watched twice, and both watches time the whole inline attempt it is part of,
from the attempt's start (kernels/context.py's InlineAttempt): an ensemble runs all its steps
in one attempt, and sixteen quick steps each held to HELD_SECONDS would hold the loop sixteen
times that. The stopper (onnxruntime/stop.py) stops a run once the attempt is past
LEASH_SECONDS (it wakes at a run's deadline), the request starts again on a thread
(RunOffLoop), and the gate closes for good for that loaded version. A run is not begun once the
attempt held the loop HELD_SECONDS already: the request starts again on a thread. And any
inline attempt, answered or not, that held the loop longer than HELD_SECONDS by the end of a
model's run (or before it, as just said) sends that model back to threads until it has been
quick for twice as many runs as the last time (32, 64, 128... runs): a host that paused the
process once (a busy VM) costs a few runs on threads, and a client whose inputs make runs
slow holds the loop once per doubling, so ever more rarely; an ensemble whose steps together
are not quick stops running inline the same way (it runs inline only while every step may).
A kernel's time is bounded by its inputs' sizes (a small body) and its sizes are known, and
without subgraphs each run of the model runs the same kernels, which the quick runs timed: so
one attempt holds the loop at most the leash and the kernel running when it passes.
"""

from itertools import chain

from onnx import ModelProto

from service.engines.onnxruntime.stop import POLL_SECONDS
from service.runtime.subgraphs import subgraphs

QUICK_RUN_SECONDS = 0.001
QUICK_RUNS = 16
SLOW_RUNS = 4  # of the last QUICK_RUNS runs, how many may be slower than QUICK_RUN_SECONDS
HELD_SECONDS = 0.005
_LAST_RUNS = (1 << QUICK_RUNS) - 1  # the bits of InlineGate.slow: one per recent run
LEASH_SECONDS = POLL_SECONDS


class InlineGate:
    """One loaded model's record of its runs' times, and whether it may run inline. Written
    from the kernel threads and the loop without a lock: a lost update only delays a
    decision by a run, and `closed` only ever goes from False to True."""

    __slots__ = ("closed", "holds", "runs", "slow")

    def __init__(self, closed: bool = False) -> None:
        self.runs = 0  # runs since the last one past HELD_SECONDS (or the last hold)
        self.slow = 0  # bit i: the run i runs back took longer than QUICK_RUN_SECONDS
        self.holds = 0  # inline attempts that held the loop too long, so far
        self.closed = closed  # never inline (again): subgraphs, or a run past the leash

    @property
    def open(self) -> bool:
        """Quick: QUICK_RUNS runs since the last slow start, twice as many after each hold
        (holds: 1, 32), and at most SLOW_RUNS of the last QUICK_RUNS slower than quick."""
        return (not self.closed and self.runs >= QUICK_RUNS << min(self.holds, 40)
                and self.slow.bit_count() <= SLOW_RUNS)  # fmt: skip

    def ran(self, seconds: float) -> None:
        """A run (inline or on a thread, answered or failed) took `seconds`: past HELD_SECONDS,
        the count starts over."""
        if seconds > HELD_SECONDS:
            self.runs = self.slow = 0
        else:
            self.runs += 1
            self.slow = ((self.slow << 1) | (seconds > QUICK_RUN_SECONDS)) & _LAST_RUNS

    def held(self, seconds: float) -> None:
        """An inline attempt held the event loop `seconds` (its run and what came with it):
        too long, and the model must be quick for QUICK_RUNS * 2**holds runs in a row again
        (a run past HELD_SECONDS among them starts the count over, the doubled need stays)."""
        if seconds > HELD_SECONDS:
            self.spilled()

    def spilled(self) -> None:
        """An inline attempt held the loop too long, or its answer was too long to write on
        the loop (kernels/context.py's INLINE_JSON_ANSWER_BYTES) so that a thread runs it
        again: a hold, so that such a model runs on threads for ever longer stretches instead
        of holding the loop, or running twice, on every call."""
        self.holds += 1
        self.runs = 0

    def close(self) -> None:
        self.closed = True


def gate_for(model: ModelProto) -> InlineGate:
    """A new gate for `model`: closed for good when a node of its graph or of a local
    function holds a subgraph (any nested one is inside such a node)."""
    nodes = chain(model.graph.node, *(function.node for function in model.functions))
    return InlineGate(closed=any(next(subgraphs(node), None) is not None for node in nodes))
