"""Cluster mode's sequences against a real Redis, in one process with two keepers (as two
replicas would hold them): the accumulator's values across both, two round trips per
uncontended step, the lease's token guarding the write-back, a dead replica's ticket skipped,
the idle time as the keys' expiry, the bounds and texts of one process, and a store away."""

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any, TypeVar

import numpy as np
import pytest

from service.cluster.members import Membership
from service.cluster.sequence_state import encode_state
from service.cluster.sequence_turn import Step
from service.cluster.sequences import ClusterSequences
from service.cluster.store import ClusterStore, ClusterUnreachable
from service.core.sequence_claims import CountedClaims
from service.core.sequence_request import SequenceRequest
from service.errors import InvalidInput, Overloaded, PayloadTooLarge, ServiceError
from service.runtime.sequence_plan import SequencePlan
from tests.cluster.redis_server import RedisServer
from tests.core.test_sequences import dyna_plan, infer, short_plan

T = TypeVar("T")
LEASE = 1.0  # seconds: a busy machine's pauses of half a second must not run one out


class CountingStore(ClusterStore):
    """A real store that counts its calls (round trips)."""

    calls = 0

    async def call(self, pending: Awaitable[T]) -> T:
        self.calls += 1
        return await super().call(pending)


@asynccontextmanager
async def keeper(url: str, **more: Any) -> AsyncIterator[ClusterSequences]:
    store = CountingStore(url, "test", 2.0)
    members = Membership(store, 0.2)
    await members.beat()
    try:
        claims = more.pop("claims", CountedClaims())
        yield ClusterSequences(store, members, claims, more.pop("lease", LEASE), **more)
    finally:
        await store.close()


def run(scenario: Callable[[], Awaitable[T]]) -> T:
    return asyncio.run(scenario())  # type: ignore[arg-type]


def _step(sequences: ClusterSequences, plan: SequencePlan, seq_id: int) -> Step:
    turn = sequences.turn(plan.model_name, plan, SequenceRequest(seq_id))
    return turn.step


def test_a_sequence_across_two_keepers_accumulates_as_one(redis: RedisServer) -> None:
    plan = dyna_plan()

    async def scenario() -> list[int]:
        async with keeper(redis.url) as first, keeper(redis.url) as second:
            values = [0, 11, 7, 5, 3, 2, 0, 1]
            found = []
            for i, value in enumerate(values):
                request = SequenceRequest(1000, start=i == 0, end=i == len(values) - 1)
                found.append(await infer((first, second)[i % 2], plan, request, value))
            return found

    assert run(scenario) == [0, 11, 18, 23, 26, 28, 28, 29 + 1000]


def test_an_uncontended_step_is_two_round_trips(redis: RedisServer) -> None:
    plan = dyna_plan()

    async def scenario() -> list[int]:
        async with keeper(redis.url) as sequences:
            await infer(sequences, plan, SequenceRequest(5, start=True), 1)  # loads the scripts
            store = sequences.store
            assert isinstance(store, CountingStore)
            counts = []
            for value in (2, 3, 4):
                before = store.calls
                await infer(sequences, plan, SequenceRequest(5), value)
                counts.append(store.calls - before)
            return counts

    assert run(scenario) == [2, 2, 2]


def test_an_uncontended_step_runs_few_commands_in_redis(redis: RedisServer) -> None:
    """What Redis runs for a middle step, scripts' commands included (INFO commandstats): the
    exactly-once token, caps and expiry fit in 25 (they took 59 before the scripts read and
    wrote each hash once, 32 before the only pending step ran with no place in the order); a
    START and an END may take more."""
    plan = dyna_plan()

    async def scenario() -> list[int]:
        async with keeper(redis.url) as sequences:
            await infer(sequences, plan, SequenceRequest(9, start=True), 1)
            await infer(sequences, plan, SequenceRequest(9), 1)  # the state's bytes counted
            client = sequences.store.redis
            counts = []
            for value in (2, 3, 4):
                before = _commands(await client.info("commandstats"))
                await infer(sequences, plan, SequenceRequest(9), value)
                counts.append(_commands(await client.info("commandstats")) - before)
            return counts

    counts = run(scenario)
    assert all(18 <= count <= 25 for count in counts), counts


