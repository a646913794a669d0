"""Sequences held to their bounds: a table per model of the configuration's own size (Triton's
sequence slots), state and entries claimed from the memory budget while a sequence lives and
given back whatever way it ends, and idle sequences released on a timer with no other traffic.
Each test drives its own event loop with asyncio.run."""

import asyncio
import math
import time
from collections.abc import Coroutine
from typing import Any, TypeVar

import numpy as np
import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from service.core.memory_budget import MemoryBudget
from service.core.sequence_claims import BudgetClaims
from service.core.sequence_request import SequenceRequest
from service.core.sequence_sweeper import IdleSweeper
from service.core.sequences import ENTRY_BYTES, Sequences
from service.errors import Overloaded
from service.runtime.sequence_plan import SequencePlan, sequence_plan

T = TypeVar("T")
KiB, MiB = 1024, 1024 * 1024
CONTROLS = """control_input [
  {name: "START" control [{kind: CONTROL_SEQUENCE_START int32_false_true: [0, 1]}]},
  {name: "READY" control [{kind: CONTROL_SEQUENCE_READY int32_false_true: [0, 1]}]}]"""


def plan(name: str, *, batch: int = 0, instances: int = 1, oldest: str = "",
         idle_us: int = 10_000_000, state: int = 0) -> SequencePlan:  # fmt: skip
    """A plan whose state (when `state` > 0) is that many INT32 elements, any length kept."""
    text = f"max_sequence_idle_microseconds: {idle_us} {CONTROLS} {oldest}"
    if state:
        text += (f' state [{{input_name: "S_IN" output_name: "S_OUT" data_type: TYPE_INT32 '
                 f"dims: [{state}]}}]")  # fmt: skip
    return sequence_plan(text_format.Parse(text, mc.ModelSequenceBatching()), name, batch,
                         instances)  # fmt: skip


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def run(coroutine: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coroutine)


async def step(sequences: Sequences, model: SequencePlan, request: SequenceRequest,
               state_elements: int | None = None) -> None:  # fmt: skip
    """One request: its turn, the state kept (`state_elements` of it: the plan's by default)."""
    async with sequences.turn(model.model_name, model, request) as turn:
        inputs = turn.inputs()
        if model.states:
            count = inputs["S_IN"].size if state_elements is None else state_elements
            turn.keep({"S_OUT": np.ones(count, np.int32)})
        else:
            turn.keep({})


# --- a table per model, of the configuration's size ---


@pytest.mark.parametrize(("batch", "instances", "oldest", "slots", "source"), [
    (8, 2, "", 16, "2 instances x 8 sequence slots (max_batch_size 8)"),
    (0, 3, "", 3, "3 instances x 1 sequence slot (max_batch_size 0)"),
    (4, 2, "oldest {max_candidate_sequences: 5}", 10,
     "2 instances x oldest.max_candidate_sequences 5"),
    (4, 1, "oldest {max_queue_delay_microseconds: 100}", 4,
     "1 instance x 4 sequence slots (max_batch_size 4)"),  # no candidates given: the batch
])  # fmt: skip
def test_a_models_table_holds_its_sequence_slots(batch: int, instances: int, oldest: str,
                                                 slots: int, source: str) -> None:  # fmt: skip
    """Past its slots a model refuses a START with a text naming the bound and a Retry-After of
    when its soonest idle sequence goes; another model's STARTs are untouched."""
    clock = Clock()
    flooded = plan("flooded", batch=batch, instances=instances, oldest=oldest)
    other = plan("other", batch=batch, instances=instances, oldest=oldest)
    assert flooded.max_live == slots

    async def scenario() -> None:
        sequences = Sequences(1000, clock=clock)
        for seq_id in range(1, slots + 1):
            await step(sequences, flooded, SequenceRequest(seq_id, True))
            clock.now += 0.25
        for seq_id in range(100, 400):
            with pytest.raises(Overloaded) as refused:
                await step(sequences, flooded, SequenceRequest(seq_id, True))
        assert sequences.live("flooded") == slots
        wait = math.ceil(100 + 10 - clock.now)  # the first one's deadline
        assert str(refused.value) == (
            f"model 'flooded' has {slots} live sequence{'s' * (slots > 1)}, the most its "
            f"configuration allows (Triton's sequence slots: {source}): end sequences "
            f"(sequence_end), or start this one again in {wait} s (Retry-After), when the "
            "soonest idle one is released")  # fmt: skip
        assert refused.value.retry_after == wait
        for seq_id in range(1, slots + 1):  # the other model's table is its own
            await step(sequences, other, SequenceRequest(seq_id, True))
        await step(sequences, flooded, SequenceRequest(1, end=True))  # one ends: a place
        await step(sequences, flooded, SequenceRequest(999, True))

    run(scenario())


