"""Stopping runs inside onnxruntime: a run blocks its kernel thread in `session.run` and never
comes back to ask its RunControl, so one watcher thread asks for it, every POLL_SECONDS, and
sets the run's `RunOptions.terminate` once it is cancelled (its client left, the server shuts
down) or past its deadline (it wakes at the nearest deadline, so that one is met on time). onnxruntime then ends the run between two kernels and frees what
it held.

The watcher runs only while runs are registered, and ends after IDLE_SECONDS without any.
"""

import threading
import time
from typing import Any

from service.runtime.run_control import RunControl

POLL_SECONDS = 0.02
IDLE_SECONDS = 1.0


class Stopper:
    """The runs in onnxruntime, each with its control and RunOptions."""

    def __init__(self) -> None:
        self.runs: dict[int, tuple[RunControl, Any]] = {}
        self.lock = threading.Lock()
        self.watcher: threading.Thread | None = None

    def watch(self, control: RunControl, options: Any) -> int:
        """Register a run about to start; `done` with the returned key once it ended."""
        key = id(options)
        with self.lock:
            self.runs[key] = (control, options)
            if self.watcher is None:
                self.watcher = threading.Thread(target=self._watch, name="opserve-ort-stopper",
                                                daemon=True)  # fmt: skip
                self.watcher.start()
        return key

    def done(self, key: int) -> None:
        with self.lock:
            self.runs.pop(key, None)

    def _watch(self) -> None:
        idle_since = time.monotonic()
        while True:
            with self.lock:
                runs = list(self.runs.values())
                if not runs and time.monotonic() - idle_since > IDLE_SECONDS:
                    self.watcher = None
                    return
            sleep = POLL_SECONDS
            if runs:
                idle_since = time.monotonic()
            for control, options in runs:
                left = control.left()
                if control.reason is not None or left <= 0:
                    options.terminate = True
                else:  # woken at the deadline, not up to a poll after it (the inline leash)
                    sleep = min(sleep, left)
            time.sleep(sleep)


STOPPER = Stopper()
"""The process's one watcher (runs of every session register here)."""
