"""Where a request's work runs: inline on the event loop when it is small, else on a kernel
thread, held to the memory budget. One copy for every door (v1 operators, V2, gRPC, models).

A small request (its body under INLINE_BODY_BYTES, uncompressed) runs inline first with an
output allowance of INLINE_OUTPUT_BYTES and nothing reserved, so it never waits behind large
ones; a kernel about to produce more raises RunOffLoop, and the work starts again on a thread
once the memory it already holds (`Work.holding`) is reserved. A large request reserved its
body as it arrived and runs on a thread from the start; what the work allocates there it
claims from the reservation first (memory_budget.py), waiting on the loop when the budget is
short (503 after OPSERVE_MEMORY_WAIT_SECONDS).

Work on a thread runs under a RunControl (runtime/run_control.py): a graph stops between two
nodes once past OPSERVE_MAX_RUN_SECONDS (504), once its client has left (`disconnected`
returns) or its request task is cancelled, or when the server shuts down (`stop_all`). The
request waits for its thread only a little past that (core/stuck_runs.py): a native kernel
that never stops leaves its thread behind, counted, and the request still answers. At most
`threads + max_queued` works wait for or run on the kernel threads; past that, 503 with
Retry-After, so a flood of large requests never builds a queue without bound.

A small request on a client's model (run in the isolated workers) stops its inline attempt at
the model's run (InWorker); the loop awaits the worker itself, under the same deadline and
stops, and answers inline with the reply (engines/workers/on_loop.py): no thread hop."""

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import replace
from functools import partial
from typing import Any, Protocol, TypeVar

from service.core.memory_budget import Reservation
from service.core.offload import INLINE_OUTPUT_BYTES, Offloader
from service.core.statistics import ModelStatistics, Timings
from service.core.stuck_runs import GIVE_UP_SECONDS, LeftBehind, ThreadWait
from service.engines.workers.on_loop import Answered, InWorker, LoopRun
from service.errors import Overloaded
from service.kernels.context import InlineAttempt, KernelContext, RunOffLoop
from service.runtime.run_control import CLIENT_LEFT, SHUTTING_DOWN, RunControl

