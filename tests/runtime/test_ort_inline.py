"""When a run on onnxruntime takes the event loop (service/engines/onnxruntime/inline.py): a quick
model's small run, once its first runs on threads were all quick and its memory estimate for
the inputs is made, whole and small; one run past the hold allowed, or a fifth slow one in
sixteen, sends it back to threads (a few slow runs, as a cold first one after an idle
moment, do not); a run past the
leash is stopped and starts again on a thread; an inline attempt that held the loop too long
closes the gate however it ended; a model with a subgraph (Loop, If) never runs inline. A run inline is one
that completes under the inline context (an attempt that may not raises RunOffLoop). Most
tests mark the model quick by hand (`_quick`): whether a real run takes under a millisecond
is this host's business, and one that is slower at a bad moment would close the window."""

import json
import math
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient
from onnx import ModelProto, TensorProto, helper

from service.codecs.limits import SMALL_BYTES
from service.engines.choice import load_ort
from service.engines.onnxruntime import inline as ort_inline
from service.engines.onnxruntime import model as ort_model
from service.engines.onnxruntime.inline import (
    HELD_SECONDS,
    QUICK_RUN_SECONDS,
    QUICK_RUNS,
    SLOW_RUNS,
    InlineGate,
)
from service.engines.onnxruntime.model import OrtModel
from service.errors import InvalidInput
from service.kernels.context import (
    INLINE_JSON_ANSWER_BYTES,
    InlineAttempt,
    KernelContext,
    RunOffLoop,
)
from service.main import create_app
from service.settings import Settings

from .models import I64, F, chained_steps, model, value

INLINE = KernelContext(1 << 30, SMALL_BYTES)  # as core/execution.py's inline attempts
W = (np.eye(64) * 0.5 + 0.01).astype(np.float32)
STEADY = (np.eye(64) * 0.5 + 1 / 128).astype(np.float32)  # ones @ STEADY is ones, exactly


def _chain(nodes: int, weight: np.ndarray = W) -> bytes:
    """`nodes` MatMuls by one 64x64 weight over x [rows, 64]: its time follows the rows."""
    names = ["x", *(f"m{i}" for i in range(nodes - 1)), "y"]
    chain = [helper.make_node("MatMul", [names[i], "w"], [names[i + 1]]) for i in range(nodes)]
    return model(chain, [value("x", F, ["rows", 64])], [value("y", F, ["rows", 64])],
                 {"w": weight}).SerializeToString()  # fmt: skip


def _rows(n: int) -> dict[str, np.ndarray]:
    return {"x": np.ones((n, 64), np.float32)}


def _expected(nodes: int, rows: int) -> np.ndarray:
    y = np.ones((rows, 64), np.float32)
    for _ in range(nodes):
        y = y @ W
    return y


def _loaded(data: bytes, **settings: Any) -> OrtModel:
    return load_ort(data, Settings(**settings))


def _quick(loaded: OrtModel) -> OrtModel:
    for _ in range(QUICK_RUNS):
        loaded.gate.ran(0.0)
    return loaded


def test_a_quick_model_runs_inline_once_its_first_runs_were_quick() -> None:
    """Real runs of a small model open the gate (given a few tries: a run this host slowed
    past a millisecond starts the window again)."""
    loaded = _loaded(_chain(2))
    with pytest.raises(RunOffLoop):
        loaded.run(_rows(1), ctx=INLINE)
    for _ in range(20 * QUICK_RUNS):
        if loaded.gate.open:
            break
        loaded.run(_rows(1))
    assert loaded.gate.open
    np.testing.assert_allclose(loaded.run(_rows(1), ctx=INLINE).outputs["y"], _expected(2, 1),
                               rtol=1e-6)  # fmt: skip


def test_one_run_past_the_hold_allowed_sends_the_model_back_to_threads() -> None:
    loaded = _quick(_loaded(_chain(1000)))
    # on a thread: 1,000 MatMuls of 250 rows (about 1e9 multiply-adds) take far
    # over HELD_SECONDS (5 ms), the bound past which one run starts the count over
    loaded.run(_rows(250))
    assert not loaded.gate.open
    with pytest.raises(RunOffLoop):
        loaded.run(_rows(1), ctx=INLINE)


