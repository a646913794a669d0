"""What stops a model run: its deadline (OPSERVE_MAX_RUN_SECONDS), its client leaving, the
server shutting down. The graph runner asks before each node (`check`), so a run on our own
kernels stops between two nodes, each of which is bounded by the output limit; a run in a
fallback worker process is killed instead (workers/pool.py). A native kernel that never
stops is given up on (core/stuck_runs.py: `abandoned`).

A control is made per request by the core (core/execution.py) and set from the event loop
(`cancel`); it is read on the kernel thread that runs the graph. Plain attribute reads and
writes: no lock is needed for a flag that only ever goes from None to a reason.
"""

import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from typing import Any

from service.errors import Overloaded, RunCancelled, RunTimeout

SHUTTING_DOWN = "the server is shutting down"
CLIENT_LEFT = "the client closed the connection"


class RunControl:
    """The deadline and stop reason of one run; `running` names the node being run."""

    __slots__ = ("deadline", "fallback", "off_core", "reason", "running", "seconds")

    def __init__(self, seconds: float, fallback: Any = None,
                 off_core: Callable[[], AbstractContextManager[Any]] = nullcontext) -> None:  # fmt: skip
        self.seconds = seconds
        self.deadline = time.monotonic() + seconds
        self.reason: str | None = None  # why the run was cancelled (None: it was not)
        self.running = ""  # the node being run, for the 504's text
        self.fallback = fallback  # the isolated workers' pool (clients' models, onnx.reference)
        # the block in which the run's thread waits on a worker, its core free for other work
        # (core/offload.py's Offloader.off_core)
        self.off_core = off_core

    def cancel(self, reason: str) -> None:
        """Stop the run at its next check (any thread)."""
        if self.reason is None:
            self.reason = reason

    def left(self) -> float:
        """Seconds until the deadline (negative once past it)."""
        return self.deadline - time.monotonic()

    def check(self, node: str) -> None:
        """Before running `node`: raise if the run must stop (cancelled, or past its deadline)."""
        self.running = node
        if self.reason is not None:
            raise self.cancelled(f"before {node}")
        if time.monotonic() > self.deadline:
            raise self.timeout(node)

    def timeout(self, node: str) -> RunTimeout:
        """The 504 of a run past its deadline while `node` ran (or was next)."""
        return RunTimeout(f"the model run took longer than {self.seconds:g} s "
                          f"(OPSERVE_MAX_RUN_SECONDS) and was stopped at {node}")  # fmt: skip

    def cancelled(self, where: str) -> RunCancelled | Overloaded:
        """The error of a cancelled run: 503 with Retry-After when the server shuts down (the
        client may retry on another replica), else RunCancelled (its client left)."""
        text = f"the run was stopped {where}: {self.reason}" if where else (
            f"the run was stopped: {self.reason}")  # fmt: skip
        return Overloaded(text) if self.reason == SHUTTING_DOWN else RunCancelled(text)

    def abandoned(self) -> RunCancelled | Overloaded | RunTimeout:
        """The error of a run whose request stopped waiting for a thread that kept running
        it (core/stuck_runs.py): the run was not stopped, and the text says so."""
        if self.reason is not None:
            return self.cancelled(f"during {self.running}" if self.running else "")
        where = f" in {self.running}" if self.running else ""
        return RunTimeout(f"the model run took longer than {self.seconds:g} s "
                          f"(OPSERVE_MAX_RUN_SECONDS) and did not stop{where}: its answer is "
                          "given up, and its kernel thread is counted as stuck until it "
                          "returns (opserve_stuck_runs)")  # fmt: skip

    def stopped(self) -> RunCancelled | Overloaded | RunTimeout | None:
        """The error to end the run with now, if it must end (for waits that poll)."""
        if self.reason is not None:
            return self.cancelled(f"during {self.running}" if self.running else "")
        if time.monotonic() > self.deadline:
            return self.timeout(self.running)
        return None
