"""Run request work inline when it is small, on a worker thread when it is large."""

import asyncio
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from service.kernels.context import RunOffLoop

T = TypeVar("T")

INLINE_BODY_BYTES = 64 * 1024
"""Bodies up to this size are decoded on the event loop: a thread hop costs more than they do."""

INLINE_OUTPUT_BYTES = 1024 * 1024
"""Outputs up to this size are produced on the event loop; larger ones restart on a thread."""


class Offloader:
    """Decides per call: inline for small work, a dedicated thread pool for large work."""

    def __init__(self, threads: int) -> None:
        self.pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="opserve-kernel")

    async def run(self, work: Callable[[int | None], T], body_bytes: int) -> T:
        """`work(inline_bytes)` runs inline with a budget, or on a thread with None."""
        if body_bytes <= INLINE_BODY_BYTES:
            try:
                return work(INLINE_OUTPUT_BYTES)
            except RunOffLoop:
                pass
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self.pool, work, None)

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)