def test_a_few_slow_runs_among_quick_ones_keep_the_way_open() -> None:
    """A model called in bursts runs slow at each burst's start (cold caches): SLOW_RUNS of
    the last QUICK_RUNS may be slower than quick, one more closes the way until they have
    passed out of the last QUICK_RUNS."""
    slow, quick = (QUICK_RUN_SECONDS + HELD_SECONDS) / 2, QUICK_RUN_SECONDS / 2
    gate = InlineGate()
    for i in range(QUICK_RUNS):
        gate.ran(slow if i >= QUICK_RUNS - SLOW_RUNS else quick)
    assert gate.open
    gate.ran(slow)  # one more slow run in the last QUICK_RUNS than allowed
    assert not gate.open
    quick_runs = 0
    while not gate.open and quick_runs < 2 * QUICK_RUNS:
        gate.ran(quick)
        quick_runs += 1
    # open once the first of the SLOW_RUNS + 1 slow runs is more than QUICK_RUNS runs back
    assert quick_runs == QUICK_RUNS - SLOW_RUNS


def test_a_client_whose_runs_are_slow_whenever_inline_gets_few_of_them() -> None:
    """The docs' bound: a client that makes every inline run slow (under the hold allowed) and
    every other one quick gets at most SLOW_RUNS + 1 slow inline runs in any QUICK_RUNS runs;
    and one whose runs are slow at random, inline or not, too."""
    slow, quick = (QUICK_RUN_SECONDS + HELD_SECONDS) / 2, QUICK_RUN_SECONDS / 2
    rng = np.random.default_rng(7)
    for chooses in ("adversary", "random"):
        gate, slow_inline = InlineGate(), []
        for _ in range(20 * QUICK_RUNS):
            inline = gate.open
            took = slow if (inline if chooses == "adversary" else rng.random() < 0.5) else quick
            slow_inline.append(inline and took == slow)
            gate.ran(took)
        windows = [sum(slow_inline[i : i + QUICK_RUNS]) for i in range(len(slow_inline))]
        assert max(windows) <= SLOW_RUNS + 1, chooses
        assert sum(slow_inline) >= 1, chooses  # the gate did open: the bound is not vacuous


def test_a_run_past_the_hold_allowed_starts_the_count_over() -> None:
    gate = InlineGate()
    for _ in range(QUICK_RUNS):
        gate.ran(0.0)
    assert gate.open
    gate.ran(HELD_SECONDS * 1.5)
    for _ in range(QUICK_RUNS - 1):
        gate.ran(0.0)
    assert not gate.open
    gate.ran(0.0)
    assert gate.open


def test_a_run_past_the_leash_is_stopped_and_the_model_stays_off_the_loop() -> None:
    """5,000 MatMuls of 1,000 rows (512 KiB at the peak): the whole run takes far longer than
    the leash (20 ms) and the watcher's poll; inline it is stopped well before, and the model
    stays on threads."""
    loaded = _loaded(_chain(5000), max_graph_nodes=6000)
    started = time.monotonic()
    whole = loaded.run(_rows(1000)).outputs["y"]  # on a thread: makes the estimate, too
    alone = time.monotonic() - started
    _quick(loaded)
    started = time.monotonic()
    with pytest.raises(RunOffLoop):
        loaded.run(_rows(1000), ctx=INLINE)
    stopped = time.monotonic() - started
    assert stopped < min(alone / 2, 0.5), (stopped, alone)
    assert loaded.gate.closed
    _quick(loaded)
    with pytest.raises(RunOffLoop):
        loaded.run(_rows(1000), ctx=INLINE)
    np.testing.assert_array_equal(loaded.run(_rows(1000)).outputs["y"], whole)