def test_a_model_whose_sequences_are_all_busy_says_retry_in_a_second() -> None:
    async def scenario() -> None:
        sequences, model = Sequences(10), plan("busy")  # one slot
        async with sequences.turn("busy", model, SequenceRequest(1, True)):
            with pytest.raises(Overloaded, match=r"in 1 s \(Retry-After\), when one ends$"):
                async with sequences.turn("busy", model, SequenceRequest(2, True)):
                    pass

    run(scenario())


# --- claims on the memory budget ---


def _claims(total: int, share: float = 0.5) -> tuple[MemoryBudget, BudgetClaims]:
    budget = MemoryBudget(total, wait_seconds=0)
    return budget, BudgetClaims(budget, share)


@pytest.mark.parametrize(("elements", "total", "share"), [(16 * KiB, 8 * MiB, 0.5),
                                                          (50_000, 6 * MiB, 0.25)])  # fmt: skip
def test_state_is_claimed_from_the_budget_up_to_its_share(elements: int, total: int,
                                                          share: float) -> None:  # fmt: skip
    """STARTs claim their state and entry until sequences hold their share of the budget; past
    it a START is 503 naming the setting, the budget's other users keep the rest, and ENDs
    give every byte back."""
    budget, claims = _claims(total, share)
    model = plan("big", batch=0, instances=1000, state=elements)
    each = elements * 4 + ENTRY_BYTES
    fits = int(total * share) // each

    async def scenario() -> None:
        sequences = Sequences(1000, claims=claims)
        refused: list[Overloaded] = []
        for seq_id in range(1, fits + 20):
            try:
                await step(sequences, model, SequenceRequest(seq_id, True))
            except Overloaded as error:
                refused.append(error)
        assert len(sequences) == fits and len(refused) == 19
        assert budget.used == budget.kept == fits * each
        assert "OPSERVE_SEQUENCE_STATE_SHARE" in str(refused[0])
        assert refused[0].retry_after == 10  # the soonest deadline: the idle time
        free = total - budget.used
        assert free >= total * (1 - share) and budget.try_take(free)  # the requests' share
        budget.release(free)
        for seq_id in range(1, fits + 1):
            await step(sequences, model, SequenceRequest(seq_id, end=True))
        assert len(sequences) == 0 and budget.used == budget.kept == 0

    run(scenario())


def test_claims_follow_the_state_kept_and_come_back_every_way() -> None:
    """A state that grows claims more (or is refused and the sequence keeps its old one), a
    smaller one gives back, a failed turn gives back what it claimed, a restart keeps the claim
    of what it holds; idle-out and sweep give back the rest."""
    clock = Clock()
    budget, claims = _claims(3 * MiB)  # sequences: 1.5 MiB
    model = plan("varying", instances=10, state=-1)  # dims [-1]: a state of any length
    assert model.state_bytes == 4

    async def scenario() -> None:
        sequences = Sequences(10, claims=claims, clock=clock)
        await step(sequences, model, SequenceRequest(1, True), 64 * KiB)
        assert budget.kept == 256 * KiB + ENTRY_BYTES
        await step(sequences, model, SequenceRequest(1), 16)
        assert budget.kept == 64 + ENTRY_BYTES
        await step(sequences, model, SequenceRequest(2, True), 256 * KiB)  # 1 MiB
        with pytest.raises(Overloaded, match="would grow to 787456 bytes"):  # 768 KiB: no room
            await step(sequences, model, SequenceRequest(1), 192 * KiB)
        assert budget.kept == 64 + MiB + 2 * ENTRY_BYTES  # as it was
        with pytest.raises(RuntimeError):
            async with sequences.turn("varying", model, SequenceRequest(1)) as turn:
                turn.keep({"S_OUT": np.ones(32 * KiB, np.int32)})  # claims 128 KiB ...
                raise RuntimeError("... and the model fails after")
        assert budget.kept == 64 + MiB + 2 * ENTRY_BYTES
        await step(sequences, model, SequenceRequest(1, True), 16)  # a restart: its new state
        assert budget.kept == 64 + MiB + 2 * ENTRY_BYTES
        await step(sequences, model, SequenceRequest(2, end=True), 16)
        assert budget.kept == 64 + ENTRY_BYTES
        clock.now += 11
        assert sequences.sweep() == 1
        assert len(sequences) == 0 and budget.used == budget.kept == 0

    run(scenario())


