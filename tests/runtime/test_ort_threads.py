"""Threads of runs on onnxruntime (service/engines/onnxruntime/session.py): a lone run uses
every core, and runs in flight together share them (each gets cores // OPSERVE_KERNEL_THREADS).

What a run used is observed, not taken from our own bookkeeping: the sessions' intra-op pool
threads are the threads that appear in /proc/self/task while the model is opened, and the CPU
time the kernel charged them (/proc/self/task/<tid>/stat) says whether a run used them."""

import os
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import pytest
from onnx import helper

from service.engines.choice import load_ort, load_repository_model
from service.engines.onnxruntime.session import (
    LOWEST_PRIORITY,
    PER_THREAD_PRIORITY,
    SPINNING,
    CoreShare,
    SharedSession,
    Threads,
    cores,
)
from service.errors import InvalidInput
from service.runtime.config.messages import ModelConfig
from service.settings import Settings

from .models import F, model, value

TASKS = Path("/proc/self/task")
observed = pytest.mark.skipif(not TASKS.is_dir() or cores() < 2,
                              reason="threads are observed through /proc, on 2 cores or more")  # fmt: skip
X = np.random.default_rng(0).standard_normal((1, 16, 96, 96)).astype(np.float32)


def _convs() -> bytes:
    """Four 3x3 convolutions of 32 channels on [1,16,96,96]: tens of milliseconds a run on
    one thread, which onnxruntime splits among its intra-op threads."""
    rng = np.random.default_rng(1)
    nodes, weights, x, before = [], {}, "x", 16
    for i in range(4):
        weights[f"k{i}"] = (rng.standard_normal((32, before, 3, 3)) * 0.05).astype(np.float32)
        nodes.append(helper.make_node("Conv", [x, f"k{i}"], [f"c{i}"], pads=[1, 1, 1, 1]))
        x, before = f"c{i}", 32
    nodes.append(helper.make_node("ReduceMean", [x], ["y"], keepdims=0))
    built = model(nodes, [value("x", F, [1, 16, 96, 96])], [value("y", F, [])], weights)
    return built.SerializeToString()


def _tasks() -> set[int]:
    return {int(name) for name in os.listdir(TASKS)}


def _stat(tid: int) -> list[str]:
    """The fields of /proc/self/task/<tid>/stat after the thread's name (field 3 first)."""
    return (TASKS / str(tid) / "stat").read_text().rsplit(")", 1)[1].split()


def _cpu_ticks(tids: set[int]) -> int:
    """User and system clock ticks the kernel charged these threads so far."""
    total = 0
    for tid in tids:
        fields = _stat(tid)
        total += int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15)
    return total


def _opened(kernel_threads: int) -> tuple[SharedSession, set[int]]:
    """The model loaded as the server loads it (probe included), and the threads its
    sessions started."""
    before = _tasks()
    loaded = load_ort(_convs(), Settings(kernel_threads=kernel_threads))
    return loaded.session, _tasks() - before


@observed
def test_a_lone_run_uses_every_core() -> None:
    session, pool = _opened(kernel_threads=2)
    everyone, share = cores(), max(1, cores() // 2)
    assert session.threads == Threads(everyone, share)
    assert sorted(session.sessions) == sorted({everyone, share})
    # onnxruntime's intra-op pool of n threads is the caller and n - 1 threads it starts
    assert len(pool) == (everyone - 1) + (share - 1), pool
    expected = ort.InferenceSession(_convs(), providers=["CPUExecutionProvider"]).run(
        None, {"x": X})[0]  # fmt: skip
    before = _cpu_ticks(pool)
    for _ in range(20):  # alone: every run on every core
        got = session.run(None, {"x": X})[0]
    assert _cpu_ticks(pool) - before > 0, "a lone run left the pool's threads idle"
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-6)
    assert session.share.in_flight == 0 and session.share.booked == 0


@observed
def test_a_run_beside_another_takes_its_share_only() -> None:
    session, pool = _opened(kernel_threads=2)
    if cores() // 2 > 1:
        pytest.skip("more than two cores: the share has pool threads of its own too")
    share = CoreShare()
    beside = SharedSession(session.sessions, session.threads, share)
    other = share.take(session.threads)  # another run in flight, which took every core
    assert other == cores()
    before = _cpu_ticks(pool)
    for _ in range(20):
        beside.run(None, {"x": X})
    assert _cpu_ticks(pool) == before, "a run beside another used the lone run's threads"
    share.give(other)
    for _ in range(20):  # alone again: every core
        beside.run(None, {"x": X})
    assert _cpu_ticks(pool) > before


