"""Trace records on disk, as Triton writes them: `trace_file` a JSON array of every record
(rewritten to stay a whole array after each append, so it can be read at any time), and
`<trace_file>.<n>` one array per group of log_frequency traces. Written in order by one thread
of their own: a traced request never waits for the disk, nor does the event loop."""

import logging
import os
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

log = logging.getLogger("opserve")
MAX_PENDING = 10_000
"""Writes waiting at most: past it (a disk slower than the traced requests) records are
dropped, counted in the log, rather than held in memory."""


class TraceFile:
    """One trace file and its numbered group files."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.groups = 0
        self.started = False  # this process's first append starts the file anew
        self.writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="opserve-trace")
        self.room = threading.Semaphore(MAX_PENDING)  # taken on the loop, freed by the writer
        self.dropped = 0

    def append(self, records: bytes) -> None:
        """Records (JSON objects, comma-separated) added to the array in `path`."""
        self._submit(self._append, records)

    def save_group(self, records: list[bytes]) -> None:
        """A group of records to `<path>.<n>`, the next n."""
        name = f"{self.path}.{self.groups}"
        self.groups += 1
        self._submit(self._write, name, b"[" + b",".join(records) + b"]")

    def _submit(self, write: Callable[..., None], *args: Any) -> None:
        if not self.room.acquire(blocking=False):
            self.dropped += 1
            if self.dropped in (1, 1000, 1_000_000):
                log.error("trace file %s: %d traces dropped, the disk falls behind", self.path,
                          self.dropped)  # fmt: skip
            return
        try:
            self.writer.submit(write, *args).add_done_callback(lambda _: self.room.release())
        except RuntimeError:  # closed: a request answered after shutdown's last write
            self.room.release()

    def close(self) -> None:
        """Wait for every write."""
        self.writer.shutdown(wait=True)

    def _append(self, records: bytes) -> None:
        try:
            if not self.started:
                self._write(self.path, b"[" + records + b"]")
                self.started = True
                return
            with open(self.path, "r+b") as file:
                file.seek(-1, os.SEEK_END)  # over the closing bracket
                file.write(b"," + records + b"]")
        except OSError as exc:
            log.error("trace file %s not written: %s", self.path, exc)

    @staticmethod
    def _write(name: str, content: bytes) -> None:
        try:
            with open(name, "wb") as file:
                file.write(content)
        except OSError as exc:
            log.error("trace file %s not written: %s", name, exc)
