"""Runs of models that need onnx.reference, outside the server's process.

onnx.reference is pure Python: a node holds the GIL for as long as it runs (a regex on
`(a+)+$` froze the whole server for 53 s), may never end (a Loop of 10^12 turns) and
allocates what it likes. So a model with any node on the reference runs whole in one of a
few worker processes (workers/worker.py), started on first use: under an address-space
limit, killed at the run deadline or when the run is cancelled (its client left, shutdown),
and replaced. Tensors travel through shared memory, in a directory private to the pool
(workers/transport.py). Models that run
only on our kernels never come here: they run in-process, as before.

`FallbackPool.run` is called on a kernel thread (from LoadedModel.run) and blocks it while the
worker runs, polling the run's control every POLL_SECONDS; the GIL is free meanwhile.
"""

import contextlib
import json
import os
import queue
import secrets
import socket
import subprocess
import sys
import tempfile
import threading
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import numpy as np

from service import errors
from service.engines.workers.run import CACHED_MODELS, NODE_BYTES
from service.engines.workers.transport import (
    PREFIX,
    make_directory,
    pack,
    packed_nbytes,
    remove_directory,
    unlink,
    unlink_all_of,
    unpack,
)
from service.errors import InvalidInput, RunTimeout, ServiceError
from service.kernels.context import KernelContext
from service.runtime.graph import LoadedModel, RunResult, TraceEntry
from service.settings import Settings

POLL_SECONDS = 0.02
LIMITS = ("max_output_bytes", "max_elements", "max_string_bytes", "max_json_depth",
          "max_graph_bytes", "max_graph_nodes", "max_graph_depth", "max_request_bytes")  # fmt: skip
"""The settings a worker loads and runs models with (no secrets travel)."""


class Worker:
    """One worker process (`python -m service.engines.workers.worker`, so nothing of the
    server's own main module runs again in it), its connection, the node it runs (a small
    shared file it writes before each node) and the models it has cached, by digest. Its
    tensors and that file are in `directory`, the pool's (None: tensors pickled, the file in
    the temporary directory)."""

    def __init__(self, limits: dict[str, Any], directory: str | None) -> None:
        ours, theirs = socket.socketpair()
        self.directory = directory
        self.running = os.path.join(directory or tempfile.gettempdir(),
                                    f"{PREFIX}{os.getpid()}-{secrets.token_hex(8)}.node")  # fmt: skip
        with open(self.running, "wb") as file:
            file.write(bytes(NODE_BYTES))
        root = str(Path(__file__).parents[3])  # the folder that holds the service package
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(
            [root, *filter(None, [os.environ.get("PYTHONPATH")])])}  # fmt: skip
        command = [sys.executable, "-m", "service.engines.workers.worker",
                   str(theirs.fileno()), self.running, json.dumps(limits), directory or ""]  # fmt: skip
        self.process = subprocess.Popen(command, pass_fds=[theirs.fileno()], env=env,
                                        stdin=subprocess.DEVNULL)  # fmt: skip
        theirs.close()
        self.conn = Connection(ours.detach())
        self.cached: OrderedDict[bytes, None] = OrderedDict()
        self.killing = threading.Lock()
        self.killed = False

    def alive(self) -> bool:
        return self.process.poll() is None

    def node(self) -> str:
        """The node the worker runs (or last ran)."""
        try:
            with open(self.running, "rb") as file:
                text = file.read(NODE_BYTES).split(b"\0", 1)[0]
        except OSError:
            text = b""
        return text.decode("utf-8", "replace") or "(before the first node)"

    def kill(self) -> None:
        """End the worker and free what it holds, once: a run's thread (its run cancelled) and
        shutdown's FallbackPool.close may both call it; closing the connection twice closed
        its descriptor twice (EBADF at shutdown, or another file's, had the number been
        reused in between)."""
        with self.killing:
            if self.killed:
                return
            self.killed = True
        if self.alive():
            self.process.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(5)
        self.conn.close()
        unlink(self.running)
        unlink_all_of(self.process.pid, self.directory)


