"""Run request work inline when it is small, on a worker thread when it is large.

What large requests hold in memory is bounded by the memory budget (memory_budget.py), not
here: a large request takes nothing before its body has arrived, then queues for a thread.

Work on a thread holds one of OPSERVE_KERNEL_THREADS cores (`cores`) while it computes. Work
that waits on another process (a run in an isolated worker: engines/workers/pool.py) gives
its core back while it waits (`off_core`), so a client whose model runs, or hangs, in a worker
until its deadline does not take the cores other clients' runs need. The pool grows by one
thread per such wait, up to `waiting` more than cores; past that many at once, a wait keeps its
core (as every wait did before), so the threads never outnumber what is bounded. Until a wait
happens the pool keeps one thread per core: each thread gets a malloc arena of its own, and
more threads taking turns on the cores would keep more freed memory (three 300 MB decodes on
three threads held 885 MiB where two threads held the budget).
"""

import asyncio
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any, TypeVar

from service.codecs.limits import SMALL_BYTES
from service.kernels.context import RunOffLoop

T = TypeVar("T")

INLINE_BODY_BYTES = 64 * 1024
"""Bodies up to this size are decoded on the event loop: a thread hop costs more than they do."""

INLINE_OUTPUT_BYTES = SMALL_BYTES
"""Outputs up to this size are produced on the event loop; larger ones restart on a thread."""


class Offloader:
    """Small requests run inline; large ones (a body over INLINE_BODY_BYTES, one of unknown
    length, or an output over INLINE_OUTPUT_BYTES) on a pool of `threads` kernel threads."""

    def __init__(self, threads: int, waiting: int = 0) -> None:
        self.threads = threads
        self.waiting = waiting  # threads beyond `threads`, for waits off core
        self.cores = threading.Semaphore(threads)
        self._off = 0  # threads waiting off core now
        self._lock = threading.Lock()
        self._local = threading.local()  # whether this thread holds a core
        self._pool: ThreadPoolExecutor | None = None

    async def on_thread(self, work: Callable[..., T], *args: Any) -> T:
        """`work(*args)` on a kernel thread."""
        return await asyncio.wrap_future(self.submit(work, *args))

    def submit(self, work: Callable[..., T], *args: Any) -> "Future[T]":
        """`work(*args)` queued for a kernel thread; its future says whether it runs yet."""
        if self._pool is None:  # made on first use, again after close() (a new lifespan)
            self._pool = ThreadPoolExecutor(self.threads, thread_name_prefix="opserve-kernel")
        return self._pool.submit(self._on_core, work, *args)

    def _on_core(self, work: Callable[..., T], *args: Any) -> T:
        with self.cores:
            self._local.on_core = True
            try:
                return work(*args)
            finally:
                self._local.on_core = False

    @contextmanager
    def off_core(self) -> Iterator[None]:
        """While the block waits on another process, this thread's core serves other work;
        it is taken back (waiting its turn) when the block ends. A thread holding no core, or
        one past `waiting` such waits, keeps what it has."""
        with self._lock:
            leaves = getattr(self._local, "on_core", False) and self._off < self.waiting
            if leaves:
                self._off += 1
                self._grow()
        if not leaves:
            yield
            return
        self._local.on_core = False
        self.cores.release()
        try:
            yield
        finally:
            self.cores.acquire()
            self._local.on_core = True
            with self._lock:
                self._off -= 1

    def next_on_thread(
        self, chunks: Iterator[bytes | memoryview]
    ) -> "asyncio.Future[bytes | memoryview | None]":
        """Start encoding the next chunk of a streamed answer on a kernel thread (None at the
        end), so it is ready while the previous one is being sent."""
        return asyncio.ensure_future(self.on_thread(next, chunks, None))

    def _grow(self) -> None:
        """Let the pool have a thread more for queued work while this one waits (under
        `_lock`). ThreadPoolExecutor has no way to be resized: its `_max_workers` is what it
        grows to, read when work is queued, so it is raised here (never lowered: the threads
        it made stay, idle, up to `threads + waiting`)."""
        pool = self._pool
        if pool is not None and pool._max_workers < self.threads + self._off:
            pool._max_workers = self.threads + self._off
            pool._adjust_thread_count()  # for work queued already

    def close(self) -> None:
        """Stop the threads; queued work is cancelled."""
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None


__all__ = ["INLINE_BODY_BYTES", "INLINE_OUTPUT_BYTES", "Offloader", "RunOffLoop"]