def test_an_attempt_that_held_the_loop_too_long_sends_it_to_threads_twice_as_long_each_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A Gather whose index a client sends: out of range, the run fails (422). With the hold
    allowed made zero, each failed inline attempt sends the model back to threads until it
    has been quick for 32 runs, then 64; with the hold allowed as it is, a quick one does not.
    Whether an attempt is quick is this host's at that moment (a busy one can stop this
    process for longer than the gate allows): the way must stay open after an attempt that
    took, all told, no longer than a quick run, and one such attempt is waited for. The leash
    is made long: a busy host stopped an attempt at 20 ms (another test's case)."""
    monkeypatch.setattr(ort_model, "LEASH_SECONDS", 60.0)
    gather = model([helper.make_node("Gather", ["x", "i"], ["y"])],
                   [value("x", F, [4]), value("i", I64, [1])], [value("y", F, [1])],
                   ).SerializeToString()  # fmt: skip
    bad = {"x": np.ones(4, np.float32), "i": np.array([9], np.int64)}
    for _ in range(100):
        loaded = _quick(_loaded(gather))
        with pytest.raises(InvalidInput):
            loaded.run(bad)  # on a thread: the estimate is made
        _quick(loaded)
        started = time.perf_counter()
        with pytest.raises(InvalidInput):
            loaded.run(bad, ctx=INLINE)  # inline: the way stays open when it was quick
        if time.perf_counter() - started <= ort_inline.QUICK_RUN_SECONDS:
            break
    else:
        pytest.fail("no inline attempt of 100 took under a millisecond on this host")
    assert loaded.gate.open
    monkeypatch.setattr(ort_inline, "HELD_SECONDS", 0.0)
    for runs_back in (2 * QUICK_RUNS, 4 * QUICK_RUNS):
        with pytest.raises(InvalidInput):
            loaded.run(bad, ctx=INLINE)
        loaded.gate.ran(1.0)  # a slow run after the hold: the count starts over, the need stays
        for _ in range(runs_back - 1):
            loaded.gate.ran(0.0)
        assert not loaded.gate.open
        loaded.gate.ran(0.0)
        assert loaded.gate.open
    assert not loaded.gate.closed


def test_a_model_with_a_loop_never_runs_inline() -> None:
    """Its time follows a value (the trip count), and a Loop whose body has no kernel is never
    stopped between kernels: closed when it loads, whatever its runs' times."""
    body = helper.make_graph(
        [helper.make_node("Identity", ["cond_in"], ["cond_out"])], "body",
        [value("i", I64, []), value("cond_in", TensorProto.BOOL, []), value("y_in", F, [2])],
        [value("cond_out", TensorProto.BOOL, []), value("y_in", F, [2])],
    )  # fmt: skip
    loop = helper.make_node("Loop", ["m", "", "y0"], ["y"], body=body)
    looped = model([loop], [value("m", I64, []), value("y0", F, [2])], [value("y", F, [2])])
    inputs = {"m": np.array(3, np.int64), "y0": np.ones(2, np.float32)}
    loaded = _loaded(looped.SerializeToString())
    assert loaded.gate.closed
    loaded.run(inputs)
    _quick(loaded)
    with pytest.raises(RunOffLoop):
        loaded.run(inputs, ctx=INLINE)


def branches(n: int, matmuls: int) -> ModelProto:
    """If `c`: `matmuls` MatMuls of an [n, n] initializer, scaled by sum(x) (a value of the
    request, so nothing folds at load), summed; else sum(x). The memory estimate never sees
    into a branch, and quick runs of one branch say nothing of the other."""
    light = helper.make_graph([helper.make_node("ReduceSum", ["x"], ["light"], keepdims=0)],
                              "light", [], [value("light", F, [])])  # fmt: skip
    steps = [helper.make_node("ReduceSum", ["x"], ["s"], keepdims=0),
             helper.make_node("Mul", ["w", "s"], ["p0"])]  # fmt: skip
    steps += [helper.make_node("MatMul", [f"p{i}", "w"], [f"p{i + 1}"]) for i in range(matmuls)]
    steps.append(helper.make_node("ReduceSum", [f"p{matmuls}"], ["heavy"], keepdims=0))
    heavy = helper.make_graph(steps, "heavy", [], [value("heavy", F, [])])
    node = helper.make_node("If", ["c"], ["y"], then_branch=heavy, else_branch=light)
    return model([node], [value("c", TensorProto.BOOL, [1]), value("x", F, [4])],
                 [value("y", F, [])], {"w": np.eye(n, dtype=np.float32) * 0.5})  # fmt: skip


def test_a_model_with_an_if_never_runs_inline() -> None:
    """Whichever branch its quick runs took: closed when it loads."""
    loaded = _loaded(branches(8, 1).SerializeToString())
    assert loaded.gate.closed
    x = np.array([1, 2, 3, 4], np.float32)
    light, heavy = {"c": np.array([False]), "x": x}, {"c": np.array([True]), "x": x}
    assert loaded.run(light).outputs["y"] == 10.0
    assert loaded.run(heavy).outputs["y"] == 8 * 10.0 * 0.5**2  # by hand: (0.5 I * 10) @ 0.5 I
    _quick(loaded)
    for inputs in (light, heavy):
        with pytest.raises(RunOffLoop):
            loaded.run(inputs, ctx=INLINE)


def test_an_estimate_not_made_yet_or_not_whole_keeps_the_run_on_a_thread() -> None:
    """ConstantOfShape of a client's dims: each new value's estimate infers shapes again,
    which is a thread's work, not the loop's; once made, that value runs inline. NonZero:
    a size no inference knows, never inline."""
    sized = model([helper.make_node("ConstantOfShape", ["dims"], ["c"]),
                   helper.make_node("ReduceSum", ["c"], ["y"], keepdims=0)],
                  [value("dims", I64, [1])], [value("y", F, [])],
                  ).SerializeToString()  # fmt: skip
    loaded = _quick(_loaded(sized))
    five, six = {"dims": np.array([5], np.int64)}, {"dims": np.array([6], np.int64)}
    with pytest.raises(RunOffLoop):
        loaded.run(five, ctx=INLINE)
    loaded.run(five)
    _quick(loaded)
    assert loaded.run(five, ctx=INLINE).outputs["y"] == 0.0
    with pytest.raises(RunOffLoop):
        loaded.run(six, ctx=INLINE)
    nonzero = model([helper.make_node("NonZero", ["x"], ["y"])], [value("x", F, [4])],
                    [value("y", I64, [1, None])]).SerializeToString()  # fmt: skip
    some = {"x": np.array([0, 2, 0, 3], np.float32)}
    loaded = _loaded(nonzero)
    assert loaded.run(some).outputs["y"].tolist() == [[1, 3]]
    _quick(loaded)
    with pytest.raises(RunOffLoop):  # how many are not zero is the data's, not the shapes'
        loaded.run(some, ctx=INLINE)


def test_sizes_two_inputs_leave_unknown_are_known_from_the_requests_shapes() -> None:
    """An Add of two inputs with dynamic dimensions of their own (Triton's `simple`): shape
    inference alone cannot size the sum, the request's shapes can (inferred again, on a
    thread, once per shapes): then it runs inline."""
    added = model([helper.make_node("Add", ["a", "b"], ["y"])],
                  [value("a", F, [None]), value("b", F, [None])], [value("y", F, [None])],
                  ).SerializeToString()  # fmt: skip
    inputs = {"a": np.arange(4, dtype=np.float32), "b": np.ones(4, np.float32)}
    loaded = _quick(_loaded(added))
    assert loaded.memory is not None and loaded.memory.estimated(inputs) is None
    loaded.run(inputs)
    assert loaded.memory.estimated(inputs) == (16, True)
    _quick(loaded)
    assert loaded.run(inputs, ctx=INLINE).outputs["y"].tolist() == [1, 2, 3, 4]


def test_a_run_with_a_large_estimated_peak_stays_on_threads() -> None:
    """A Tile of a small input to 1.25 MiB: over the inline allowance at its peak."""
    tile = model([helper.make_node("Tile", ["x", "r"], ["y"])], [value("x", F, [8])],
                 [value("y", F, [8 * 40960])],
                 {"r": np.array([40960], np.int64)}).SerializeToString()  # fmt: skip
    small = {"x": np.ones(8, np.float32)}
    loaded = _loaded(tile)
    np.testing.assert_array_equal(loaded.run(small).outputs["y"], np.ones(8 * 40960))
    _quick(loaded)
    with pytest.raises(RunOffLoop):
        loaded.run(small, ctx=INLINE)


@pytest.fixture(scope="module")
def chain_client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestClient]:
    root = tmp_path_factory.mktemp("inline")
    (root / "chain" / "1").mkdir(parents=True)
    (root / "chain" / "1" / "model.onnx").write_bytes(_chain(3))
    (root / "chain" / "config.pbtxt").write_text("max_batch_size: 0")
    settings = Settings(model_repository=root, access_log=False)
    with TestClient(create_app(settings), raise_server_exceptions=False) as client:
        yield client


