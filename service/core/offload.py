"""Run request work inline when it is small, on a worker thread when it is large.

What large requests hold in memory is bounded by the memory budget (memory_budget.py), not
here: a large request takes nothing before its body has arrived, then queues for a thread.
"""

import asyncio
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
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

    def __init__(self, threads: int) -> None:
        self.threads = threads
        self._pool: ThreadPoolExecutor | None = None

    async def on_thread(self, work: Callable[..., T], *args: Any) -> T:
        """`work(*args)` on a kernel thread."""
        return await asyncio.wrap_future(self.submit(work, *args))

    def submit(self, work: Callable[..., T], *args: Any) -> "Future[T]":
        """`work(*args)` queued for a kernel thread; its future says whether it runs yet."""
        if self._pool is None:  # made on first use, again after close() (a new lifespan)
            self._pool = ThreadPoolExecutor(self.threads, thread_name_prefix="opserve-kernel")
        return self._pool.submit(work, *args)

    def next_on_thread(
        self, chunks: Iterator[bytes | memoryview]
    ) -> "asyncio.Future[bytes | memoryview | None]":
        """Start encoding the next chunk of a streamed answer on a kernel thread (None at the
        end), so it is ready while the previous one is being sent."""
        return asyncio.ensure_future(self.on_thread(next, chunks, None))

    def close(self) -> None:
        """Stop the threads; queued work is cancelled."""
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None


__all__ = ["INLINE_BODY_BYTES", "INLINE_OUTPUT_BYTES", "Offloader", "RunOffLoop"]
