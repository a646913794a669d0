"""Room for messages whose size is not known until they have arrived whole.

A door that cannot see a message's length before it holds all of it (gRPC: grpc core
gathers a whole message, up to the receive limit, once a read is asked for, and tells its
length only then) asks for room before it asks for the message: a lease of `message_bytes`,
three times the most one message may be (what the read holds at its peak: the message as
grpc core gathered it, the whole copy it makes, and the copy handed to Python). The first `free_reads` leases cost nothing: they are the fixed margin above the
budget, where small calls' reads pass (they end within microseconds) without touching the
budget. Any more are taken from the memory budget, and a read that finds neither waits on the
event loop for one, refused (RESOURCE_EXHAUSTED or 503, with the budget's retry hint) after
the budget's wait. Once the message is in (`claim`): a small one leaves its lease; a large one
keeps what it needs of a lease from the budget, or, on a free lease, takes it from the budget
at once or is refused at once: waiting there would keep small calls out of the free leases
for as long as the budget is full.

Reads that wait for a lease get one newest first: large messages hold the free lease for as
long as they take to arrive, and with a dozen of them waiting, a small call that drew lots
with them every few milliseconds could wait past the budget's wait and be refused (12 x 48 MiB
at once: a small call from another connection refused after 1 s). The newest waiter waits
for the lease in use now, at most; the oldest, which in a burst are the large calls a full
budget would refuse anyway, are refused after the budget's wait.

A client that asks and sends nothing holds its lease until the door's deadline for the
message (OPSERVE_BODY_TIMEOUT_SECONDS): the price of not knowing a message's size.
"""

from service.core.memory_budget import MemoryBudget, Reservation

READ_COPIES = 3
"""Copies of a message at the peak of its read (see MessageRoom)."""
FREE = 0
"""The lease of a free read (nothing taken from the budget)."""


class MessageRoom:
    """Leases for reads in progress: `free_reads` free, then the budget's."""

    def __init__(self, budget: MemoryBudget, message_bytes: int, free_reads: int) -> None:
        self.budget = budget
        # while a message is handed over, grpc holds it twice (as it came, and made whole) and
        # Python once: 3 x 48 MiB at the peak of one 48 MiB read, measured
        self.message_bytes = min(READ_COPIES * message_bytes, budget.total_bytes)
        self.free_reads = free_reads
        self.free = free_reads
        self.waiting: list[object] = []  # reads waiting for a lease, oldest first

    def try_enter(self) -> int | None:
        """A lease now (FREE or the bytes taken from the budget), or None."""
        if self.free:
            self.free -= 1
            return FREE
        if self.budget.try_take(self.message_bytes, lease=True):
            return self.message_bytes
        return None

    async def enter(self) -> int:
        """A lease, waited for on the loop, newest waiter first (an Overloaded refusal after
        the budget's wait)."""
        lease = self.try_enter()
        if lease is not None:
            return lease
        me = object()
        self.waiting.append(me)
        try:
            return await self.budget.waited(
                lambda: self.try_enter() if self.waiting[-1] is me else None, self.message_bytes)  # fmt: skip
        finally:
            self.waiting.remove(me)

    async def claim(self, lease: int, held: Reservation, nbytes: int) -> None:
        """Turn `lease` into `nbytes` held in `held` (what a message that came needs)."""
        if lease == FREE:
            self.free += 1
            if not held.try_grow(nbytes):
                raise self.budget.overloaded(nbytes)
            return
        held.adopt(lease)
        if nbytes > lease:
            await held.grow(nbytes - lease)
        else:
            held.shrink(lease - nbytes)

    def leave(self, lease: int) -> None:
        """Give back a lease from `enter` (once the message it was for is claimed, or gone)."""
        if lease == FREE:
            self.free += 1
        else:
            self.budget.release(lease)