class FallbackPool:
    """`settings.fallback_workers` worker processes, made on first use, and the private
    directory of their tensors (made with the first, removed at close)."""

    def __init__(self, settings: Settings) -> None:
        self.size = settings.fallback_workers
        self.limits = {name: getattr(settings, name) for name in LIMITS}
        self.free: queue.SimpleQueue[Worker | None] = queue.SimpleQueue()
        self.workers: set[Worker] = set()
        self.lock = threading.Lock()
        self.closed = False
        self.directory: str | None = None
        self.made_directory = False

    def run(self, model: LoadedModel, inputs: Mapping[str, np.ndarray],
            outputs: Sequence[str] | None, trace: bool, ctx: KernelContext) -> RunResult:  # fmt: skip
        """The model's run in a worker: its result claimed from `ctx`'s reservation as it is
        taken back. Raises what the run raised, RunTimeout when the deadline passed (the
        worker is killed), RunCancelled or Overloaded when the run was cancelled."""
        control: Any = ctx.control
        worker = self._take(control)
        made: list[str] = []
        healthy = False
        try:
            packed = {name: pack(array, made, worker.directory) for name, array in inputs.items()}
            known = model.source_id in worker.cached
            reply = self._ask(worker, control, (model.source_id, None if known else model.source,
                                                packed, outputs, trace))  # fmt: skip
            if reply[0] == "missing":
                reply = self._ask(worker, control, (model.source_id, model.source, packed,
                                                    outputs, trace))  # fmt: skip
            worker.cached[model.source_id] = None
            worker.cached.move_to_end(model.source_id)
            while len(worker.cached) > CACHED_MODELS:
                worker.cached.popitem(last=False)
            # a run refused for its size may have left the worker's heap large: a new worker
            # gives that memory back to the host
            healthy = not (reply[0] == "error" and reply[1][1] == 413)
            return _result(reply, ctx)
        finally:
            for path in made:
                unlink(path)
            self._give(worker, healthy)

    def _ask(self, worker: Worker, control: Any, message: tuple[Any, ...]) -> tuple[str, Any]:
        try:
            worker.conn.send(message)
            while not worker.conn.poll(POLL_SECONDS):
                stop = control.stopped() if control is not None else None
                if stop is not None or not worker.alive():
                    node = worker.node()
                    worker.kill()
                    if stop is None:
                        raise _died(worker, node)
                    if isinstance(stop, RunTimeout):
                        stop = control.timeout(node)
                    raise stop
            reply: tuple[str, Any] = worker.conn.recv()
        except (EOFError, OSError, BrokenPipeError):
            node = worker.node()
            worker.kill()
            raise _died(worker, node) from None
        return reply

    def _take(self, control: Any) -> Worker:
        """A free worker (a new one while fewer than `size` exist), waiting within the run's
        deadline."""
        while True:
            with self.lock:
                if self.closed:
                    raise errors.Overloaded("the server is shutting down; retry later")
            try:
                found = self.free.get_nowait()
            except queue.Empty:
                with self.lock:
                    if len(self.workers) < self.size:
                        worker = Worker(self.limits, self.transport_directory())
                        self.workers.add(worker)
                        return worker
                try:
                    found = self.free.get(timeout=POLL_SECONDS)
                except queue.Empty:
                    stop = control.stopped() if control is not None else None
                    if stop is not None:
                        raise (control.timeout("(waiting for a fallback worker)")
                               if isinstance(stop, RunTimeout) else stop) from None  # fmt: skip
                    continue
            if found is not None and found.alive():
                return found
            if found is not None:
                self._forget(found)

    def transport_directory(self) -> str | None:
        """The pool's private directory, made on the first call (under `lock`)."""
        if not self.made_directory:
            self.directory, self.made_directory = make_directory(), True
        return self.directory

    def _give(self, worker: Worker, healthy: bool) -> None:
        if healthy and worker.alive() and not self.closed:
            self.free.put(worker)
        else:
            worker.kill()
            self._forget(worker)

    def _forget(self, worker: Worker) -> None:
        with self.lock:
            self.workers.discard(worker)

    def close(self) -> None:
        """Kill every worker (shutdown): runs in them end with their thread's next poll."""
        with self.lock:
            self.closed = True
            workers = list(self.workers)
            self.workers.clear()
        for worker in workers:
            worker.kill()
        remove_directory(self.directory)


def _died(worker: Worker, node: str) -> ServiceError:
    code = worker.process.returncode
    return InvalidInput(f"the fallback worker process ended (exit code {code}) while it ran "
                        f"{node}: onnx.reference could not run the model on these inputs")  # fmt: skip


def _result(reply: tuple[str, Any], ctx: KernelContext) -> RunResult:
    kind, body = reply
    if kind == "error":
        name, _status, detail, loc, operator = body
        kind_of = getattr(errors, name, None)
        if not (isinstance(kind_of, type) and issubclass(kind_of, ServiceError)):
            kind_of = InvalidInput
        error = kind_of(detail, loc=tuple(loc))
        error.operator = operator
        raise error
    packed = [*body["outputs"].values(), *(entry[5] for entry in body["trace"] or ())]
    try:
        if ctx.claims is not None:  # the result's memory in this process, before the copies
            ctx.claims.claim(sum(packed_nbytes(value) for value in packed))
        outputs = {name: unpack(value) for name, value in body["outputs"].items()}
        trace = None
        if body["trace"] is not None:
            trace = [TraceEntry(name, node, op, version, ran_on, unpack(value), us)
                     for name, node, op, version, ran_on, value, us in body["trace"]]  # fmt: skip
    finally:
        for kind, value in packed:  # what was not taken (a claim that must wait first)
            if kind == "shm":
                unlink(value[0])
    return RunResult(outputs, body["nodes"], trace)
