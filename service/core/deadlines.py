"""Deadlines for the steps every door takes on each request: a body or message read, an
answer written. One ticker task per event loop keeps them all (`DEADLINES`), so a step costs two
dict operations instead of a timer of its own; HTTP's body reads (service/api/body_limit.py) and
gRPC's message reads and answer writes (service/grpc/door.py) share it."""

import asyncio
import threading
from collections.abc import Awaitable, Callable
from typing import TypeVar

from service.errors import RequestTimeout

T = TypeVar("T")


async def before_deadline(read: Awaitable[T], timeout: float) -> T:
    """`await read` (a request's message, on gRPC) under the body deadline: 408 past it."""
    return await within(read, timeout, lambda: body_timeout(timeout))


async def within(step: Awaitable[T], timeout: float, late: Callable[[], Exception]) -> T:
    """`await step`, raising `late()` if it has not finished within `timeout` seconds (within
    _Deadlines.TICK): asyncio.timeout's effect, for a step taken on every request."""
    task = DEADLINES.start(timeout)
    try:
        return await step
    except asyncio.CancelledError:
        if DEADLINES.expired(task):
            raise late() from None
        raise
    finally:
        del DEADLINES.steps[task]


def body_timeout(seconds: float) -> RequestTimeout:
    """The 408 for a body that did not all arrive within `seconds`."""
    return RequestTimeout(
        f"the request body did not all arrive within {seconds:g} s (OPSERVE_BODY_TIMEOUT_SECONDS)"
    )


class _Deadlines:
    """The deadlines of every body read (and gRPC answer write) of a process, kept by one
    ticker task per event loop that cancels the steps past theirs (each then raises its
    error: 408 for a read). asyncio.timeout() per request would cost more than the rest of
    the body read (a timer scheduled and cancelled on every small request); registering here
    is two dict operations."""

    TICK = 0.25  # seconds: a deadline is met within this much

    def __init__(self) -> None:
        self.steps: dict[asyncio.Task, float] = {}  # task -> when its step must be done
        self.late: set[asyncio.Task] = set()
        self.ticker: asyncio.Task | None = None
        self.thread = 0  # the thread whose loop ran the ticker last

    def start(self, timeout: float) -> asyncio.Task:
        """Register the current task's read; its deadline is `timeout` seconds from now."""
        task = self._current_task()
        loop = task.get_loop()
        self.steps[task] = loop.time() + timeout
        if self.ticker is None or self.ticker.done() or self.ticker.get_loop() is not loop:
            self.ticker = loop.create_task(self._tick(loop))
        return task

    def _current_task(self) -> asyncio.Task:
        """asyncio.current_task(), asked of the loop of the last read when this thread runs it:
        without a loop, Python 3.11 finds the running one with a getpid() system call, 3% of a
        small request's time."""
        if self.ticker is not None and self.thread == threading.get_ident():
            task = asyncio.current_task(self.ticker.get_loop())
            if task is not None:
                return task
        task = asyncio.current_task()
        assert task is not None
        self.thread = threading.get_ident()
        return task

    def expired(self, task: asyncio.Task) -> bool:
        """Whether it was the deadline that cancelled `task` (its cancellation then undone:
        the caller raises its own error instead); False: the caller re-raises."""
        if task in self.late:
            self.late.discard(task)
            task.uncancel()
            return True
        return False

    async def _tick(self, loop: asyncio.AbstractEventLoop) -> None:
        # It runs until a tick finds nothing registered, so requests one after another share
        # one ticker: ending as soon as its step saw none, it was made again for each request
        # (a task each, 3-4 us) where reads complete without waiting.
        while True:
            await asyncio.sleep(self.TICK)
            if not self.steps:
                return
            now = loop.time()
            for task, deadline in list(self.steps.items()):
                if deadline <= now and task.get_loop() is loop and task not in self.late:
                    self.late.add(task)
                    task.cancel()


DEADLINES = _Deadlines()
