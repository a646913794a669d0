"""core/stuck_runs.py through a real Execution: a work that ignores its run's control (as a
native kernel that never looks at RunOptions.terminate) is answered 504 just past its
deadline; its thread is counted stuck and keeps what its request held of the budget until
it returns; with every slot stuck a run is refused at once; a work still before its run (no
check yet: a load) is waited for as before."""

import asyncio
import threading
import time

import pytest

from service.core.execution import Execution
from service.core.memory_budget import MemoryBudget
from service.core.offload import Offloader
from service.core.statistics import Timings
from service.core.stuck_runs import GIVE_UP_SECONDS
from service.errors import Overloaded, RunTimeout
from service.kernels.context import KernelContext

DEADLINE = 0.3
HELD = 1000


class Deaf:
    """Enters its run (one check), then waits for `release`, never looking again."""

    holding = 0
    timings = Timings()

    def __init__(self, checks: bool = True) -> None:
        self.release = threading.Event()
        self.checks = checks

    def __call__(self, ctx: KernelContext) -> str:
        if self.checks and ctx.control is not None:
            ctx.control.check("deaf")
        self.release.wait(30)
        return "returned"


async def _run(execution: Execution, budget: MemoryBudget, work: Deaf) -> str:
    async with budget.reservation() as held:
        await held.grow(HELD)
        return await execution.run(work, held, inline=False)


def test_a_run_that_never_looks_is_left_behind_and_keeps_its_budget() -> None:
    budget = MemoryBudget(1 << 20, 1.0)
    offloader = Offloader(1)
    execution = Execution(offloader, 1 << 20, None, max_run_seconds=DEADLINE)
    deaf = Deaf()

    async def scenario() -> None:
        start = time.monotonic()
        with pytest.raises(RunTimeout, match="did not stop in deaf"):
            await _run(execution, budget, deaf)
        took = time.monotonic() - start
        assert DEADLINE + GIVE_UP_SECONDS <= took < DEADLINE + GIVE_UP_SECONDS + 2, took
        assert execution.left_behind.stuck == 1 and execution.left_behind.every_slot
        assert budget.used == HELD  # still the stuck thread's
        start = time.monotonic()
        with pytest.raises(Overloaded, match="OPSERVE_KERNEL_THREADS"):
            await _run(execution, budget, Deaf())
        assert time.monotonic() - start < 0.5
        deaf.release.set()  # the kernel comes back at last
        for _ in range(200):
            if not execution.left_behind.running:
                break
            await asyncio.sleep(0.01)
        assert execution.left_behind.stuck == 0 and budget.used == 0
        quick = Deaf()
        quick.release.set()
        assert await _run(execution, budget, quick) == "returned"

    try:
        asyncio.run(scenario())
    finally:
        deaf.release.set()
        offloader.close()


def test_work_before_its_run_is_waited_for() -> None:
    """No check yet (a posted model loading): past its deadline it is still waited for."""
    budget = MemoryBudget(1 << 20, 1.0)
    offloader = Offloader(1)
    execution = Execution(offloader, 1 << 20, None, max_run_seconds=DEADLINE)
    loading = Deaf(checks=False)
    threading.Timer(DEADLINE + 3 * GIVE_UP_SECONDS, loading.release.set).start()
    try:
        assert asyncio.run(_run(execution, budget, loading)) == "returned"
        assert execution.left_behind.running == 0 and budget.used == 0
    finally:
        loading.release.set()
        offloader.close()