def _commands(stats: dict[str, Any]) -> int:
    """Commands Redis ran so far, INFO's own calls left out."""
    return sum(int(row["calls"]) for name, row in stats.items() if name != "cmdstat_info")


def test_a_step_whose_lease_ran_out_cannot_write_back(redis: RedisServer) -> None:
    """A replica that stalled past its lease (never renewed): the next step takes the lease,
    and the stalled one's write-back is refused though no step was committed in between (the
    token, not the step counter, refuses it). The taker's lease is long: a busy machine's
    pause between its begin and finish must not run it out too (CI saw both refused)."""
    plan = dyna_plan()

    async def scenario() -> tuple[str, str, int]:
        async with keeper(redis.url) as first, keeper(redis.url, lease=60) as second:
            await infer(first, plan, SequenceRequest(6, start=True), 10)
            stalled = _step(first, plan, 6)
            await first.begin(stalled)
            await asyncio.sleep(LEASE + 0.1)
            taker = _step(second, plan, 6)
            await asyncio.wait_for(second.begin(taker), 2)  # the stalled ticket is skipped
            stale = await first.finish(stalled, b"")
            kept = await second.finish(taker, _state(11))
            return stale, kept, await infer(second, plan, SequenceRequest(6), 0)

    assert run(scenario) == ("stale", "kept", 11)


def _state(value: int) -> bytes:
    return encode_state({"ACC_IN": np.array([[value]], np.int32)})


def test_a_step_longer_than_its_lease_keeps_it_by_renewing(redis: RedisServer) -> None:
    """A model that runs three leases: its step renews the lease (and its claim), so another
    replica's step of the sequence waits behind it and then reads what it wrote."""
    plan = dyna_plan()

    async def scenario() -> tuple[int, int]:
        async with keeper(redis.url) as first, keeper(redis.url) as second:
            await infer(first, plan, SequenceRequest(10, start=True), 1)
            slow = asyncio.create_task(infer(first, plan, SequenceRequest(10), 2,
                                             delay=3 * LEASE))  # fmt: skip
            await asyncio.sleep(LEASE / 6)  # it holds the lease
            after = await infer(second, plan, SequenceRequest(10), 4)
            return await slow, after

    assert run(scenario) == (3, 7)


def test_a_dead_replicas_waiting_ticket_is_skipped(redis: RedisServer) -> None:
    plan = dyna_plan()

    async def scenario() -> int:
        async with keeper(redis.url) as alive, keeper(redis.url) as doomed:
            await infer(alive, plan, SequenceRequest(7, start=True), 1)
            holder = _step(alive, plan, 7)
            await alive.begin(holder)
            ghost = _step(doomed, plan, 7)  # takes a ticket behind the holder, then dies
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(doomed.begin(ghost), 0.05)
            await alive.finish(holder, None)
            # the ghost's ticket comes first, but its claim runs out within a lease
            return await asyncio.wait_for(infer(alive, plan, SequenceRequest(7), 2), LEASE + 2)

    assert run(scenario) == 3


def test_the_step_that_runs_alone_counts_among_the_waiting(redis: RedisServer) -> None:
    """The only pending step takes the lease with no place in the order (ARRIVE's `alone`):
    it still counts as one process counts it, so with two allowed to wait the fourth
    concurrent step is refused, and the others run in order, each once."""
    plan = dyna_plan()

    async def scenario() -> tuple[list[int], str]:
        async with keeper(redis.url, max_waiting=2) as first, keeper(redis.url) as second:
            await infer(first, plan, SequenceRequest(11, start=True), 1)
            # within its lease, with time for the three below on a busy machine
            slow = asyncio.create_task(infer(first, plan, SequenceRequest(11), 2, delay=0.8))
            await asyncio.sleep(0.1)  # it runs alone
            waiting = []
            for value in (4, 8):
                waiting.append(asyncio.create_task(infer(second, plan, SequenceRequest(11),
                                                         value)))  # fmt: skip
                await asyncio.sleep(0.05)  # tickets in this order
            with pytest.raises(Overloaded, match="has 2 requests waiting already") as refused:
                await infer(first, plan, SequenceRequest(11), 100)
            return [await slow, *[await step for step in waiting]], str(refused.value)

    found, _ = run(scenario)
    assert found == [3, 7, 15]