Disconnected = Callable[[], Awaitable[Any]]
"""Returns once the request's client has gone (the door's way of noticing it)."""

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
                 max_answer_bytes: int | None, max_run_seconds: float = 30.0,
                 max_queued: int = 64, fallback: Any = None) -> None:  # fmt: skip
        self.offloader = offloader
        self.max_output_bytes = max_output_bytes
        self.max_answer_bytes = max_answer_bytes
        self.max_run_seconds = max_run_seconds
        self.max_waiting = offloader.threads + max_queued
        self.fallback = fallback  # the worker pool for graphs with onnx.reference nodes
        # of the works on (or waiting for) threads, and of runs awaited on the loop
        self.waits: set[ThreadWait | LoopRun] = set()
        self.left_behind = LeftBehind(offloader.threads)
        self.stopping = False
        # one context for every inline attempt: frozen, and building one costs on the hot path;
        # its `attempt` is set as each starts
        self.attempt = InlineAttempt()
        self.inline = KernelContext(max_output_bytes, INLINE_OUTPUT_BYTES,
                                    max_answer_bytes=max_answer_bytes,
                                    attempt=self.attempt)  # fmt: skip

    def on_thread(self, held: Reservation, control: RunControl | None = None) -> KernelContext:
        """The context of work on a kernel thread: no inline allowance, claims from `held`."""
        return KernelContext(self.max_output_bytes, None, max_answer_bytes=self.max_answer_bytes,
                             claims=held, control=control)  # fmt: skip

    async def run(self, work: Work[T], held: Reservation, inline: bool,
                  stats: ModelStatistics | None = None,
                  disconnected: Disconnected | None = None) -> T:  # fmt: skip
        """The work's answer: inline first when `inline`, else (or when it turns out large) on a
        kernel thread, retried whenever the budget had to be waited for. With `stats`, the
        request is counted there (its phases, or its failure); with `disconnected`, a run on
        a thread is stopped when the client leaves."""
        if stats is None:
            return await self._run(work, held, inline, disconnected)
        arrived = time.perf_counter_ns()
        try:
            answer = await self._run(work, held, inline, disconnected)
        except Exception as exc:
            stats.failed(arrived, exc)
            raise
        stats.succeeded(arrived, work.timings)
        return answer

    async def _run(self, work: Work[T], held: Reservation, inline: bool,
                   disconnected: Disconnected | None) -> T:  # fmt: skip
        fallback = self.fallback
        if inline:
            try:
                self.attempt.begin()
                return work(self.inline)
            except InWorker as asked:  # a client's model: the loop awaits its worker's run
                answered = await self._in_worker(asked, disconnected)
                if answered is not None:
                    try:
                        return self._answered(work, answered)
                    except RunOffLoop:  # a large answer, taken on a thread
                        fallback = answered
                    finally:
                        if fallback is not answered:  # its files, if it was not taken
                            answered.close()
                await held.grow(work.holding)
            except RunOffLoop:  # the output is large: start again on a thread, budgeted
                await held.grow(work.holding)
        if len(self.waits) >= self.max_waiting:
            raise Overloaded(f"the server is busy: {len(self.waits)} runs wait for or run "
                             "on its kernel threads (OPSERVE_KERNEL_THREADS, "
                             "OPSERVE_MAX_QUEUED_RUNS); retry later")  # fmt: skip
        if self.left_behind.every_slot:
            raise Overloaded(self.left_behind.refusal())
        control = RunControl(self.max_run_seconds, fallback, self.offloader.off_core)
        if self.stopping:
            control.cancel(SHUTTING_DOWN)
        ctx = self.on_thread(held, control)
        wait = ThreadWait(control)
        self.waits.add(wait)
        # the client is watched only once a run takes a while: a task per short run would cost
        # more than the run's thread hop itself
        watch = (
            ClientWatch(disconnected, partial(wait.cancel, CLIENT_LEFT)) if disconnected else None
        )
        try:
            return await held.run(lambda: self._on_thread(work, ctx, wait, held))
        finally:
            self.waits.discard(wait)
            wait.close()
            if watch is not None:
                watch.stop()
            if isinstance(fallback, Answered):
                fallback.close()

    async def _in_worker(self, asked: InWorker,
                         disconnected: Disconnected | None) -> Answered | None:  # fmt: skip
        """The worker's reply to a small run of a client's model, awaited on the loop
        (engines/workers/on_loop.py); None: the run goes to a thread instead."""
        if self.fallback is None:
            return None
        control = RunControl(self.max_run_seconds, self.fallback)
        if self.stopping:
            control.cancel(SHUTTING_DOWN)
        run = LoopRun(self.fallback, control)
        self.waits.add(run)
        watch = (
            ClientWatch(disconnected, partial(run.cancel, CLIENT_LEFT)) if disconnected else None
        )
        try:
            return await run.answer(asked)
        finally:
            self.waits.discard(run)
            if watch is not None:
                watch.stop()

    def _answered(self, work: Work[T], answered: Answered) -> T:
        """The work again, inline, its model's run answered by the reply; counted as one
        attempt from the first one's start, the worker's wait in compute_infer."""
        started = work.timings.started
        self.attempt.begin()  # the loop was free while the worker ran
        try:
            return work(replace(self.inline, control=answered, variants={}))
        finally:  # an answer encoded on a thread (RunOffLoop) keeps this attempt's run too
            work.timings.started = started
            work.timings.compute_infer += answered.waited

    async def _on_thread(self, work: Work[T], ctx: KernelContext, wait: ThreadWait,
                         held: Reservation) -> T:  # fmt: skip
        """One attempt on a thread; a run whose thread outlives the wait is left behind, with
        what its request holds of the budget."""
        thread_run = self.offloader.submit(work, ctx)
        try:
            return await wait.result(thread_run)
        except asyncio.CancelledError:
            if thread_run.cancel() or thread_run.done():  # never started, or ended just now
                if not wait.gave_up:
                    raise
                if thread_run.cancelled():
                    raise wait.control.stopped() or wait.control.timeout(
                        "its wait for a kernel thread") from None  # fmt: skip
                return thread_run.result()
            if wait.gave_up:  # past its deadline or stop, and the thread still runs it
                self.left_behind.add(thread_run, wait.control, held.budget, held.detach())
                raise wait.control.abandoned() from None
            # the request's task ended: the run is stopped, and has a while to come back
            wait.control.cancel(CLIENT_LEFT)
            self.left_behind.add(thread_run, wait.control, held.budget, held.detach(),
                                 GIVE_UP_SECONDS)  # fmt: skip
            raise
        finally:
            # a failed attempt's future holds its exception, whose traceback holds this frame
            # and so the future: a cycle that kept what the attempt made (three decoded 300 MB
            # bodies at once, past the budget) until the collector ran; NeedMemory retries
            del thread_run

    def start(self) -> None:
        """Serving (again: a new lifespan after a shutdown)."""
        self.stopping = False
        if self.fallback is not None:
            self.fallback.closed = False

    def stop_all(self) -> None:
        """Shutting down: every run on a thread stops at its next node, and new ones at once
        (their kernel threads are then free for the process to exit)."""
        self.stopping = True
        for wait in list(self.waits):
            wait.cancel(SHUTTING_DOWN)
        if self.fallback is not None:
            self.fallback.close()


WATCH_AFTER_SECONDS = 0.1
"""A run on a thread still going after this long starts watching for its client leaving."""


class ClientWatch:
    """Calls `left()` when `disconnected()` returns, from WATCH_AFTER_SECONDS on (a task per
    short run or wait would cost more than the run's thread hop itself): a run on a thread is
    cancelled, a queued request (core/batcher.py) taken out of its queue."""

    __slots__ = ("disconnected", "left", "task", "timer")

    def __init__(self, disconnected: Disconnected, left: Callable[[], object]) -> None:
        self.disconnected, self.left = disconnected, left
        self.task: asyncio.Future[None] | None = None
        self.timer = asyncio.get_running_loop().call_later(WATCH_AFTER_SECONDS, self._start)

    def _start(self) -> None:
        self.task = asyncio.ensure_future(self._watch())

    async def _watch(self) -> None:
        await self.disconnected()
        self.left()

    def stop(self) -> None:
        self.timer.cancel()
        if self.task is not None:
            self.task.cancel()
