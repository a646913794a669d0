"""engines/workers/on_loop.py through a real Execution, a real FallbackPool and its worker
processes on onnxruntime: a small run of a client's model whose worker holds the model is
awaited on the event loop (no kernel thread is asked for) and answers as numpy does; a large
answer is taken on a thread from the same reply (the model runs once); at the deadline, when
the run is cancelled or the server stops, the worker is killed at once and the run answers
its error; a worker that crashes names its signal; the next run is served."""

import asyncio
import os
import time
from collections.abc import Callable, Coroutine, Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import uvloop
from onnx import ModelProto, TensorProto, helper

from service.core.execution import Execution
from service.core.memory_budget import MemoryBudget
from service.core.offload import Offloader
from service.core.statistics import Timings
from service.engines.choice import load_in_workers
from service.engines.onnxruntime.isolated import IsolatedOrtModel
from service.engines.workers.pool import FallbackPool
from service.errors import Overloaded, RunCancelled, RunTimeout, WorkerDied
from service.kernels.context import KernelContext
from service.runtime.graph import LoadedModel, RunResult
from service.runtime.run_control import SHUTTING_DOWN
from service.settings import Settings
from tests.bounds.hostile_ort import empty_loop
from tests.conformance.test_ort_crashes import divide

SETTINGS = Settings(fallback_workers=1, isolated_restart_seconds=0)
SLOW = 30.0  # the deadline of runs that start a worker (its imports, on a busy host)
SHORT = 1.5  # the deadline of a run that never ends
HANG = {"x": np.ones(1, np.float32), "trips": np.array([10**15]), "cond": np.array([True])}
FINE = {"x": np.ones(1, np.float32), "trips": np.array([3]), "cond": np.array([True])}


class Counting(Offloader):
    """The kernel threads, counting the works given to them."""

    def __init__(self) -> None:
        super().__init__(2, 4)
        self.submitted = 0

    def submit(self, work: Callable[..., Any], *args: Any) -> "Future[Any]":
        self.submitted += 1
        return super().submit(work, *args)


class CountingPool(FallbackPool):
    """The workers, counting the runs sent from a thread."""

    def __init__(self, settings: Settings) -> None:
        super().__init__(settings)
        self.runs = 0

    def run(self, *args: Any, **kwargs: Any) -> RunResult:
        self.runs += 1
        return super().run(*args, **kwargs)


class Run:
    """A model's run as execution.py's Work: its outputs."""

    holding = 0

    def __init__(self, model: LoadedModel, inputs: dict[str, np.ndarray]) -> None:
        self.model, self.inputs = model, inputs
        self.timings = Timings()

    def __call__(self, ctx: KernelContext) -> dict[str, np.ndarray]:
        self.timings.started = time.perf_counter_ns()
        return self.model.run(self.inputs, ctx=ctx).outputs


def _model(nodes: list[Any], inputs: list[Any], outputs: list[Any]) -> ModelProto:
    graph = helper.make_graph(nodes, "g", inputs, outputs)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def tile() -> ModelProto:
    """y = Tile(x, repeats) + 1: a small request's answer as large as it likes."""
    f, i64 = TensorProto.FLOAT, TensorProto.INT64
    return _model([helper.make_node("Tile", ["x", "r"], ["t"]),
                   helper.make_node("Add", ["t", "one"], ["y"])],
                  [helper.make_tensor_value_info("x", f, [None]),
                   helper.make_tensor_value_info("r", i64, [1]),
                   helper.make_tensor_value_info("one", f, [1])],
                  [helper.make_tensor_value_info("y", f, [None])])  # fmt: skip


