"""Idle sequences released at their own deadlines, whatever other traffic there is.

Triton's sequence batcher has a reaper thread that sleeps until the soonest idle deadline
(core sequence_batch_scheduler.cc ReaperThread). Ours is an asyncio task on the server's loop
(HTTP's and gRPC's: one core) that does the same: it sleeps until the soonest deadline of the
sequences' table, sweeps what is due, and is woken early when a sooner deadline appears (a
model with a shorter idle time). The app's lifespan starts it and cancels it at shutdown.

Anything with `clock`, `next_idle()`, `sweep(now)` and an `on_deadline` hook can be swept (the
cluster's table of issue 26 as well as sequences.py's).
"""

import asyncio
import logging
import math
from collections.abc import Callable
from contextlib import suppress
from typing import Protocol

log = logging.getLogger("opserve")

LONGEST_SLEEP = 1.0  # seconds: a wake that was missed costs at most this
PAST_DEADLINE = 0.001  # idle means past the deadline: wake just after it


class Sweepable(Protocol):
    """A table of sequences with idle deadlines."""

    clock: Callable[[], float]
    on_deadline: Callable[[float], None] | None

    def next_idle(self) -> float:
        """The soonest idle deadline (a lower bound; inf when none)."""
        ...

    def sweep(self, now: float | None = None) -> int:
        """Release what is idle at `now`; how many were."""
        ...


class IdleSweeper:
    """Sweeps `sequences` at their deadlines on the running loop, between `start` and `stop`."""

    def __init__(self, sequences: Sweepable, longest_sleep: float = LONGEST_SLEEP) -> None:
        self.sequences = sequences
        self.longest_sleep = longest_sleep
        self.sweeps = 0  # sweeps that released something (for tests and curiosity)
        self._task: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()
        self._waking_at = math.inf

    def start(self) -> None:
        """Start sweeping (on the running loop)."""
        self._wake = asyncio.Event()  # of this loop: an app may be started on more than one
        self.sequences.on_deadline = self._deadline
        self._task = asyncio.get_running_loop().create_task(self._run(),
                                                            name="opserve-sequence-sweep")  # fmt: skip

    async def stop(self) -> None:
        """Stop sweeping."""
        self.sequences.on_deadline = None
        if self._task is not None:
            self._task.cancel()
            with suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    def _deadline(self, at: float) -> None:
        if at < self._waking_at:
            self._wake.set()

    async def _run(self) -> None:
        while True:
            now = self.sequences.clock()
            soonest = self.sequences.next_idle()
            if soonest < now:
                if not self._sweep(now):  # no busy loop on a bug: try again a sleep later
                    await asyncio.sleep(self.longest_sleep)
                continue
            self._waking_at = soonest
            self._wake.clear()
            with suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(),
                                       min(soonest - now + PAST_DEADLINE, self.longest_sleep))  # fmt: skip
            self._waking_at = math.inf

    def _sweep(self, now: float) -> bool:
        """Sweep; False when the sweep failed (a bug must not end the sweeps: it is logged)."""
        try:
            if self.sequences.sweep(now):
                self.sweeps += 1
        except Exception:
            log.exception("the idle sequence sweep failed")
            return False
        return True
