"""Freed heap memory goes back to the system once large requests stop: trim_heap against a
heap with real holes, HeapTrim's wait for quiet, and the memory budget that starts it."""

import platform
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from service.core.heap_trim import HeapTrim
from service.core.memory_budget import MemoryBudget, Reservation
from service.main import create_app
from service.settings import Settings

MiB = 1024 * 1024
ROOT = Path(__file__).resolve().parents[2]
glibc = pytest.mark.skipif(
    platform.system() != "Linux" or platform.libc_ver()[0] != "glibc", reason="glibc only"
)


def _until(condition: Callable[[], bool], seconds: float = 5.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.01)
    return condition()


HOLES = """
import ctypes
from service.kernels.allocator import configure_allocator, trim_heap

MiB = 1024 * 1024
def resident():
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * 4096
assert configure_allocator(64 * MiB)  # as the app does: blocks this size come from the heap
libc = ctypes.CDLL("libc.so.6")
libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
blocks = []
for _ in range(8):
    block = libc.malloc(16 * MiB)
    ctypes.memset(block, 1, 16 * MiB)  # resident
    blocks.append(block)
    libc.malloc(2 * MiB)  # carved from the top, above the block: kept to the end
for block in blocks:
    libc.free(block)
kept = resident()
trimmed = trim_heap()
print(trimmed, kept - resident())
"""


@glibc
def test_trim_heap_returns_holes_below_a_block_in_use() -> None:
    """Eight 16 MiB blocks, each with a block in use above it, freed: glibc keeps them all
    (only the heap's top goes back on free); trim_heap returns them. In a fresh interpreter:
    a test worker's heap holds what earlier tests left (one run there gave back 35 MiB)."""
    done = subprocess.run([sys.executable, "-c", HOLES], capture_output=True, text=True,
                          cwd=ROOT, timeout=60, check=True)  # fmt: skip
    trimmed, given_back = done.stdout.split()
    assert trimmed == "True" and int(given_back) > 100 * MiB, done.stdout


def _counting(busy: Callable[[], bool] = lambda: False, quiet: float = 0.2) -> HeapTrim:
    trim = HeapTrim(busy, quiet=quiet, trim=lambda: None)
    return trim


def test_one_trim_after_the_quiet_time_however_many_idles() -> None:
    trim = _counting(quiet=1.0)  # a second: a busy host's late wake-up stays within it
    start = time.monotonic()
    for _ in range(5):
        trim.idle()
        time.sleep(0.05)  # each idle within the quiet time of the last
    assert trim.trims == 0
    assert _until(lambda: trim.trims == 1)
    assert time.monotonic() - start >= 1.0 + 4 * 0.05
    time.sleep(0.4)
    assert trim.trims == 1  # no second trim without a new idle
    trim.idle()
    assert _until(lambda: trim.trims == 2)


def test_idles_while_it_waits_do_not_wake_its_thread() -> None:
    """The budget may fall idle on every request (cluster mode's sequence steps claim their
    state from it): an idle() during the wait only notes the time, where waking the waiting
    thread each time cost a cluster step a third of a millisecond. Counted as the calls the
    waiting thread makes (threading.setprofile), not timed."""
    calls: list[str] = []

    def profile(frame: object, event: str, arg: object) -> None:
        if threading.current_thread().name == "opserve-heap-trim":
            calls.append(event)

    trim = HeapTrim(lambda: False, quiet=0.3, trim=lambda: None)
    threading.setprofile(profile)
    try:
        for _ in range(500):
            trim.idle()
            time.sleep(0.0005)
        assert trim.trims == 0
        assert _until(lambda: trim.trims == 1)
    finally:
        threading.setprofile(None)
    assert len(calls) < 100, len(calls)  # the old Event woke it once per idle(): thousands


def test_no_trim_while_busy() -> None:
    busy = threading.Event()
    busy.set()
    trim = HeapTrim(busy.is_set, quiet=0.05, trim=lambda: pytest.fail("trimmed while busy"))
    trim.idle()
    assert _until(lambda: trim._waiter is None)
    assert trim.trims == 0


def test_the_budget_calls_on_idle_when_nothing_is_held() -> None:
    budget = MemoryBudget(100, wait_seconds=0)
    calls: list[int] = []
    budget.on_idle = lambda: calls.append(budget.used)
    first, second = Reservation(budget), Reservation(budget)
    first.claim(30)
    second.claim(20)
    first.release()
    assert calls == []  # the second still holds its share
    second.release()
    assert calls == [0]


def test_the_app_trims_after_a_large_request() -> None:
    """A large request through the app: its budget falls idle and the app's HeapTrim runs."""
    app = create_app(Settings())
    idle = app.state.memory_budget.on_idle
    heap_trim = idle.__self__
    assert isinstance(heap_trim, HeapTrim)
    fill = {"inputs": {"input": {"dtype": "int64", "data": [2 * MiB]}},
            "attributes": {"value": {"dtype": "float", "shape": [1], "data": [1.5]}},
            "output_format": "tensor_proto"}  # fmt: skip
    with TestClient(app) as client:
        assert client.post("/v1/ops/ConstantOfShape/25", json=fill).status_code == 200
        assert _until(lambda: heap_trim.trims == 1, 10)


def test_a_zero_trim_setting_turns_the_trim_off() -> None:
    assert create_app(Settings(heap_trim_seconds=0)).state.memory_budget.on_idle is None
    trim = create_app(Settings(heap_trim_seconds=2.5)).state.memory_budget.on_idle.__self__
    assert isinstance(trim, HeapTrim) and trim.quiet == 2.5