class _Watched(CoreShare):
    """A CoreShare that notes, at each run's start, the runs already in flight, the threads
    the run got, the threads booked then and whether a lone run (every core) is in flight."""

    def __init__(self, threads: Threads) -> None:
        super().__init__()
        self.threads = threads
        self.watch = threading.Lock()  # around take and give: what they see stays put
        self.starts: list[tuple[int, int, int, bool]] = []
        self.lone = 0  # runs in flight that were given every core

    def take(self, threads: Threads) -> int:
        with self.watch:
            in_flight = self.in_flight
            given = super().take(threads)
            self.lone += given == self.threads.alone
            self.starts.append((in_flight, given, self.booked, self.lone > 0))
            return given

    def give(self, given: int) -> None:
        with self.watch:
            super().give(given)
            self.lone -= given == self.threads.alone


@observed
@pytest.mark.parametrize("kernel_threads", [2, 4])
def test_runs_in_flight_together_do_not_oversubscribe(kernel_threads: int) -> None:
    """The rule: a run gets every core only when it starts alone; one that starts beside
    others gets the share, so runs that all started beside others book at most the cores
    (kernel_threads * (cores // kernel_threads)), and above them only while one lone run that
    had every core is still in flight (by the share of each run that started beside it)."""
    session, _pool = _opened(kernel_threads)
    share = _Watched(session.threads)
    shared = SharedSession(session.sessions, session.threads, share)
    everyone, part = cores(), max(1, cores() // kernel_threads)
    errors: list[BaseException] = []

    def runs() -> None:
        try:
            for _ in range(8):
                shared.run(None, {"x": X})
        except BaseException as exc:  # seen by the test's thread
            errors.append(exc)

    threads = [threading.Thread(target=runs) for _ in range(kernel_threads)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, errors
    assert share.in_flight == 0 and share.booked == 0
    assert len(share.starts) == 8 * kernel_threads
    beside = [start for start in share.starts if start[0]]
    assert beside, "no run started while another was in flight"
    assert all(given == part for _, given, _, _ in beside), share.starts
    assert all(given == everyone for in_flight, given, _, _ in share.starts if not in_flight)
    # with no lone run in flight, the runs book at most the cores (at least one thread each,
    # when there are more kernel threads than cores); with one, its cores and the share of
    # each run that started beside it
    limit = max(everyone, kernel_threads * part)
    assert all(booked <= limit for _, _, booked, lone in share.starts if not lone)
    most = everyone + part * (kernel_threads - 1)
    assert all(booked <= most for _, _, booked, _ in share.starts), share.starts


@observed
def test_one_kernel_thread_holds_one_session() -> None:
    session, pool = _opened(kernel_threads=1)
    assert session.threads == Threads(cores(), cores())
    assert list(session.sessions) == [cores()] and len(pool) == cores() - 1


@pytest.mark.parametrize(("files", "most"), [
    ({"cpu.max": "50000 100000\n"}, 1),  # half a core: one
    ({"cpu.max": "150000 100000\n"}, 2),  # a core and a half: two
    ({"cpu.max": "max 100000\n"}, None),
    ({"cpu/cpu.cfs_quota_us": "100000\n", "cpu/cpu.cfs_period_us": "100000\n"}, 1),
    ({"cpu/cpu.cfs_quota_us": "-1\n", "cpu/cpu.cfs_period_us": "100000\n"}, None),
    ({"cpu.max": "nonsense"}, None),
    ({}, None),
])  # fmt: skip
def test_a_containers_cpu_quota_bounds_the_cores(tmp_path: Path, files: dict[str, str],
                                                  most: Any) -> None:  # fmt: skip
    """A container limited to 1 CPU on a 32-core node sees 32 cores it may run on: the
    quota (cgroup v2 or v1) is what it has."""
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    scheduled = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    assert cores(tmp_path) == min(scheduled or 1, most or scheduled or 1)


def _cpu_ns(tids: set[int]) -> int:
    """The CPU time these threads had so far, in ns (schedstat: clock ticks are too coarse)."""
    return sum(int((TASKS / str(tid) / "schedstat").read_text().split()[0]) for tid in tids)


timed = pytest.mark.skipif(not (TASKS / str(threading.get_native_id()) / "schedstat").exists(),
                           reason="a thread's CPU time in ns is read from its schedstat")  # fmt: skip


def _nice(tid: int) -> int:
    return int(_stat(tid)[16])  # nice (field 19)


def _alive(tids: set[int]) -> set[int]:
    return {tid for tid in tids if (TASKS / str(tid)).exists()}


def _lowest_priority(tids: set[int], expected: int) -> set[int]:
    """Those of `tids` alive at nice 19, once they are `expected` or after 5 s: the thread that
    opened the session at nice 19 has ended when the load returns, but the system may show it
    a moment longer."""
    deadline = time.monotonic() + 5
    while True:
        lowest = set()
        for tid in _alive(tids):
            try:
                if _nice(tid) == LOWEST_PRIORITY:
                    lowest.add(tid)
            except FileNotFoundError:  # ended since
                pass
        if len(lowest) == expected or time.monotonic() > deadline:
            return lowest
        time.sleep(0.01)


CALLERS = os.getpriority(os.PRIO_PROCESS, 0)  # the tests' own nice value (`nice pytest`)


def _config(spinning: str | None) -> Any:
    config = ModelConfig()
    if spinning is not None:
        config.parameters[SPINNING].string_value = spinning
    return config


def _idle_cpu_after_runs(session: SharedSession, pool: set[int], tries: int) -> list[float]:
    """The pool's CPU (ms) in the 0.2 s after each of `tries` lone runs."""
    spent = []
    for _ in range(tries):
        session.run(None, {"x": X})
        before = _cpu_ns(pool)
        time.sleep(0.2)
        spent.append((_cpu_ns(pool) - before) / 1e6)
    return spent


@observed
@timed
@pytest.mark.skipif(not PER_THREAD_PRIORITY, reason="a spinning pool needs per-thread nice")
def test_the_spinning_parameter_spins_the_lone_pool_at_the_lowest_priority() -> None:
    """`session.intra_op.allow_spinning: "1"` (the operator's choice): the session with every
    core runs as onnxruntime's defaults do, its pool threads spinning after a run (about 40 ms
    of CPU), at nice 19 so that any other thread takes their core first; its answers are
    onnxruntime's defaults' own."""
    before = _tasks()
    loaded = load_repository_model(_convs(), _config("1"), Settings(kernel_threads=2))
    session, pool = loaded.session, _tasks() - before
    everyone = cores()
    lowest = _lowest_priority(pool, everyone - 1)
    assert len(lowest) == everyone - 1, (pool, [_nice(tid) for tid in _alive(pool)])
    assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) == CALLERS, "it stays"
    # spinning is a wait, so a busy host may starve a nice-19 thread of it: the best of five
    assert max(_idle_cpu_after_runs(session, lowest, tries=5)) > 2
    assert session.sessions[everyone].get_session_options().get_session_config_entry(
        SPINNING) == "1"  # fmt: skip
    expected = ort.InferenceSession(_convs(), providers=["CPUExecutionProvider"]).run(
        None, {"x": X})[0]  # fmt: skip
    np.testing.assert_allclose(session.run(None, {"x": X})[0], expected, rtol=1e-4, atol=1e-6)
    if everyone // 2 > 1:  # the share's pool, for runs beside others, never spins
        assert session.sessions[everyone // 2].get_session_options().get_session_config_entry(
            SPINNING) == "0"  # fmt: skip


@observed
@timed
@pytest.mark.parametrize("spinning", [None, "0"])
def test_by_default_the_pool_sleeps_between_runs(spinning: str | None) -> None:
    before = _tasks()
    loaded = load_repository_model(_convs(), _config(spinning), Settings(kernel_threads=2))
    session, pool = loaded.session, _tasks() - before
    assert pool and all(_nice(tid) == CALLERS for tid in pool)
    assert max(_idle_cpu_after_runs(session, pool, tries=3)) < 1


@pytest.mark.parametrize("value", ["true", "2", "", "yes"])
def test_a_spinning_parameter_other_than_0_or_1_is_refused(value: str) -> None:
    with pytest.raises(InvalidInput, match=r"'session.intra_op.allow_spinning' is .* it is '1'"):
        load_repository_model(_convs(), _config(value), Settings())


@observed
def test_a_model_with_one_session_never_spins() -> None:
    """With one kernel thread the model holds one session, which runs beside inline and the
    workers' runs too: it does not spin, whatever the parameter says."""
    before = _tasks()
    loaded = load_repository_model(_convs(), _config("1"), Settings(kernel_threads=1))
    session, pool = loaded.session, _tasks() - before
    (only,) = session.sessions.values()
    assert only.get_session_options().get_session_config_entry(SPINNING) == "0"
    assert _lowest_priority(pool, 0) == set()


@observed
def test_a_pool_the_system_will_not_lower_does_not_spin(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A sandbox that filters setpriority: the model loads on onnxruntime all the same (not
    on the exact engine, as a failed open would), its pool sleeping, and the log says why."""

    def refused(*_args: object) -> None:
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(os, "setpriority", refused)
    loaded = load_repository_model(_convs(), _config("1"), Settings(kernel_threads=2))
    assert loaded.engine == "onnxruntime"
    alone = loaded.session.sessions[cores()]
    assert alone.get_session_options().get_session_config_entry(SPINNING) == "0"
    assert "cannot run at nice 19" in caplog.text and "does not spin" in caplog.text
