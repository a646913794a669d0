"""Where a request's work runs: inline on the event loop when it is small, else on a kernel
thread, held to the memory budget. One copy for every door (v1 operators, V2, gRPC, models).

A small request (its body under INLINE_BODY_BYTES, uncompressed) runs inline first with an
output allowance of INLINE_OUTPUT_BYTES and nothing reserved, so it never waits behind large
ones; a kernel about to produce more raises RunOffLoop, and the work starts again on a thread
once the memory it already holds (`Work.holding`) is reserved. A large request reserved its
body as it arrived and runs on a thread from the start; what the work allocates there it
claims from the reservation first (memory_budget.py), waiting on the loop when the budget is
short (503 after OPSERVE_MEMORY_WAIT_SECONDS)."""

import time
from typing import Protocol, TypeVar

from service.core.memory_budget import Reservation
from service.core.offload import INLINE_OUTPUT_BYTES, Offloader
from service.core.statistics import ModelStatistics, Timings
from service.kernels.context import KernelContext, RunOffLoop

T = TypeVar("T")
T_co = TypeVar("T_co", covariant=True)


class Work(Protocol[T_co]):
    """A request's work from its body to its answer: pure, so it may run again from the start
    (after RunOffLoop, or after NeedMemory on a thread)."""

    @property
    def holding(self) -> int:
        """Bytes the work holds when an inline attempt moves to a thread (its body at least)."""

    @property
    def timings(self) -> Timings:
        """The phase times of the work's last attempt (for the model's statistics)."""

    def __call__(self, ctx: KernelContext) -> T_co:
        """Do the work under `ctx`'s limits and claims."""


class Execution:
    """Runs work inline or on the kernel threads, with the output and answer limits."""

    def __init__(self, offloader: Offloader, max_output_bytes: int,
                 max_answer_bytes: int | None) -> None:  # fmt: skip
        self.offloader = offloader
        self.max_output_bytes = max_output_bytes
        self.max_answer_bytes = max_answer_bytes
        # one context for every inline attempt: frozen, and building one costs on the hot path
        self.inline = KernelContext(max_output_bytes, INLINE_OUTPUT_BYTES,
                                    max_answer_bytes=max_answer_bytes)  # fmt: skip

    def on_thread(self, held: Reservation) -> KernelContext:
        """The context of work on a kernel thread: no inline allowance, claims from `held`."""
        return KernelContext(self.max_output_bytes, None, max_answer_bytes=self.max_answer_bytes,
                             claims=held)  # fmt: skip

    async def run(self, work: Work[T], held: Reservation, inline: bool,
                  stats: ModelStatistics | None = None) -> T:  # fmt: skip
        """The work's answer: inline first when `inline`, else (or when it turns out large) on a
        kernel thread, retried whenever the budget had to be waited for. With `stats`, the
        request is counted there (its phases, or its failure)."""
        if stats is None:
            return await self._run(work, held, inline)
        arrived = time.perf_counter_ns()
        try:
            answer = await self._run(work, held, inline)
        except Exception:
            stats.failed(arrived)
            raise
        stats.succeeded(arrived, work.timings)
        return answer

    async def _run(self, work: Work[T], held: Reservation, inline: bool) -> T:
        if inline:
            try:
                return work(self.inline)
            except RunOffLoop:  # the output is large: start again on a thread, budgeted
                await held.grow(work.holding)
        ctx = self.on_thread(held)
        return await held.run(lambda: self.offloader.on_thread(work, ctx))
