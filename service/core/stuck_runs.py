"""Runs whose kernel thread does not come back. A run is stopped from inside at its deadline,
when its client leaves or when the server stops: between two nodes on our kernels, through
RunOptions.terminate in onnxruntime. Some native kernels never look (onnxruntime 1.32's Loop
with an empty body, a Conv over a kernel with a zero-size dimension): their thread runs on,
spinning on its core, until the process ends.

So a request waits for its thread (`ThreadWait`) only until GIVE_UP_SECONDS after its run should
have stopped: it answers then (504 at its deadline), and the thread left behind is kept here
(`LeftBehind`) with the budget its request held, given back only when the thread returns.
One still in its run GIVE_UP_SECONDS after its stop is stuck (`opserve_stuck_runs`). Work
before the run (a body decoded, a posted model loaded) is not a run: its deadline is checked
as the run begins, and loads have bounds of their own.

A stuck thread keeps its kernel slot: the pool has OPSERVE_KERNEL_THREADS threads and makes
none in its place, since the stuck one spins on a core a replacement would have to share. Once
stuck threads hold every slot, a run that needs a thread is refused at once (503) and the
liveness routes fail, so the orchestrator restarts the replica: the only way to end a native
thread is to end its process, and on SIGTERM `exit_when_left_behind` does that past them.
"""

import asyncio
import logging
import os
import sys
import threading
import time
from concurrent.futures import Future
from typing import Any, TypeVar

from service.core.memory_budget import MemoryBudget
from service.runtime.run_control import RunControl

T = TypeVar("T")
GIVE_UP_SECONDS = 0.5
"""How long past its deadline (or its cancelling) a request still waits for its run's thread:
onnxruntime's stopper looks every 20 ms, and a kernel that honours terminate returns within
one kernel's time."""
log = logging.getLogger("opserve")


class ThreadWait:
    """A request's wait for its run on a kernel thread: over GIVE_UP_SECONDS after the run's
    deadline, or after `cancel`, whether the thread came back or not. Event loop only."""

    __slots__ = ("control", "future", "gave_up", "timer")

    def __init__(self, control: RunControl) -> None:
        self.control = control
        self.future: asyncio.Future[Any] | None = None
        self.gave_up = False
        self.timer = asyncio.get_running_loop().call_later(
            max(control.left(), 0.0) + GIVE_UP_SECONDS, self._give_up)  # fmt: skip

    def cancel(self, reason: str) -> None:
        """Stop the run (its client left, the server stops) and wait GIVE_UP_SECONDS more."""
        self.control.cancel(reason)
        self.timer.cancel()
        self.timer = asyncio.get_running_loop().call_later(GIVE_UP_SECONDS, self._give_up)

    async def result(self, thread_run: "Future[T]") -> T:
        """The run's result; CancelledError once given up (`gave_up` says which)."""
        self.future = asyncio.wrap_future(thread_run)
        if self.gave_up:
            self.future.cancel()
        try:
            return await self.future
        finally:
            self.future = None
            del thread_run  # a cycle otherwise: see Execution._on_thread

    def close(self) -> None:
        self.timer.cancel()

    def _give_up(self) -> None:
        if not self.control.running:  # not in its run yet (queued, loading): its first
            # check stops it, so the wait goes on as it did before a run could get stuck
            self.timer = asyncio.get_running_loop().call_later(GIVE_UP_SECONDS, self._give_up)
            return
        self.gave_up = True
        if self.future is not None:
            self.future.cancel()


class LeftBehind:
    """The runs whose request stopped waiting while their thread still ran them (any thread)."""

    def __init__(self, slots: int) -> None:
        self.slots = slots  # OPSERVE_KERNEL_THREADS
        # each run, and from when it counts as stuck
        self.runs: dict[Future[Any], tuple[RunControl, float]] = {}
        self.lock = threading.Lock()

    def add(self, thread_run: "Future[Any]", control: RunControl, budget: MemoryBudget,
            nbytes: int, grace: float = 0.0) -> None:  # fmt: skip
        """Keep `thread_run`, stuck once in its run (`control` checked) and still running
        `grace` s from now; give `nbytes` back to `budget` when it ends."""
        with self.lock:
            self.runs[thread_run] = (control, time.monotonic() + grace)

        def ended(_: "Future[Any]") -> None:
            with self.lock:
                self.runs.pop(thread_run, None)
            if nbytes:
                budget.release(nbytes)

        thread_run.add_done_callback(ended)  # at once when it ended already

    @property
    def running(self) -> int:
        """Threads still in a run their request left."""
        return len(self.runs)

    @property
    def stuck(self) -> int:
        """Of those, the ones past their grace: stuck (`opserve_stuck_runs`)."""
        now = time.monotonic()
        with self.lock:
            return sum(1 for control, since in self.runs.values()
                       if since <= now and control.running)  # fmt: skip

    @property
    def every_slot(self) -> bool:
        """Whether stuck threads hold every kernel slot (liveness fails)."""
        return self.stuck >= self.slots

    def refusal(self) -> str:
        return (f"every kernel thread ({self.slots}, OPSERVE_KERNEL_THREADS) is held by a "
                "model run that did not stop at its deadline (OPSERVE_MAX_RUN_SECONDS); this "
                "replica reports itself not live until it is restarted")  # fmt: skip


def exit_when_left_behind(left: LeftBehind, seconds: float = 2 * GIVE_UP_SECONDS) -> None:
    """Shutting down: if threads are still in runs after `seconds`, end the process then
    (exit status 0), since Python's exit would wait for them forever. A daemon thread, so a
    process whose threads all came back ends on its own."""
    if not left.running:
        return

    def end() -> None:
        time.sleep(seconds)
        if left.running:
            log.warning("exiting with %d kernel thread(s) still in model runs that did not "
                        "stop", left.running)  # fmt: skip
            for stream in (sys.stdout, sys.stderr):
                stream.flush()
            os._exit(0)

    threading.Thread(target=end, name="opserve-exit", daemon=True).start()
