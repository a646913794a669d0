"""Run request work inline when it is small, on a worker thread when it is large, and bound
how many large requests hold memory at once."""

import asyncio
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from service.kernels.context import RunOffLoop

T = TypeVar("T")

INLINE_BODY_BYTES = 64 * 1024
"""Bodies up to this size are decoded on the event loop: a thread hop costs more than they do."""

INLINE_OUTPUT_BYTES = 1024 * 1024
"""Outputs up to this size are produced on the event loop; larger ones restart on a thread."""

Work = Callable[[bytes, int | None], T]


class Offloader:
    """Small requests run inline. Large ones (a body over INLINE_BODY_BYTES, one of unknown
    length, or an output over INLINE_OUTPUT_BYTES) take one of `threads` slots before their
    body is read and run on the kernel thread pool: at most `threads` large bodies and outputs
    are in memory at once, and the rest wait holding only their connection."""

    def __init__(self, threads: int) -> None:
        self.threads = threads
        self.slots = asyncio.Semaphore(threads)
        self._pool: ThreadPoolExecutor | None = None

    async def run(
        self, read_body: Callable[[], Awaitable[bytes]], declared: int | None, work: Work[T]
    ) -> T:
        """`work(body, inline_bytes)`: inline with an output budget, or on a thread with None."""
        if declared is not None and declared <= INLINE_BODY_BYTES:
            body = await read_body()
            try:
                return work(body, INLINE_OUTPUT_BYTES)
            except RunOffLoop:
                pass
            async with self.slots:
                return await self._on_thread(work, body)
        async with self.slots:
            return await self._on_thread(work, await read_body())

    async def _on_thread(self, work: Work[T], body: bytes) -> T:
        if self._pool is None:  # made on first use, again after close() (a new lifespan)
            self._pool = ThreadPoolExecutor(self.threads, thread_name_prefix="opserve-kernel")
        return await asyncio.get_running_loop().run_in_executor(self._pool, work, body, None)

    def close(self) -> None:
        """Stop the threads; queued work is cancelled."""
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None
