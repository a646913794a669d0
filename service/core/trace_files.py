"""Trace records on disk, as Triton writes them: `trace_file` a JSON array of every record
(rewritten to stay a whole array after each append, so it can be read at any time), and
`<trace_file>.<n>` one array per group of log_frequency traces. Written in order by one thread
of their own: a traced request never waits for the disk, nor does the event loop."""

import logging
import os
from concurrent.futures import ThreadPoolExecutor

log = logging.getLogger("opserve")


class TraceFile:
    """One trace file and its numbered group files."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.groups = 0
        self.started = False  # this process's first append starts the file anew
        self.writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="opserve-trace")

    def append(self, records: bytes) -> None:
        """Records (JSON objects, comma-separated) added to the array in `path`."""
        self.writer.submit(self._append, records)

    def save_group(self, records: list[bytes]) -> None:
        """A group of records to `<path>.<n>`, the next n."""
        name = f"{self.path}.{self.groups}"
        self.groups += 1
        self.writer.submit(self._write, name, b"[" + b",".join(records) + b"]")

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
