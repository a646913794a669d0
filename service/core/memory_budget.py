"""One memory budget for the whole process, shared by every large request.

A large request reserves what it will hold (body bytes as they arrive, the decoding estimate,
the kernel's output, the encoded answer) before it allocates, and gives it all back once the
last byte of its answer is sent. A reservation that cannot be had within `wait_seconds` is
refused with 503 and `Retry-After`; one bigger than the whole budget could never be had and is
refused at once with 413. Small requests (inline, see offload.py) never touch the budget, so
they never wait behind large ones.

Waiting happens on the event loop only, never on a kernel thread (a waiting thread would stall
the work of the requests that do have their share). Work on a thread claims what it needs with
`Reservation.claim`, which takes free memory at once or raises NeedMemory; the caller then
waits for that much on the loop (`await held.grow(n)`) and runs the (pure) work again, which
finds its claims covered. The count sits behind a threading lock; the loop polls it.

What outlives a request (sequences' implicit state, core/sequence_claims.py) is taken with
`try_keep` up to a cap of its own and given back with `unkeep`; the budget counts it as used,
but "idle" (for the heap trim) means that no request holds any of it.

Applying it to a route (the lead's merge):

    async with budget.reservation() as held:       # released after the last byte is sent
        body = await read_body(receive, max_bytes, deadline, held)
        answer = await held.run(lambda: offloader.on_thread(work, body, held.claim))
        ...send the answer (its memory is still held)...
"""

import asyncio
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import TypeVar

from service.errors import Overloaded, PayloadTooLarge, shown_int

_POLL_SECONDS = 0.005
T = TypeVar("T")


class NeedMemory(Exception):
    """A claim made on a kernel thread found too little free: wait for `nbytes` on the loop."""

    def __init__(self, nbytes: int) -> None:
        super().__init__(nbytes)
        self.nbytes = nbytes


class MemoryBudget:
    """`total_bytes` shared by all large requests; waits up to `wait_seconds` for a share."""

    def __init__(self, total_bytes: int, wait_seconds: float) -> None:
        self.total_bytes = total_bytes
        self.wait_seconds = wait_seconds
        self.used = 0
        self.kept = 0  # of `used`, what is held past any one request (try_keep)
        self._lock = threading.Lock()
        self.on_idle: Callable[[], None] | None = None
        """Called (on the releasing thread) when a release leaves no request holding any of
        it after memory was used (more than leases held, below): the app trims the heap once it
        stays so (heap_trim.py)."""
        self.used_since_idle = False

    @property
    def busy(self) -> bool:
        """Whether a request holds some of the budget (what is kept does not count)."""
        return self.used > self.kept

    def try_take(self, nbytes: int, lease: bool = False) -> bool:
        """Take `nbytes` if they are free now. A `lease` (core/message_room.py: room for a
        message not yet seen, given back within microseconds for a small one) is counted as
        any share, but does not by itself make the budget's return to idle worth a trim."""
        self.check_fits(nbytes)
        with self._lock:
            if self.used + nbytes > self.total_bytes:
                return False
            self.used += nbytes
            if not lease:
                self.used_since_idle = True
            return True

    async def take(self, nbytes: int) -> None:
        """Take `nbytes` without blocking the event loop; 503 after `wait_seconds`."""
        await self.waited(lambda: True if self.try_take(nbytes) else None, nbytes)

    async def waited(self, attempt: Callable[[], T | None], nbytes: int) -> T:
        """What `attempt` gives once it gives something (not None), tried now and then every
        few milliseconds on the loop; the 503 for `nbytes` after `wait_seconds` without."""
        got = attempt()
        if got is not None:
            return got
        deadline = time.monotonic() + self.wait_seconds
        while time.monotonic() < deadline:
            await asyncio.sleep(_POLL_SECONDS)
            got = attempt()
            if got is not None:
                return got
        raise self.overloaded(nbytes)

    def release(self, nbytes: int) -> None:
        """Give back `nbytes`."""
        with self._lock:
            self.used -= nbytes
            idle = self.used == self.kept and self.used_since_idle
            if idle:
                self.used_since_idle = False
        if idle and self.on_idle is not None:
            self.on_idle()

    def try_keep(self, nbytes: int, most: int) -> bool:
        """Take `nbytes` to hold past any one request (any thread), if free now and what is
        kept stays within `most`; never waits."""
        with self._lock:
            if self.used + nbytes > self.total_bytes or self.kept + nbytes > most:
                return False
            self.used += nbytes
            self.kept += nbytes
            self.used_since_idle = True
            return True

    def unkeep(self, nbytes: int) -> None:
        """Give back `nbytes` taken with `try_keep`."""
        with self._lock:
            self.kept -= nbytes
            self.used -= nbytes
            idle = self.used == self.kept
        if idle and self.on_idle is not None:
            self.on_idle()

    def freed(self) -> None:
        """Memory was freed outside any reservation (an unloaded model): when nothing is held,
        the app trims the heap as after a release (on_idle)."""
        with self._lock:
            idle = self.used == self.kept  # no request holds any (live sequences may)
            self.used_since_idle = False
        if idle and self.on_idle is not None:
            self.on_idle()

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

    def overloaded(self, nbytes: int) -> Overloaded:
        """The 503 for a share of `nbytes` that was not free in time."""
        return Overloaded(
            f"the server is busy: {shown_int(nbytes)} bytes of its memory budget were not free "
            f"within {self.wait_seconds:g} s; retry later"
        )