def weighty() -> ModelProto:
    """y = x + ReduceSum(w), w a 1 MiB initializer of ones: bytes the socket's buffer does
    not take whole, sent to a worker from a thread."""
    f = TensorProto.FLOAT
    w = helper.make_tensor("w", f, [2**18], np.ones(2**18, np.float32).tobytes(), raw=True)
    graph = helper.make_graph([helper.make_node("ReduceSum", ["w"], ["s"], keepdims=1),
                               helper.make_node("Add", ["x", "s"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", f, [1])],
                              [helper.make_tensor_value_info("y", f, [1])], [w])  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _isolated(built: ModelProto) -> IsolatedOrtModel:
    return load_in_workers(built.SerializeToString(), SETTINGS)


@pytest.fixture(params=["asyncio", "uvloop"])
def run(request: pytest.FixtureRequest) -> Callable[[Coroutine[Any, Any, None]], None]:
    """Runs a scenario on the event loop the server may have: uvloop's add_reader makes the
    socket it watches non-blocking (asyncio's does not), and a worker's socket is read
    blocking again from a kernel thread."""

    def on_loop(scenario: Coroutine[Any, Any, None]) -> None:
        loop = uvloop.new_event_loop() if request.param == "uvloop" else asyncio.new_event_loop()
        try:
            loop.run_until_complete(scenario)
        finally:
            loop.run_until_complete(loop.shutdown_default_executor())
            loop.close()

    return on_loop


@pytest.fixture
def pool() -> Iterator[CountingPool]:
    made = CountingPool(SETTINGS)
    yield made
    made.close()


@pytest.fixture
def threads() -> Iterator[Counting]:
    made = Counting()
    yield made
    made.close()


def _execution(threads: Offloader, pool: FallbackPool, seconds: float) -> Execution:
    return Execution(threads, SETTINGS.max_output_bytes, None, max_run_seconds=seconds,
                     fallback=pool)  # fmt: skip


async def _ask(execution: Execution, work: Run) -> dict[str, np.ndarray]:
    async with MemoryBudget(1 << 30, 5.0).reservation() as held:
        return await execution.run(work, held, inline=True)


def _worker_pid(pool: FallbackPool) -> int:
    (worker,) = pool.workers
    return worker.process.pid


def _gone(pid: int, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/status").read_text().split("State:")[1].split()[0]
        except OSError:
            return True
        if state == "Z":
            return True
        time.sleep(0.02)
    return False


def test_a_small_run_is_awaited_on_the_loop_and_a_large_answer_taken_on_a_thread(
    threads: Counting, pool: CountingPool, run: Callable[[Any], None],
) -> None:  # fmt: skip
    model = _isolated(tile())
    one = np.array([1], np.float32)
    x = np.arange(4, dtype=np.float32)
    execution = _execution(threads, pool, SLOW)

    async def scenario() -> None:
        first = await _ask(execution, Run(model, {"x": x, "r": np.array([2]), "one": one}))
        assert first["y"].tolist() == (np.tile(x, 2) + 1).tolist()
        assert threads.submitted == 1 and pool.runs == 1  # the model went to the worker
        for repeats in (3, 5, 1000):
            got = await _ask(execution, Run(model, {"x": x, "r": np.array([repeats]),
                                                    "one": one}))  # fmt: skip
            np.testing.assert_array_equal(got["y"], np.tile(x, repeats) + 1)
        assert threads.submitted == 1 and pool.runs == 1  # no thread, no second send
        # 8 MiB from a small request: the loop's reply, unpacked on a thread (claimed there)
        large = await _ask(execution, Run(model, {"x": x, "r": np.array([2**19]), "one": one}))
        np.testing.assert_array_equal(large["y"], np.tile(x, 2**19) + 1)
        assert threads.submitted == 2 and pool.runs == 1  # a thread, but the run was once
        # inputs for shared memory go from a thread, to the worker the loop used just now
        wide = np.arange(2**18, dtype=np.float32)
        got = await _ask(execution, Run(model, {"x": wide, "r": np.array([1]), "one": one}))
        np.testing.assert_array_equal(got["y"], wide + 1)
        assert threads.submitted == 3 and pool.runs == 2 and len(pool.workers) == 1
        # another model's first run: its bytes go from a thread, through the same socket
        other = _isolated(weighty())
        got = await _ask(execution, Run(other, {"x": np.array([0.5], np.float32)}))
        assert got["y"].tolist() == [2**18 + 0.5]
        assert threads.submitted == 4 and pool.runs == 3 and len(pool.workers) == 1
        assert pool.directory is not None  # the reply's file was taken and removed
        assert [n for n in os.listdir(pool.directory) if not n.endswith(".node")] == []

    run(scenario())


def test_a_run_on_the_loop_past_its_deadline_kills_its_worker(
    threads: Counting, pool: CountingPool, run: Callable[[Any], None],
) -> None:  # fmt: skip
    model = _isolated(empty_loop())

    async def scenario() -> None:
        assert (await _ask(_execution(threads, pool, SLOW), Run(model, FINE)))["y"] == [1.0]
        pid = _worker_pid(pool)
        start = time.monotonic()
        with pytest.raises(RunTimeout, match="OPSERVE_MAX_RUN_SECONDS"):
            await _ask(_execution(threads, pool, SHORT), Run(model, HANG))
        assert SHORT <= time.monotonic() - start < SHORT + 2
        assert threads.submitted == 1  # the first run only
        assert _gone(pid, 5)
        assert (await _ask(_execution(threads, pool, SLOW), Run(model, FINE)))["y"] == [1.0]

    run(scenario())


@pytest.mark.parametrize("how", ["shutdown", "task"])
def test_a_run_on_the_loop_stopped_or_cancelled_kills_its_worker(
    how: str, threads: Counting, pool: CountingPool, run: Callable[[Any], None],
) -> None:  # fmt: skip
    model = _isolated(empty_loop())
    execution = _execution(threads, pool, SLOW)

    async def scenario() -> None:
        assert (await _ask(execution, Run(model, FINE)))["y"] == [1.0]
        pid = _worker_pid(pool)
        hung = asyncio.ensure_future(_ask(execution, Run(model, HANG)))
        await asyncio.sleep(0.5)
        assert not hung.done() and len(execution.waits) == 1
        start = time.monotonic()
        if how == "shutdown":
            for wait in list(execution.waits):
                wait.cancel(SHUTTING_DOWN)  # as stop_all does, the pool left open
            with pytest.raises(Overloaded, match="shutting down"):
                await hung
        else:
            hung.cancel()
            with pytest.raises(asyncio.CancelledError):
                await hung
        assert time.monotonic() - start < 1
        assert _gone(pid, 5) and not execution.waits
        assert (await _ask(execution, Run(model, FINE)))["y"] == [1.0]

    run(scenario())


def test_a_client_that_left_stops_its_run_on_the_loop(
    threads: Counting, pool: CountingPool, run: Callable[[Any], None],
) -> None:  # fmt: skip
    model = _isolated(empty_loop())
    execution = _execution(threads, pool, SLOW)

    async def scenario() -> None:
        assert (await _ask(execution, Run(model, FINE)))["y"] == [1.0]
        pid = _worker_pid(pool)
        left = asyncio.Event()
        start = time.monotonic()
        asyncio.get_running_loop().call_later(0.3, left.set)
        async with MemoryBudget(1 << 30, 5.0).reservation() as held:
            with pytest.raises(RunCancelled, match="closed the connection"):
                await execution.run(Run(model, HANG), held, inline=True,
                                    disconnected=left.wait)  # fmt: skip
        assert time.monotonic() - start < 2
        assert _gone(pid, 5)

    run(scenario())


def test_a_crash_on_the_loop_names_its_signal_and_the_next_run_is_served(
    threads: Counting, pool: CountingPool, run: Callable[[Any], None],
) -> None:  # fmt: skip
    model = _isolated(divide(TensorProto.INT32))
    execution = _execution(threads, pool, SLOW)
    fine = {"a": np.array([-9, 7], np.int32), "b": np.array([2, -2], np.int32)}
    hostile = {"a": np.array([-(2**31), 7], np.int32), "b": np.array([-1, 2], np.int32)}

    async def scenario() -> None:
        assert (await _ask(execution, Run(model, fine)))["y"].tolist() == [-4, -3]
        with pytest.raises(WorkerDied, match="SIGFPE"):
            await _ask(execution, Run(model, hostile))
        assert threads.submitted == 1
        assert (await _ask(execution, Run(model, fine)))["y"].tolist() == [-4, -3]

    run(scenario())


def _maps_onnxruntime(pid: int) -> bool:
    try:
        return "onnxruntime" in Path(f"/proc/{pid}/maps").read_text()
    except OSError:
        return False


def test_the_replacement_of_a_crashed_worker_has_onnxruntime_before_its_first_run(
    threads: Counting, pool: CountingPool, run: Callable[[Any], None],
) -> None:  # fmt: skip
    """A worker started once the pool has run a client's model imports onnxruntime as it
    starts: the next client's first run does not wait for the import. A pool's first worker,
    started before any such run, does not (a pool that only runs the exact engine never
    pays for it)."""
    model = _isolated(divide(TensorProto.INT32))
    execution = _execution(threads, pool, SLOW)
    fine = {"a": np.array([-9, 7], np.int32), "b": np.array([2, -2], np.int32)}
    hostile = {"a": np.array([-(2**31), 7], np.int32), "b": np.array([-1, 2], np.int32)}
    first = pool._started()  # as the pool starts its first worker: nothing run yet
    try:
        time.sleep(1.0)  # room for an import it should not make
        assert not _maps_onnxruntime(first.process.pid)
    finally:
        first.kill()

    async def scenario() -> None:
        assert (await _ask(execution, Run(model, fine)))["y"].tolist() == [-4, -3]
        with pytest.raises(WorkerDied, match="SIGFPE"):
            await _ask(execution, Run(model, hostile))

    run(scenario())
    deadline = time.monotonic() + 30
    while not pool.workers and time.monotonic() < deadline:
        time.sleep(0.02)  # the replacement starts on a timer
    pid = _worker_pid(pool)
    while not _maps_onnxruntime(pid) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert _maps_onnxruntime(pid), "the replacement did not import onnxruntime as it started"