def test_kept_state_does_not_hold_off_the_heap_trim() -> None:
    """The heap is trimmed when no request holds the budget: a live sequence's state does not
    count, so its release and a request's both say the budget is idle."""
    budget, claims = _claims(8 * MiB)
    idle: list[bool] = []
    budget.on_idle = lambda: idle.append(budget.busy)
    assert claims.claim(MiB) and not budget.busy

    async def request() -> None:
        async with budget.reservation() as held:
            await held.grow(2 * MiB)
            assert budget.busy

    run(request())
    claims.release(MiB)
    assert idle == [False, False] and budget.used == 0


def test_a_state_refused_at_start_is_a_clean_503_and_leaves_nothing() -> None:
    budget, claims = _claims(16 * MiB, share=0.01)  # 167 KiB for sequences
    model = plan("huge", instances=10, state=64 * KiB)  # 256 KiB each

    async def scenario() -> None:
        sequences = Sequences(10, claims=claims)
        for seq_id in range(1, 50):
            with pytest.raises(Overloaded, match="would keep 263168 bytes"):
                await step(sequences, model, SequenceRequest(seq_id, True))
        assert len(sequences) == 0 and budget.used == 0
        async with budget.reservation() as held:
            await held.grow(15 * MiB)  # the rest is the requests'

    run(scenario())


# --- the timer ---


def test_idle_sequences_are_released_on_time_with_no_other_traffic() -> None:
    """A sweeper sleeping on a 30 s deadline is woken by a sooner one (a shorter idle time) and
    releases those sequences and their claims at their own deadlines, with no request since."""
    budget, claims = _claims(64 * MiB)
    slow, quick = plan("slow", instances=4), plan("quick", instances=40, idle_us=500_000, state=4)

    async def scenario() -> None:
        sequences = Sequences(100, claims=claims)
        sweeper = IdleSweeper(sequences, longest_sleep=30.0)
        sweeper.start()
        try:
            await step(sequences, slow, SequenceRequest(1, True))
            await asyncio.sleep(0.05)  # the sweeper sleeps until the slow one's deadline
            for seq_id in range(1, 31):
                await step(sequences, quick, SequenceRequest(seq_id, True))
            assert len(sequences) == 31
            for _ in range(300):  # up to 3 s: generous for 500 ms
                await asyncio.sleep(0.01)
                if len(sequences) == 1:
                    break
            assert len(sequences) == 1 and sequences.live("slow") == 1
            assert budget.kept == ENTRY_BYTES and sweeper.sweeps >= 1
        finally:
            await sweeper.stop()

    run(scenario())


def test_a_run_that_keeps_its_state_after_its_request_was_cancelled_claims_nothing() -> None:
    """A cancelled request's turn ends at once, while its run finishes its node on a kernel
    thread and then keeps a larger state: that late claim is refused, so nothing of the budget
    is left held once the sequence ends (found by a review: 800 KB held for good per cancel)."""
    budget = MemoryBudget(64 * MiB, 1.0)
    sequences = Sequences(10, claims=BudgetClaims(budget, 0.5))
    model = plan("m", state=4)
    late: list[BaseException] = []

    async def main() -> None:
        loop = asyncio.get_running_loop()
        ran = asyncio.Event()
        await step(sequences, model, SequenceRequest(7, True))

        async def cancelled() -> None:
            async with sequences.turn("m", model, SequenceRequest(7)) as turn:
                turn.inputs()

                def run() -> None:  # the model's last node, slow, then its state kept
                    time.sleep(0.2)
                    try:
                        turn.keep({"S_OUT": np.ones(200_000, np.int32)})
                    except BaseException as exc:
                        late.append(exc)
                    loop.call_soon_threadsafe(ran.set)

                await loop.run_in_executor(None, run)

        task = asyncio.create_task(cancelled())
        await asyncio.sleep(0.05)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await ran.wait()
        await step(sequences, model, SequenceRequest(7, end=True))

    run(main())
    assert [type(exc).__name__ for exc in late] == ["RunCancelled"]
    assert len(sequences) == 0 and budget.kept == 0 and budget.used == 0