class Reservation:
    """What one request holds of the budget; it only grows, and is released once."""

    __slots__ = ("budget", "claimed", "held", "kept")

    def __init__(self, budget: MemoryBudget) -> None:
        self.budget = budget
        self.held = 0
        self.kept = 0  # held for the whole request (the body), apart from the work's claims
        self.claimed = 0  # claimed by the current attempt of the work

    def claim(self, nbytes: int) -> None:
        """Claim `nbytes` for the work (any thread): from what is held and unclaimed, else from
        the budget if free now, else NeedMemory (the caller waits on the loop, then retries)."""
        self.budget.check_fits(self.kept + self.claimed + nbytes)
        short = self.kept + self.claimed + nbytes - self.held
        if short > 0:
            if not self.budget.try_take(short):
                raise NeedMemory(short)
            self.held += short
        self.claimed += nbytes

    def unclaim(self, nbytes: int) -> None:
        """Give back a claim of the current attempt whose memory was freed: it stays held, so
        later claims of the work take it first (a graph claims its peak, not its total)."""
        self.claimed -= min(nbytes, self.claimed)

    async def run(self, work: Callable[[], Awaitable[T]]) -> T:
        """Await `work()` until its claims are covered; each NeedMemory waits (503 after the
        budget's wait) for the shortfall, and the work runs again from the start."""
        self.kept = self.held
        while True:
            self.claimed = 0
            try:
                return await work()
            except NeedMemory as need:
                short = need.nbytes
            # waited for outside the except clause: the exception's traceback holds the failed
            # attempt's frames, and with them what it had made (a half-inflated message)
            await self.grow(short)

    def try_grow(self, nbytes: int) -> bool:
        """Hold `nbytes` more if they are free now."""
        self.budget.check_fits(self.held + nbytes)
        if not self.budget.try_take(nbytes):
            return False
        self.held += nbytes
        return True

    def adopt(self, nbytes: int) -> None:
        """Hold `nbytes` taken from the budget already (a lease of core/message_room.py), now
        memory in use."""
        self.held += nbytes
        self.budget.used_since_idle = True

    async def grow(self, nbytes: int) -> None:
        """Hold `nbytes` more (event loop: waits, then 503)."""
        self.budget.check_fits(self.held + nbytes)
        await self.budget.take(nbytes)
        self.held += nbytes

    def shrink(self, nbytes: int) -> None:
        """Give back `nbytes` of what is held, once they are freed."""
        nbytes = min(nbytes, self.held)
        self.budget.release(nbytes)
        self.held -= nbytes

    def detach(self) -> int:
        """Stop holding what is held, without giving it back: a kernel thread its request
        left still uses it (core/stuck_runs.py gives it back once the thread returns)."""
        nbytes, self.held = self.held, 0
        return nbytes

    def release(self) -> None:
        """Give back everything held."""
        if self.held:
            self.budget.release(self.held)
            self.held = 0