def test_the_idle_time_is_the_keys_expiry(redis: RedisServer) -> None:
    plan = short_plan("short", idle_us=1_500_000)

    async def scenario() -> None:
        async with keeper(redis.url) as sequences:
            await infer(sequences, plan, SequenceRequest(8, start=True), 1)
            keys, _ = sequences.keys("short", 8)
            ttl = await sequences.store.redis.pttl(keys[0])
            assert 0 < ttl <= 1500
            await asyncio.sleep(0.2)
            assert await infer(sequences, plan, SequenceRequest(8), 2) == 3  # within: lives
            await asyncio.sleep(1.8)
            assert not await sequences.store.redis.exists(keys[0])
            with pytest.raises(InvalidInput, match="must specify the START flag"):
                await infer(sequences, plan, SequenceRequest(8), 3)

    run(scenario)


def test_bounds_and_texts_are_one_process_s(redis: RedisServer) -> None:
    plan = short_plan("two", instances=2)  # two slots

    async def scenario() -> None:
        async with keeper(redis.url, max_state_bytes=64) as first, keeper(redis.url) as second:
            with pytest.raises(InvalidInput, match="must specify a non-zero or non-empty"):
                first.turn("two", plan, SequenceRequest(0))
            await infer(first, plan, SequenceRequest(1, start=True), 1)
            await infer(second, plan, SequenceRequest(2, start=True), 1)
            with pytest.raises(Overloaded, match="model 'two' has 2 live sequences") as full:
                await infer(first, plan, SequenceRequest(3, start=True), 1)
            assert 1 <= full.value.retry_after <= 2
            await infer(second, plan, SequenceRequest(1, end=True), 1)
            await infer(first, plan, SequenceRequest(3, start=True), 1)  # a slot came free
            wide = SequencePlan("wide", False, 1.0, plan.controls, plan.states, 4)
            with pytest.raises(PayloadTooLarge, match=r"would hold 400 bytes, over the 64"):
                async with first.turn("wide", wide, SequenceRequest(4, start=True)) as turn:
                    turn.keep({"ACC_OUT": np.zeros(100, np.int32)})

    run(scenario)


def test_a_store_away_is_unavailable_and_not_ready(redis: RedisServer) -> None:
    plan = dyna_plan()

    async def scenario() -> None:
        async with keeper(redis.url) as sequences:
            await infer(sequences, plan, SequenceRequest(9, start=True), 4)
            redis.stop()
            with pytest.raises(ClusterUnreachable, match=r"cluster store \(Redis\) is unreach"):
                await infer(sequences, plan, SequenceRequest(9), 1)
            assert not sequences.available
            redis.start()
            await sequences.members.beat()
            assert sequences.available
            assert await infer(sequences, plan, SequenceRequest(9), 1) == 5  # kept

    run(scenario)


def test_a_state_that_cannot_be_read_says_so_and_start_begins_again(redis: RedisServer) -> None:
    """A stored state overwritten with bytes that are no state (another format, a rolling
    upgrade): the next step answers that it cannot be read and how to go on, not a bare 500;
    a START then begins the sequence again."""
    plan = dyna_plan()

    async def scenario() -> tuple[str, int]:
        async with keeper(redis.url) as sequences:
            await infer(sequences, plan, SequenceRequest(77, start=True), 5)
            store = sequences.store
            (found,) = [k async for k in store.redis.scan_iter(match=store.prefix + "seq:*")]
            await store.redis.hset(found, "state", b"\x00\x00\x00\x00\x00\x00\x00\x09garbage!!")
            with pytest.raises(ServiceError) as unreadable:
                await infer(sequences, plan, SequenceRequest(77), 1)
            again = await infer(sequences, plan, SequenceRequest(77, start=True), 4)
            return str(unreadable.value), again

    text, again = run(scenario)
    assert text.startswith("the sequence's state in the cluster store cannot be read (")
    assert text.endswith("start the sequence again (a request with the START flag)")
    assert again == 4
