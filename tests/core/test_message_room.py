"""The message room: one free lease, then the budget's; a large message on the free lease is
claimed at once or refused at once; inflating claims every step before the next."""

import asyncio
import gzip
import zlib

import pytest

from service.codecs.compression import INFLATE_STEP, inflate_claimed, sniffed
from service.core.memory_budget import MemoryBudget, Reservation
from service.core.message_room import FREE, READ_COPIES, MessageRoom
from service.errors import BadRequest, Overloaded, PayloadTooLarge

MiB = 1 << 20


def test_the_free_lease_first_then_the_budget_then_a_refusal_with_a_retry_hint() -> None:
    budget = MemoryBudget(4 * READ_COPIES * MiB, wait_seconds=0.05)
    room = MessageRoom(budget, MiB, free_reads=1)

    async def main() -> None:
        leases = [await room.enter() for _ in range(5)]
        assert leases == [FREE] + [READ_COPIES * MiB] * 4 and budget.used == budget.total_bytes
        with pytest.raises(Overloaded) as refused:
            await room.enter()
        assert refused.value.retry_after == 1
        for lease in leases:
            room.leave(lease)
        assert budget.used == 0 and room.free == 1

    asyncio.run(main())


def test_a_large_message_on_the_free_lease_is_refused_at_once_when_the_budget_is_full() -> None:
    budget = MemoryBudget(16 * MiB, wait_seconds=5)
    room = MessageRoom(budget, MiB, free_reads=1)
    assert budget.try_take(16 * MiB)

    async def main() -> None:
        held = Reservation(budget)
        lease = await room.enter()
        with pytest.raises(Overloaded):
            await asyncio.wait_for(room.claim(lease, held, 2 * MiB), 0.5)  # not the 5 s wait
        assert room.free == 1 and held.held == 0

    asyncio.run(main())


def test_a_budget_lease_becomes_what_the_message_holds() -> None:
    budget = MemoryBudget(16 * MiB, wait_seconds=1)
    room = MessageRoom(budget, MiB, free_reads=0)

    async def main() -> None:
        held = Reservation(budget)
        await room.claim(await room.enter(), held, 2 * MiB)
        assert held.held == budget.used == 2 * MiB
        held.release()

    asyncio.run(main())


@pytest.mark.parametrize(
    ("coding", "compress"), [("gzip", gzip.compress), ("deflate", zlib.compress)]
)
def test_inflating_claims_each_step_before_the_next(coding: str, compress: object) -> None:
    plain = bytes(5 * INFLATE_STEP + 7)
    packed = compress(plain)  # type: ignore[operator]
    assert sniffed(packed) == coding
    claims: list[int] = []
    assert inflate_claimed(packed, coding, 10 * MiB, claims.append) == plain
    assert claims[:6] == [INFLATE_STEP] * 5 + [7] and claims[6] == len(plain)  # then the join

    def refuse(nbytes: int) -> None:
        raise Overloaded("no room")

    with pytest.raises(Overloaded):  # the first step's claim stops it
        inflate_claimed(packed, coding, 10 * MiB, refuse)
    with pytest.raises(PayloadTooLarge):
        inflate_claimed(packed, coding, 3 * INFLATE_STEP, claims.append)
    with pytest.raises(BadRequest):
        inflate_claimed(packed[:-6], coding, 10 * MiB, claims.append)


def test_reads_waiting_for_a_lease_get_it_newest_first() -> None:
    """Only the free lease (the budget is full): three reads wait in turn; as each lease is
    given back, the newest waiter takes it, so a small call that comes behind a burst of
    large ones waits for the read in progress only."""
    budget = MemoryBudget(READ_COPIES * MiB, wait_seconds=2)
    room = MessageRoom(budget, MiB, free_reads=1)
    assert budget.try_take(budget.total_bytes)
    order: list[str] = []

    async def read(name: str) -> None:
        lease = await room.enter()
        order.append(name)
        await asyncio.sleep(0.02)  # the message arriving
        room.leave(lease)

    async def main() -> None:
        first = await room.enter()
        waiting = []
        for name in ("oldest", "middle", "newest"):
            waiting.append(asyncio.create_task(read(name)))
            await asyncio.sleep(0.01)  # each polls, finds none, and waits
        room.leave(first)
        await asyncio.gather(*waiting)

    asyncio.run(main())
    assert order == ["newest", "middle", "oldest"]
    assert room.free == 1 and room.waiting == []
