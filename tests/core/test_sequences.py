"""Sequences: turns in arrival order per sequence, liveness as Triton's sequence batcher keeps it
(notes/triton-http.md §1.10), implicit state, idle release and the bounds. Each test drives
its own event loop with asyncio.run; "the model" is a numpy function, run on threads."""

import asyncio
import logging
import random
import time
import tracemalloc
from collections.abc import Coroutine, Mapping
from typing import Any, TypeVar

import numpy as np
import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from service.core.sequence_request import SequenceRequest, sequence_request
from service.core.sequences import Sequences
from service.errors import InvalidInput, Overloaded, PayloadTooLarge, ServiceError, Unsupported
from service.runtime.sequence_plan import SequencePlan, sequence_plan

T = TypeVar("T")
CONTROLS = """control_input [
  {name: "START" control [{kind: CONTROL_SEQUENCE_START int32_false_true: [0, 1]}]},
  {name: "END" control [{kind: CONTROL_SEQUENCE_END int32_false_true: [0, 1]}]},
  {name: "READY" control [{kind: CONTROL_SEQUENCE_READY int32_false_true: [0, 1]}]},
  {name: "CORRID" control [{kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_%s}]}]
state [{input_name: "ACC_IN" output_name: "ACC_OUT" data_type: TYPE_INT32 dims: [1]}]"""
IDLE_SECONDS = 10.0


def dyna_plan(corrid: str = "UINT64", name: str = "simple_dyna_sequence",
              instances: int = 1) -> SequencePlan:  # fmt: skip
    """simple_string_dyna_sequence's configuration with its accumulator as implicit state."""
    text = f"max_sequence_idle_microseconds: {int(IDLE_SECONDS * 1e6)} {CONTROLS % corrid}"
    return sequence_plan(text_format.Parse(text, mc.ModelSequenceBatching()), name, 8, instances)


def short_plan(name: str, idle_us: int = 0, instances: int = 10) -> SequencePlan:
    """An unbatched plan (one slot per instance) with a short idle time (0: Triton's 1 s)."""
    text = f"max_sequence_idle_microseconds: {idle_us} {CONTROLS % 'UINT64'}"
    return sequence_plan(text_format.Parse(text, mc.ModelSequenceBatching()), name, 0, instances)