def _counted_inline_runs(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """A list that grows by one each time OrtModel._inline_run answers (a run inline)."""
    answered_inline: list[int] = []
    inline_run = OrtModel._inline_run

    def counted(self: OrtModel, *args: Any) -> Any:
        produced = inline_run(self, *args)
        answered_inline.append(1)
        return produced

    monkeypatch.setattr(OrtModel, "_inline_run", counted)
    return answered_inline


def test_through_the_door_runs_go_inline_and_answer_as_on_threads(
    chain_client: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Calls until the model is quick (on threads), then inline ones: every answer is the
    same, some were answered inline (counted at OrtModel._inline_run), and the statistics
    count each call once."""
    answered_inline = _counted_inline_runs(monkeypatch)
    body = {"inputs": [{"name": "x", "shape": [2, 64], "datatype": "FP32",
                        "data": [1.0] * 128}]}  # fmt: skip
    expected = _expected(3, 2).reshape(-1)
    calls = 0
    while len(answered_inline) < 8 and calls < 40 * QUICK_RUNS:
        answer = chain_client.post("/v2/models/chain/infer", json=body)
        calls += 1
        assert answer.status_code == 200, answer.text
        np.testing.assert_allclose(answer.json()["outputs"][0]["data"], expected, rtol=1e-6)
    assert len(answered_inline) == 8 and calls >= QUICK_RUNS + 8
    stats = chain_client.get("/v2/models/chain/stats").json()["model_stats"][0]
    assert stats["inference_stats"]["success"]["count"] == calls


class _CountedSession:
    """A session whose runs are counted."""

    def __init__(self, session: Any) -> None:
        self.session, self.runs = session, 0

    def run(self, *args: Any) -> Any:
        self.runs += 1
        return self.session.run(*args)


def test_a_run_is_not_begun_once_its_inline_attempt_held_the_loop_the_hold_allowed() -> None:
    """An attempt that held the loop HELD_SECONDS already (an ensemble's earlier steps) begins
    no run inline: the request starts again on a thread, the model must be quick for twice
    the runs again, and its session did not run."""
    loaded = _loaded(_chain(2))
    loaded.run(_rows(1))  # on a thread: the estimate is made
    session = _CountedSession(loaded.session)
    loaded = _quick(replace(loaded, session=session))
    attempt = InlineAttempt()
    attempt.started -= int(2 * HELD_SECONDS * 1e9)  # as if the attempt began 10 ms ago
    assert loaded.gate.open
    with pytest.raises(RunOffLoop):
        loaded.run(_rows(1), ctx=replace(INLINE, attempt=attempt))
    assert session.runs == 0
    assert loaded.gate.holds == 1 and not loaded.gate.open
    attempt.begin()  # a new attempt: the run is begun (the way open again first)
    for _ in range(2 * QUICK_RUNS):
        loaded.gate.ran(0.0)
    answered = loaded.run(_rows(1), ctx=replace(INLINE, attempt=attempt)).outputs["y"]
    np.testing.assert_allclose(answered, _expected(2, 1), rtol=1e-6)
    assert session.runs == 1


def _ensemble_of(steps: int) -> str:
    return ('name: "steps"\nplatform: "ensemble"\nmax_batch_size: 0\n'
            'input [{name: "x" data_type: TYPE_FP32 dims: [-1, 64]}]\n'
            'output [{name: "y" data_type: TYPE_FP32 dims: [-1, 64]}]\n'
            + chained_steps("step", steps, ("x", "y")))  # fmt: skip


def _step_seconds(data: bytes, rows: int) -> float:
    """The median time of a run of `data` on `rows` rows, on a thread, in this process."""
    loaded = _loaded(data)
    times = []
    for _ in range(21):
        started = time.perf_counter()
        loaded.run(_rows(rows))
        times.append(time.perf_counter() - started)
    return sorted(times)[len(times) // 2]


def _inline_attempts(
    root: Path, monkeypatch: pytest.MonkeyPatch, step: bytes, steps: int, rows: int, until: int
) -> dict[int, list[tuple[float, float]]]:
    """Calls through the door to an ensemble of `steps` runs of `step` (a chain of STEADY
    MatMuls: its answer is ones), each answered 200 with ones, until `until` of its attempts
    ran a step inline (at most 400 calls): each attempt's inline runs, when each began and
    ended, by the attempt's start."""
    (root / "step" / "1").mkdir(parents=True)
    (root / "step" / "1" / "model.onnx").write_bytes(step)
    (root / "step" / "config.pbtxt").write_text(
        'max_batch_size: 0\ninput [{name: "x" data_type: TYPE_FP32 dims: [-1, 64]}]\n'
        'output [{name: "y" data_type: TYPE_FP32 dims: [-1, 64]}]\n')  # fmt: skip
    (root / "steps" / "1").mkdir(parents=True)
    (root / "steps" / "config.pbtxt").write_text(_ensemble_of(steps))
    attempts: dict[int, list[tuple[float, float]]] = {}
    inline_run = OrtModel._inline_run

    def timed(self: OrtModel, *args: Any) -> Any:
        started = time.perf_counter()
        produced = inline_run(self, *args)
        attempts.setdefault(args[-1].started, []).append((started, time.perf_counter()))
        return produced

    monkeypatch.setattr(OrtModel, "_inline_run", timed)
    body = {"inputs": [{"name": "x", "shape": [rows, 64], "datatype": "FP32",
                        "data": [1.0] * (rows * 64)}]}  # fmt: skip
    settings = Settings(model_repository=root, access_log=False)
    with TestClient(create_app(settings), raise_server_exceptions=False) as client:
        for _ in range(400):
            answer = client.post("/v2/models/steps/infer", json=body)
            assert answer.status_code == 200, answer.text
            np.testing.assert_array_equal(answer.json()["outputs"][0]["data"],
                                          np.ones(rows * 64))  # fmt: skip
            if len(attempts) >= until:
                break
    assert len(attempts) >= until, "the steps never ran inline"
    return attempts


def test_an_ensemble_of_chained_steps_answers_inline_as_on_threads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Three quick steps, each reading the one before: all three run in one inline attempt,
    and each intermediate is let go once its last reader ran (an unclaimed one, inline, was
    let go twice: a 500 from the third step on)."""
    monkeypatch.setattr(ort_inline, "QUICK_RUN_SECONDS", 0.004)
    attempts = _inline_attempts(tmp_path, monkeypatch, _chain(1, STEADY), 3, 2, until=4)
    assert max(len(runs) for runs in attempts.values()) == 3


def test_an_ensembles_steps_inline_hold_the_loop_as_one_attempt(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An ensemble of quick steps whose runs together take several times HELD_SECONDS (sized
    from the step's time measured here): each step's run is quick, so each may run inline,
    but one request's steps run in one attempt, and no step begins once the attempt held the
    loop HELD_SECONDS. So an attempt's inline runs, from the first one's start to the start of
    the last, span at most HELD_SECONDS (each run inline timed as it ran; before, every step
    ran inline, K runs end to end); the attempt that stopped starts again on a thread, and
    every answer is the chain's. A run counts as quick up to 4 ms here (not 1 ms), so that a
    busy host still opens the way."""
    monkeypatch.setattr(ort_inline, "QUICK_RUN_SECONDS", 0.004)
    rows, nodes = 16, 4  # a small body (under INLINE_BODY_BYTES), so the request may go inline
    while (seconds := _step_seconds(step := _chain(nodes, STEADY), rows)) < 0.0003:
        nodes *= 2
    steps = max(4, min(64, math.ceil(4 * HELD_SECONDS / seconds)))
    assert steps * seconds > 2 * HELD_SECONDS, (steps, seconds)
    # two attempts: beside three busy loops on 2 cores, 400 calls made two (a run over
    # HELD_SECONDS sends the model back to threads for a while)
    attempts = _inline_attempts(tmp_path, monkeypatch, step, steps, rows, until=2)
    for runs in attempts.values():
        assert len(runs) < steps
        assert runs[-1][0] - runs[0][0] <= HELD_SECONDS, runs


def test_the_v1_run_route_runs_a_quick_repository_model_inline_as_v2_does(
    chain_client: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """POST /v1/models/{name}/run with a small body: inline once the model is quick (counted
    at OrtModel._inline_run), the same answer as on threads."""
    answered_inline = _counted_inline_runs(monkeypatch)
    body = {"inputs": {"x": {"dtype": "float", "shape": [2, 64], "data": [1.0] * 128}}}
    expected = _expected(3, 2).reshape(-1)
    for _ in range(40 * QUICK_RUNS):
        answer = chain_client.post("/v1/models/chain/run", json=body)
        assert answer.status_code == 200, answer.text
        np.testing.assert_allclose(answer.json()["outputs"]["y"]["data"], expected, rtol=1e-6)
        if len(answered_inline) == 8:
            break
    assert len(answered_inline) == 8


def test_a_posted_model_kept_on_onnxruntime_is_run_from_the_loop(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """POST /v1/models/run, engine onnxruntime, a small JSON body: the first call loads the
    model on a thread; once it is kept, the loop sends its runs to a worker itself
    (Execution._in_worker answers them), and the answers are the same. A form body, and a
    model on the exact engine, are run on a thread (never from the loop)."""
    from service.core.execution import Execution

    from .models import b64

    from_loop = []
    in_worker = Execution._in_worker

    async def counted(self: Execution, *args: Any) -> Any:
        answered = await in_worker(self, *args)
        from_loop.append(answered is not None)
        return answered

    monkeypatch.setattr(Execution, "_in_worker", counted)
    posted = model([helper.make_node("MatMul", ["x", "w"], ["y"])], [value("x", F, [2, 64])],
                   [value("y", F, [2, 64])], {"w": W})  # fmt: skip
    inputs = {"x": {"dtype": "float", "shape": [2, 64], "data": [1.0] * 128}}
    body = {"model": b64(posted), "engine": "onnxruntime", "inputs": inputs}
    expected = _expected(1, 2).reshape(-1)
    settings = Settings(access_log=False, reference_fallback=True)  # MatMul on the exact engine
    with TestClient(create_app(settings), raise_server_exceptions=False) as c:
        for _ in range(50):
            answer = c.post("/v1/models/run", json=body)
            assert answer.status_code == 200, answer.text
            np.testing.assert_allclose(answer.json()["outputs"]["y"]["data"], expected,
                                       rtol=1e-6)  # fmt: skip
            if sum(from_loop) >= 3:
                break
        assert sum(from_loop) >= 3, from_loop
        asked = len(from_loop)
        form = c.post(
            "/v1/models/run",
            files={"model": ("m.onnx", posted.SerializeToString())},
            data={"request": json.dumps({"engine": "onnxruntime", "inputs": inputs})},
        )
        exact = c.post("/v1/models/run", json={**body, "engine": "exact"})
        for answer in (form, exact):
            assert answer.status_code == 200, answer.text
            np.testing.assert_allclose(answer.json()["outputs"]["y"]["data"], expected,
                                       rtol=1e-6)  # fmt: skip
        assert len(from_loop) == asked


def test_an_answer_too_long_to_write_inline_sends_the_model_to_threads_a_while(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A quick model whose JSON answer could pass INLINE_JSON_ANSWER_BYTES: its inline run
    ends in RunOffLoop (a thread runs it again and writes the answer), and the gate counts a
    hold, so the next calls go to threads from the start instead of running twice. The hold
    allowed is made long: on a busy host the run itself took over 5 ms once, a second hold."""
    monkeypatch.setattr(ort_inline, "HELD_SECONDS", 60.0)
    monkeypatch.setattr(ort_model, "HELD_SECONDS", 60.0)
    rows = INLINE_JSON_ANSWER_BYTES // (8 * 64)  # float32 values whose text could pass it
    loaded = _loaded(_chain(1))
    loaded.run(_rows(rows))  # on a thread: the estimates are made
    loaded.run(_rows(2))
    _quick(loaded)
    json_inline = INLINE.for_format("json")
    with pytest.raises(RunOffLoop):
        loaded.run(_rows(rows), ctx=json_inline)
    assert loaded.gate.holds == 1 and not loaded.gate.open
    for _ in range(2 * QUICK_RUNS):
        loaded.gate.ran(0.0)
    short = loaded.run(_rows(2), ctx=json_inline).outputs["y"]  # a short answer: inline
    np.testing.assert_allclose(short, _expected(1, 2), rtol=1e-6)
