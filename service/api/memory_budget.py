"""One memory budget for the whole process, shared by every large request.

A large request reserves what it will hold (body bytes as they arrive, the decoding estimate,
the kernel's output, the encoded answer) before it allocates, and gives it all back once the
last byte of its answer is sent. A reservation that cannot be had within `wait_seconds` is
refused with 503 and `Retry-After`; one bigger than the whole budget could never be had and is
refused at once with 413. Small requests (inline, see offload.py) never touch the budget, so
they never wait behind large ones.

Reservations are taken on the event loop (body chunks, `await Reservation.grow`) and on kernel
threads (decoding and outputs, `Reservation.grow_blocking`), so the count sits behind a
threading lock; the event loop never blocks on it, it polls.

Applying it to a route (the lead's merge):

    async with budget.reservation() as held:       # released after the last byte is sent
        body = await read_body(receive, max_bytes, deadline, held)
        ...work on a thread, calling held.grow_blocking(n) before allocating n bytes...
        ...send the answer...
"""

import asyncio
import threading
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from service.errors import Overloaded, PayloadTooLarge, shown_int

_POLL_SECONDS = 0.005


class MemoryBudget:
    """`total_bytes` shared by all large requests; waits up to `wait_seconds` for a share."""

    def __init__(self, total_bytes: int, wait_seconds: float) -> None:
        self.total_bytes = total_bytes
        self.wait_seconds = wait_seconds
        self.used = 0
        self._freed = threading.Condition()

    def try_take(self, nbytes: int) -> bool:
        """Take `nbytes` if they are free now."""
        self.check_fits(nbytes)
        with self._freed:
            if self.used + nbytes > self.total_bytes:
                return False
            self.used += nbytes
            return True

    def take_blocking(self, nbytes: int) -> None:
        """Take `nbytes`, waiting on this (non-event-loop) thread; 503 after `wait_seconds`."""
        self.check_fits(nbytes)
        deadline = time.monotonic() + self.wait_seconds
        with self._freed:
            while self.used + nbytes > self.total_bytes:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise self._overloaded(nbytes)
                self._freed.wait(left)
            self.used += nbytes

    async def take(self, nbytes: int) -> None:
        """Take `nbytes` without blocking the event loop; 503 after `wait_seconds`."""
        if self.try_take(nbytes):
            return
        deadline = time.monotonic() + self.wait_seconds
        while time.monotonic() < deadline:
            await asyncio.sleep(_POLL_SECONDS)
            if self.try_take(nbytes):
                return
        raise self._overloaded(nbytes)

    def release(self, nbytes: int) -> None:
        """Give back `nbytes`; waiting threads look again."""
        with self._freed:
            self.used -= nbytes
            self._freed.notify_all()

    @asynccontextmanager
    async def reservation(self) -> AsyncIterator["Reservation"]:
        """A reservation that starts empty and is released, whole, when the block ends."""
        held = Reservation(self)
        try:
            yield held
        finally:
            held.release()

    def check_fits(self, nbytes: int) -> None:
        """Refuse (413) a share the budget could never give."""
        if nbytes > self.total_bytes:
            raise PayloadTooLarge(
                f"the request would hold {shown_int(nbytes)} bytes of memory, over the memory "
                f"budget of {self.total_bytes} bytes (OPSERVE_MEMORY_BUDGET_BYTES)"
            )

    def _overloaded(self, nbytes: int) -> Overloaded:
        return Overloaded(
            f"the server is busy: {shown_int(nbytes)} bytes of its memory budget were not free "
            f"within {self.wait_seconds:g} s; retry later"
        )


class Reservation:
    """What one request holds of the budget; it only grows, and is released once."""

    __slots__ = ("budget", "held")

    def __init__(self, budget: MemoryBudget) -> None:
        self.budget = budget
        self.held = 0

    async def grow(self, nbytes: int) -> None:
        """Hold `nbytes` more (event loop)."""
        self.budget.check_fits(self.held + nbytes)
        await self.budget.take(nbytes)
        self.held += nbytes

    def grow_blocking(self, nbytes: int) -> None:
        """Hold `nbytes` more (kernel thread)."""
        self.budget.check_fits(self.held + nbytes)
        self.budget.take_blocking(nbytes)
        self.held += nbytes

    def shrink(self, nbytes: int) -> None:
        """Give back `nbytes` of what is held, once they are freed."""
        nbytes = min(nbytes, self.held)
        self.budget.release(nbytes)
        self.held -= nbytes

    def release(self) -> None:
        """Give back everything held."""
        if self.held:
            self.budget.release(self.held)
            self.held = 0
