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

    def try_enter(self) -> int | None:
        """A lease now (FREE or the bytes taken from the budget), or None."""
        if self.free:
            self.free -= 1
            return FREE
        if self.budget.try_take(self.message_bytes, lease=True):
            return self.message_bytes
        return None

    async def enter(self) -> int:
        """A lease, waited for on the loop (an Overloaded refusal after the budget's wait)."""
        return await self.budget.waited(self.try_enter, self.message_bytes)

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
