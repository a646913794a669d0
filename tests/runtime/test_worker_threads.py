"""Threads of a client's model in the isolated workers (issue 31, "the same in the workers"): a
run that starts with no other run on onnxruntime in flight gets every core in its worker, as a
lone run in process does; one that starts beside another (in process or in another worker)
gets the workers' share; and an in-process run that starts while a worker's run is in flight
gets its share, as the two run on the same cores.

What a run used is observed, not taken from the bookkeeping: the worker's intra-op pool
threads are its tasks other than its main thread (/proc/<pid>/task), and the CPU time the
kernel charged them says whether a run used them. Both ways a worker's run is awaited are
checked: on the event loop (a small request) and from a kernel thread."""

import asyncio
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
from onnx import ModelProto, TensorProto, helper

from service.core.execution import Execution
from service.core.memory_budget import MemoryBudget
from service.core.offload import Offloader
from service.engines.choice import load_in_workers
from service.engines.onnxruntime.isolated import IsolatedOrtModel
from service.engines.onnxruntime.session import CORES, Threads, cores
from service.engines.workers.pool import FallbackPool
from service.settings import Settings
from tests.core.test_isolated_on_loop import Run

SETTINGS = Settings(fallback_workers=2, isolated_restart_seconds=0)
X = np.random.default_rng(0).standard_normal((1, 16, 8, 8)).astype(np.float32)  # 4 KiB
observed = pytest.mark.skipif(not Path("/proc/self/task").is_dir() or cores() < 2,
                              reason="threads are observed through /proc, on 2 cores or more")  # fmt: skip


def convs() -> ModelProto:
    """A small input tiled to [1,16,96,96], then four 3x3 convolutions of 32 channels: tens of
    milliseconds a run on one thread, which onnxruntime splits among its intra-op threads."""
    rng = np.random.default_rng(1)
    f = TensorProto.FLOAT
    reps = helper.make_tensor("reps", TensorProto.INT64, [4], [1, 1, 12, 12])
    nodes = [helper.make_node("Tile", ["x", "reps"], ["t"])]
    weights, x, before = [reps], "t", 16
    for i in range(4):
        kernel = (rng.standard_normal((32, before, 3, 3)) * 0.05).astype(np.float32)
        weights.append(helper.make_tensor(f"k{i}", f, kernel.shape, kernel.tobytes(), raw=True))
        nodes.append(helper.make_node("Conv", [x, f"k{i}"], [f"c{i}"], pads=[1, 1, 1, 1]))
        x, before = f"c{i}", 32
    nodes.append(helper.make_node("ReduceMean", [x], ["y"], keepdims=0))
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", f, [1, 16, 8, 8])],
                              [helper.make_tensor_value_info("y", f, [])], weights)  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _ticks(pid: int) -> int:
    """User and system clock ticks charged to the worker's threads but its main one."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        if int(task.name) != pid:
            fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15)
    return total


@pytest.fixture
def pool() -> Iterator[FallbackPool]:
    made = FallbackPool(SETTINGS)
    yield made
    made.close()


def _runs(execution: Execution, model: IsolatedOrtModel, count: int, inline: bool) -> list[float]:
    async def runs() -> list[float]:
        got = []
        for _ in range(count):
            async with MemoryBudget(1 << 30, 5.0).reservation() as held:
                outputs = await execution.run(Run(model, {"x": X}), held, inline=inline)
            got.append(float(outputs["y"]))
        return got

    return asyncio.run(runs())


@observed
@pytest.mark.parametrize("inline", [True, False], ids=["on the loop", "from a thread"])
def test_a_lone_run_in_a_worker_uses_every_core_and_one_beside_another_its_share(
    pool: FallbackPool, inline: bool
) -> None:
    model = load_in_workers(convs().SerializeToString(), SETTINGS)
    assert pool.ort_threads == Threads(cores(), max(1, cores() // 2))
    offloader = Offloader(2, 4)
    execution = Execution(offloader, SETTINGS.max_output_bytes, None, max_run_seconds=60.0,
                          fallback=pool)  # fmt: skip
    try:
        expected = ort.InferenceSession(convs().SerializeToString(),
                                        providers=["CPUExecutionProvider"]).run(None, {"x": X})[0]  # fmt: skip
        _runs(execution, model, 1, inline)  # the worker starts and opens the model
        (worker,) = pool.workers
        pid = worker.process.pid
        before = _ticks(pid)
        alone = _runs(execution, model, 20, inline)
        assert _ticks(pid) - before > 0, "a lone run in a worker left its pool threads idle"
        np.testing.assert_allclose(alone, float(expected), rtol=1e-4, atol=1e-6)

        if cores() // 2 > 1:
            pytest.skip("more than two cores: the share has pool threads of its own too")
        other = CORES.take(Threads(cores(), 1))  # an in-process run in flight, every core
        try:
            before = _ticks(pid)
            beside = _runs(execution, model, 20, inline)
            assert _ticks(pid) == before, "a run beside another used the lone run's threads"
        finally:
            CORES.give(other)
        np.testing.assert_allclose(beside, float(expected), rtol=1e-4, atol=1e-6)
        assert CORES.in_flight == 0 and CORES.booked == 0
    finally:
        offloader.close()


@observed
def test_an_in_process_run_beside_a_workers_run_gets_its_share(pool: FallbackPool) -> None:
    """While a worker's run is in flight, the server's CORES counts it: a run starting in
    process then is given the share, not every core."""
    model = load_in_workers(convs().SerializeToString(), SETTINGS)
    offloader = Offloader(2, 4)
    execution = Execution(offloader, SETTINGS.max_output_bytes, None, max_run_seconds=60.0,
                          fallback=pool)  # fmt: skip
    done = threading.Event()

    def runs() -> None:
        while not done.is_set():
            _runs(execution, model, 1, inline=False)

    runner = threading.Thread(target=runs)
    runner.start()
    given: list[int] = []
    try:
        deadline = time.monotonic() + 60
        while 1 not in given and time.monotonic() < deadline:
            taken = CORES.take(Threads(cores(), 1))  # as an in-process run starts
            CORES.give(taken)
            given.append(taken)
            time.sleep(0.002)
    finally:
        done.set()
        runner.join(60)
        offloader.close()
    # with only the workers' runs in flight, a run starting in process was given the share
    assert 1 in given, f"every take got every core: {set(given)}"
    assert CORES.in_flight == 0 and CORES.booked == 0