def accumulate(inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The dyna_sequence backend as the notes' ONNX graph computes it (§3.3)."""
    start, end, ready = (inputs[k] for k in ("START", "END", "READY"))
    corrid = np.array([int(x) for x in inputs["CORRID"].flat], np.int32).reshape(start.shape)
    total = inputs["INPUT"].sum(axis=1, keepdims=True, dtype=np.int32)
    new = inputs["ACC_IN"] * (1 - start) + total
    acc = ready * (new + end * corrid) + (1 - ready) * inputs["ACC_IN"]
    return {"OUTPUT": acc, "ACC_OUT": acc}


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def run(coroutine: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coroutine)


async def infer(sequences: Sequences, plan: SequencePlan, request: SequenceRequest,
                value: int, *, delay: float = 0.0) -> int:  # fmt: skip
    """One request of a sequence: its turn, the model on a thread, the state kept."""
    async with sequences.turn(plan.model_name, plan, request) as turn:
        inputs = turn.inputs() | {"INPUT": np.array([[value]], np.int32)}
        outputs = await asyncio.to_thread(_slowly, inputs, delay)
        turn.keep(outputs)
    return int(outputs["OUTPUT"].item())


def _slowly(inputs: Mapping[str, np.ndarray], delay: float) -> dict[str, np.ndarray]:
    time.sleep(delay)  # a model that takes a while
    return accumulate(inputs)


def requests(seq_id: int | str, count: int) -> list[SequenceRequest]:
    return [SequenceRequest(seq_id, i == 0, i == count - 1) for i in range(count)]


# --- the request's parameters ---


@pytest.mark.parametrize(("parameters", "expected"), [
    ({}, None),
    ({"binary_data_output": True}, None),
    ({"sequence_id": 1000, "sequence_start": True, "sequence_end": False},
     SequenceRequest(1000, True, False)),
    ({"sequence_id": 2**64 - 1}, SequenceRequest(2**64 - 1)),
    ({"sequence_id": "1002", "sequence_end": True}, SequenceRequest("1002", False, True)),
    ({"sequence_id": "x" * 128}, SequenceRequest("x" * 128)),
    ({"sequence_start": True}, SequenceRequest(0, True)),  # refused later, by a sequence model
])  # fmt: skip
def test_sequence_parameters_are_read(parameters: dict, expected: SequenceRequest | None) -> None:
    assert sequence_request(parameters) == expected


@pytest.mark.parametrize(("parameters", "message"), [
    ({"sequence_id": -1}, "Unable to parse 'sequence_id': expected an unsigned 64-bit integer or "
                          "a string, got int '-1'"),
    ({"sequence_id": 2**64}, "Unable to parse 'sequence_id'"),
    ({"sequence_id": 1.5}, "Unable to parse 'sequence_id'"),
    ({"sequence_id": True}, "Unable to parse 'sequence_id'"),
    ({"sequence_id": 1, "sequence_start": 1}, "Unable to parse 'sequence_start': expected a "
                                              "boolean, got int '1'"),
    ({"sequence_id": 1, "sequence_end": "true"}, "Unable to parse 'sequence_end'"),
])  # fmt: skip
def test_sequence_parameters_of_the_wrong_type_are_refused(parameters: dict, message: str) -> None:
    with pytest.raises(InvalidInput) as refused:
        sequence_request(parameters)
    assert str(refused.value).startswith(message)


@pytest.mark.parametrize("seq_id", ["x" * 129, "é" * 65])  # Triton counts bytes
def test_a_string_id_over_128_bytes_is_refused_as_triton_does(seq_id: str) -> None:
    with pytest.raises(Unsupported) as refused:
        sequence_request({"sequence_id": seq_id})
    assert str(refused.value) == "string correlation ID cannot be longer than 128 characters"


@pytest.mark.parametrize("request_", [None, SequenceRequest(0, True), SequenceRequest("", True)])
def test_a_sequence_model_needs_a_correlation_id(request_: SequenceRequest | None) -> None:
    with pytest.raises(InvalidInput) as refused:
        Sequences(10).turn("m", dyna_plan(), request_)
    assert str(refused.value) == ("inference request to model 'simple_dyna_sequence' must "
                                  "specify a non-zero or non-empty correlation ID")  # fmt: skip


# --- order and state ---


def test_interleaved_sequences_keep_their_order_and_state() -> None:
    """The -d run of simple_http_sequence_sync_infer_client.py, its three sequences sent at
    once, the model taking random time on threads: each keeps its order and accumulator."""
    values = [11, 7, 5, 3, 2, 0, 1]
    sent = {
        1000: [0, *values],
        1001: [100, *(-v for v in values)],
        "1002": [20, *(-v for v in values)],
    }
    plans = {1000: dyna_plan(), 1001: dyna_plan(), "1002": dyna_plan("STRING", "string_dyna")}
    rng = random.Random(7)

    async def scenario() -> dict[int | str, list[int]]:
        sequences = Sequences(10)
        tasks: dict[int | str, list[asyncio.Task[int]]] = {seq_id: [] for seq_id in sent}
        for i in range(len(values) + 1):  # round robin: the sequences' requests interleave
            for seq_id, inputs in sent.items():
                request = requests(seq_id, len(inputs))[i]
                tasks[seq_id].append(asyncio.create_task(infer(
                    sequences, plans[seq_id], request, inputs[i], delay=rng.random() / 100)))  # fmt: skip
        answers = {seq_id: list(await asyncio.gather(*ts)) for seq_id, ts in tasks.items()}
        assert len(sequences) == 0  # every sequence ended
        return answers

    answers = run(scenario())
    for seq_id, inputs in sent.items():
        expected = list(np.cumsum(inputs))
        expected[-1] += int(seq_id)  # END adds the correlation id
        assert answers[seq_id] == expected, seq_id
    assert answers["1002"] == [20, 9, 2, -3, -6, -8, -8, 993]  # what the client expects


def test_control_inputs_reach_the_model_as_declared() -> None:
    """simple_sequence's stateless READY*(INPUT+START), through a turn."""

    async def scenario() -> list[int]:
        sequences, plan, out = Sequences(10), dyna_plan(), []
        for i, request in enumerate(requests(1000, 3)):
            async with sequences.turn("m", plan, request) as turn:
                inputs = turn.inputs()
                assert {k: a.shape for k, a in inputs.items()} == dict.fromkeys(
                    ["START", "END", "READY", "CORRID", "ACC_IN"], (1, 1))  # fmt: skip
                assert inputs["CORRID"].dtype == np.uint64 and inputs["CORRID"].item() == 1000
                out.append(int(inputs["READY"].item() * (10 * i + inputs["START"].item())))
        return out

    assert run(scenario()) == [1, 10, 20]


def test_a_start_on_a_live_sequence_restarts_it(caplog: pytest.LogCaptureFixture) -> None:
    async def scenario() -> list[int]:
        sequences, plan = Sequences(10), dyna_plan()
        first = [await infer(sequences, plan, SequenceRequest(5, i == 0), 10) for i in range(3)]
        with caplog.at_level(logging.WARNING, logger="opserve"):
            again = [await infer(sequences, plan, SequenceRequest(5, i == 0), 1) for i in range(2)]
        return first + again

    assert run(scenario()) == [10, 20, 30, 1, 2]  # the state starts again
    assert ("sequence 5 for model 'simple_dyna_sequence' has a conflict. The previous sequence "
            "did not end before this sequence start. Previous sequence will be terminated "
            "early.") in caplog.messages  # fmt: skip


def test_requests_queued_before_a_restart_keep_the_old_state() -> None:
    async def scenario() -> list[int]:
        sequences, plan = Sequences(10), dyna_plan()
        sent = [(SequenceRequest(5, True), 10), (SequenceRequest(5), 1),
                (SequenceRequest(5, True), 100), (SequenceRequest(5, end=True), 1)]  # fmt: skip
        return list(await asyncio.gather(*(infer(sequences, plan, r, v, delay=0.01)
                                           for r, v in sent)))  # fmt: skip

    assert run(scenario()) == [10, 11, 100, 101 + 5]


# --- refusals of liveness ---


def _start_flag_text(seq_id: int | str) -> str:
    return (f"inference request for sequence {seq_id} to model 'simple_dyna_sequence' must "
            "specify the START flag on the first request of the sequence")  # fmt: skip


async def _refused(sequences: Sequences, plan: SequencePlan, request: SequenceRequest) -> str:
    with pytest.raises(ServiceError) as refused:
        await infer(sequences, plan, request, 1)
    return str(refused.value)


def test_a_request_without_start_needs_a_live_sequence() -> None:
    clock = Clock()

    async def scenario() -> None:
        sequences, plan = Sequences(10, clock=clock), dyna_plan()
        assert await _refused(sequences, plan, SequenceRequest(1)) == _start_flag_text(1)  # never
        await infer(sequences, plan, SequenceRequest(2, True), 1)
        await infer(sequences, plan, SequenceRequest(2, end=True), 1)
        assert await _refused(sequences, plan, SequenceRequest(2)) == _start_flag_text(2)  # ended
        await infer(sequences, plan, SequenceRequest(4, True, True), 1)  # a one-request sequence
        assert len(sequences) == 0
        await infer(sequences, plan, SequenceRequest(3, True), 1)
        clock.now += IDLE_SECONDS  # not yet idle: exactly the idle time
        await infer(sequences, plan, SequenceRequest(3), 1)
        clock.now += IDLE_SECONDS + 0.001  # released on access
        assert await _refused(sequences, plan, SequenceRequest(3)) == _start_flag_text(3)
        assert len(sequences) == 0

    run(scenario())


def test_the_id_kind_must_match_the_corrid_type() -> None:
    with pytest.raises(InvalidInput, match="data-type is 'BYTES', but model 'm' expects 'UINT64'"):
        Sequences(10).turn("m", dyna_plan(name="m"), SequenceRequest("7", True))


# --- failures inside a turn ---


def test_a_failed_request_leaves_its_sequence_as_it_was() -> None:
    async def failing(sequences: Sequences, plan: SequencePlan, request: SequenceRequest) -> None:
        with pytest.raises(RuntimeError):
            async with sequences.turn(plan.model_name, plan, request) as turn:
                turn.keep(accumulate(turn.inputs() | {"INPUT": np.array([[1000]], np.int32)}))
                raise RuntimeError("the model failed after its state was made")

    async def scenario() -> list[int]:
        sequences, plan = Sequences(10), dyna_plan()
        out = [await infer(sequences, plan, SequenceRequest(1, True), 10)]
        await failing(sequences, plan, SequenceRequest(1))
        out.append(await infer(sequences, plan, SequenceRequest(1), 1))  # 11: state as it was
        await failing(sequences, plan, SequenceRequest(1, True))  # a failed restart: live, ...
        async with sequences.turn(plan.model_name, plan, SequenceRequest(1)) as turn:
            out.append(int(turn.inputs()["ACC_IN"].item()))  # ... from the initial state
        await failing(sequences, plan, SequenceRequest(2, True))  # a failed START: live, initial
        out.append(await infer(sequences, plan, SequenceRequest(2), 5))
        await failing(sequences, plan, SequenceRequest(2, end=True))  # a failed END still ends
        out.append(len(sequences))
        return out

    assert run(scenario()) == [10, 11, 0, 5, 1]


def test_a_state_over_the_limit_is_refused_and_not_kept() -> None:
    async def scenario() -> None:
        sequences, plan = Sequences(10, max_state_bytes=16), dyna_plan()
        await infer(sequences, plan, SequenceRequest(1, True), 10)
        with pytest.raises(PayloadTooLarge, match="would hold 40 bytes, over the 16"):
            async with sequences.turn("simple_dyna_sequence", plan, SequenceRequest(1)) as turn:
                turn.keep({"ACC_OUT": np.zeros((1, 10), np.int32)})
        with pytest.raises(ServiceError, match="must produce its state output 'ACC_OUT' as INT32"):
            async with sequences.turn("simple_dyna_sequence", plan, SequenceRequest(1)) as turn:
                turn.keep({"ACC_OUT": np.zeros((1, 1), np.float32)})
        assert await infer(sequences, plan, SequenceRequest(1), 1) == 11

    run(scenario())


def test_a_request_cancelled_while_waiting_is_no_longer_counted() -> None:
    async def scenario() -> None:
        sequences, plan = Sequences(10), dyna_plan()
        first = asyncio.create_task(infer(sequences, plan, SequenceRequest(1, True), 1, delay=0.05))
        waiting = asyncio.create_task(infer(sequences, plan, SequenceRequest(1), 1))
        await asyncio.sleep(0.01)
        waiting.cancel()
        assert await first == 1
        with pytest.raises(asyncio.CancelledError):
            await waiting
        assert await infer(sequences, plan, SequenceRequest(1, end=True), 1) == 3  # 1 + 1 + id 1
        assert len(sequences) == 0

    run(scenario())


# --- bounds and idle release ---


def test_live_sequences_are_bounded() -> None:
    """10,000 sequences started and never ended: the table holds 100, the rest are told why,
    memory stays flat; once they idle out, a START gets a place again."""
    clock = Clock()

    async def scenario() -> None:
        sequences, plan = Sequences(100, clock=clock), dyna_plan(instances=100)
        refused, first = 0, ""  # not every text: they would be the memory that grows
        tracemalloc.start()
        try:
            for seq_id in range(1, 10_001):
                if seq_id == 201:
                    settled, _ = tracemalloc.get_traced_memory()
                try:
                    await infer(sequences, plan, SequenceRequest(seq_id, True), 1)
                except Overloaded as error:
                    refused, first = refused + 1, first or str(error)
            grown = tracemalloc.get_traced_memory()[0] - settled
        finally:
            tracemalloc.stop()
        assert len(sequences) == 100 and refused == 9_900
        assert first == ("100 sequences are live, the most this server holds "
                         "(OPSERVE_MAX_SEQUENCES): end sequences (sequence_end), or start this "
                         "one again in 10 s (Retry-After), when the soonest idle one is "
                         "released")  # fmt: skip
        assert grown < 64 * 1024, grown
        for seq_id in range(20_000, 30_000):  # no START: refused, nothing held
            with pytest.raises(InvalidInput):
                await infer(sequences, plan, SequenceRequest(seq_id), 1)
        assert len(sequences) == 100
        clock.now += IDLE_SECONDS + 1
        await infer(sequences, plan, SequenceRequest(1, True), 1)  # the idle 100 are swept
        assert len(sequences) == 1

    run(scenario())


def test_requests_waiting_in_one_sequence_are_bounded() -> None:
    async def scenario() -> None:
        sequences, plan = Sequences(10, max_waiting=4), dyna_plan()
        release = asyncio.Event()
        order: list[int] = []

        async def held() -> None:
            async with sequences.turn("m", plan, SequenceRequest(1, True)):
                await release.wait()

        async def one(i: int) -> None:
            async with sequences.turn("m", plan, SequenceRequest(1)):
                order.append(i)

        first = asyncio.create_task(held())
        await asyncio.sleep(0)
        flood = [asyncio.create_task(one(i)) for i in range(20)]
        await asyncio.sleep(0)
        release.set()
        results = await asyncio.gather(first, *flood, return_exceptions=True)
        refused = [r for r in results if isinstance(r, Overloaded)]
        assert len(refused) == 16 and order == [0, 1, 2, 3]
        assert str(refused[0]) == ("sequence 1 of model 'simple_dyna_sequence' has 4 requests "
                                   "waiting already: send a sequence's requests one after another")  # fmt: skip
        assert len(sequences) == 1  # still live: no END was sent

    run(scenario())


def test_idle_sequences_are_swept() -> None:
    clock = Clock()
    short = short_plan("short")
    assert short.idle_seconds == 1.0

    async def scenario() -> None:
        sequences = Sequences(10, clock=clock)
        for seq_id in (1, 2):
            await infer(sequences, short, SequenceRequest(seq_id, True), 1)
        await infer(sequences, dyna_plan(), SequenceRequest(3, True), 1)
        clock.now += 2
        assert sequences.sweep() == 2 and len(sequences) == 1  # the 10-second one stays
        await infer(sequences, short, SequenceRequest(4, True), 1)
        clock.now += 2
        await infer(sequences, short, SequenceRequest(5, True), 1)  # a START sweeps what is due
        assert len(sequences) == 2

    run(scenario())


def test_a_full_table_is_swept_for_a_start_once_one_can_be_idle() -> None:
    """A START sweeps only once a deadline is past: a flood of STARTs at a full table costs
    no sweeps (each looks at the soonest deadline only)."""
    clock = Clock()
    short = short_plan("simple_dyna_sequence")

    async def scenario() -> None:
        sequences = Sequences(3, clock=clock)
        swept: list[float] = []
        sweep = sequences._sweep

        def counted(model_key: object, table: Any, now: float) -> int:
            swept.append(now)
            return sweep(model_key, table, now)

        sequences._sweep = counted  # type: ignore[method-assign]
        for seq_id, at in ((1, 100.0), (2, 100.5), (3, 101.0)):
            clock.now = at
            await infer(sequences, short, SequenceRequest(seq_id, True), 1)
        assert swept == []  # none is idle yet: idle means more than 1 s
        clock.now = 101.2
        await infer(sequences, short, SequenceRequest(4, True), 1)  # 1 has gone idle
        assert swept == [101.2] and len(sequences) == 3
        for seq_id in range(5, 1000):
            with pytest.raises(Overloaded):
                await infer(sequences, short, SequenceRequest(seq_id, True), 1)
        assert swept == [101.2]  # none can be idle before 101.5: no sweep
        assert await _refused(sequences, short, SequenceRequest(1)) == _start_flag_text(1)
        assert await infer(sequences, short, SequenceRequest(2), 1) == 2

    run(scenario())


def test_a_sequence_that_goes_idle_after_a_sweep_is_still_found() -> None:
    """A sweep while sequences are taking turns cannot know when they will idle: their turns'
    ends tell it (here with an idle time shorter than the once-a-second sweeps)."""
    clock = Clock()
    brief = short_plan("brief", 100_000)

    async def scenario() -> None:
        sequences = Sequences(2, clock=clock)
        turns = [sequences.turn("m", brief, SequenceRequest(i, True)) for i in (1, 2)]
        for turn in turns:
            await turn.__aenter__()
        sequences.sweep()  # both are taking their turns: neither can be idle
        clock.now += 0.01
        for turn in turns:
            await turn.__aexit__(None, None, None)
        clock.now += 0.2
        async with sequences.turn("m", brief, SequenceRequest(3, True)):
            assert len(sequences) == 1  # a full table, swept: 1 and 2 had gone idle

    run(scenario())
