"""Runs outside the server's process: the isolated workers.

Two kinds of model run whole in one of a few worker processes (workers/worker.py), started
on first use: under an address-space limit, killed at the run deadline or when the run is
cancelled (its client left, shutdown), and replaced.
- A client's model on onnxruntime (onnxruntime/isolated.py): native kernels on values and
  shapes the client chose may crash (SIGFPE), spin or allocate without bound; here that ends
  one worker and fails one run, with what happened named (a signal: 500; the system's
  out-of-memory killer: 507; the address-space limit: 413).
- A model with a node on onnx.reference: pure Python, a node holds the GIL for as long as it
  runs (a regex on `(a+)+$` froze the whole server for 53 s), may never end (a Loop of 10^12
  turns) and allocates what it likes.
Tensors travel through shared memory, in a directory private to the pool (transport.py).
Models that run only on our kernels, and the operator's models on onnxruntime, never come
here: they run in-process. A worker that died is replaced after a back-off that doubles with
each death in a row (OPSERVE_ISOLATED_RESTART_SECONDS), so crashing models cannot make the
server fork without pause; a model whose load outlived a run's deadline is remembered by
digest for SLOW_LOAD_SECONDS, and the same bytes are refused at once meanwhile.

`FallbackPool.run` is called on a kernel thread (from LoadedModel.run) and blocks it while the
worker runs, polling the run's control every POLL_SECONDS; the GIL is free meanwhile. A small
run of a client's model whose worker is free and holds the model is awaited on the event loop
instead (workers/on_loop.py, with `take_free`, `answered`, `give` and `lost`).
"""

import contextlib
import json
import os
import queue
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import OrderedDict
from collections.abc import Iterator, Mapping, Sequence
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import numpy as np

from service import errors
from service.engines.onnxruntime.session import CORES, Threads, worker_threads
from service.engines.workers.limits import MALLOC_ARENAS
from service.engines.workers.run import CACHED_MODELS, LOADING, NODE_BYTES, ORT
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
from service.errors import (
    InvalidInput,
    RunTimeout,
    ServiceError,
    WorkerDied,
    WorkerOutOfMemory,
)
from service.kernels.context import KernelContext
from service.runtime.graph import LoadedModel, RunResult, TraceEntry
from service.settings import Settings

POLL_SECONDS = 0.02
MAX_RESTART_SECONDS = 5.0  # the longest back-off before a worker is started after deaths
SLOW_LOAD_SECONDS = 600.0  # how long bytes whose load outlived a deadline are refused at once
SLOW_LOADS_KEPT = 1024
LIMITS = ("max_output_bytes", "max_elements", "max_string_bytes", "max_json_depth",
          "max_graph_bytes", "max_graph_nodes", "max_graph_depth", "max_request_bytes",
          "fallback_workers", "isolated_worker_bytes")  # fmt: skip
"""The settings a worker loads and runs models with (no secrets travel)."""
ONE_CORE = Threads(1, 1)  # what a run on the exact engine takes of the cores


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
            [root, *filter(None, [os.environ.get("PYTHONPATH")])]),
            "MALLOC_ARENA_MAX": MALLOC_ARENAS}  # fmt: skip
        command = [sys.executable, "-m", "service.engines.workers.worker",
                   str(theirs.fileno()), self.running, json.dumps(limits), directory or ""]  # fmt: skip
        self.process = subprocess.Popen(command, pass_fds=[theirs.fileno()], env=env,
                                        stdin=subprocess.DEVNULL)  # fmt: skip
        theirs.close()
        self.conn = Connection(ours.detach())
        self.cached: OrderedDict[bytes, None] = OrderedDict()
        self.killing = threading.Lock()
        self.killed = False  # by the pool (a stop, shutdown): not a death of its own

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
        self.backoff = settings.isolated_restart_seconds
        self.deaths = 0  # workers that died or were killed, in a row (a good run resets it)
        self.next_start = 0.0  # monotonic time before which no worker is started
        self.slow: OrderedDict[bytes, float] = OrderedDict()  # digest -> refused until
        # a worker started once a run was on onnxruntime imports it as it starts, so that the
        # replacement of one a client's model killed is ready for the next one (the import
        # took 0.14-0.2 s, counted against a run's deadline when done on its first model)
        self.onnxruntime_used = False
        self.takers = 0  # threads waiting in _take for a free worker (under `lock`)
        self.ort_threads = worker_threads(self.size)

    def run(self, model: LoadedModel, inputs: Mapping[str, np.ndarray],
            outputs: Sequence[str] | None, trace: bool, ctx: KernelContext) -> RunResult:  # fmt: skip
        """The model's run in a worker: its result claimed from `ctx`'s reservation as it is
        taken back. Raises what the run raised, RunTimeout when the deadline passed (the
        worker is killed), RunCancelled or Overloaded when the run was cancelled."""
        control: Any = ctx.control
        self.refuse_slow(model.source_id)
        self.onnxruntime_used = self.onnxruntime_used or model.engine == ORT
        off_core = control.off_core if control is not None else contextlib.nullcontext
        with off_core():  # the thread only waits for the worker: its core serves others
            worker = self._take(control)
        made: list[str] = []
        healthy = False
        try:
            packed = {name: pack(array, made, worker.directory) for name, array in inputs.items()}
            known = model.source_id in worker.cached
            head = (model.source_id, model.engine)
            with off_core(), self.counted(model.engine) as given:
                reply = self._ask(worker, control, (*head, None if known else model.source,
                                                    packed, outputs, trace, given))  # fmt: skip
                if reply[0] == "missing":
                    reply = self._ask(worker, control, (*head, model.source, packed, outputs,
                                                        trace, given))  # fmt: skip
            healthy = self.answered(worker, model.source_id, reply)
            return result_of(reply, ctx)
        finally:
            for path in made:
                unlink(path)
            self.give(worker, healthy)

    @contextlib.contextmanager
    def counted(self, engine: str) -> Iterator[int]:
        """A run of `engine` in a worker, counted in the server's CORES while it is in flight,
        beside the in-process runs (the workers run on the same cores): the intra-op threads
        it is given, which its message carries; onnxruntime's every core or the workers'
        share, the exact engine's Python one core."""
        given = CORES.take(self.ort_threads if engine == ORT else ONE_CORE)
        try:
            yield given
        finally:
            CORES.give(given)

    def answered(self, worker: Worker, digest: bytes, reply: tuple[str, Any] | None) -> bool:
        """Note that `worker` answered a run of the model `digest` (`reply`: None for one too
        large to look at on the event loop, which is no error); whether the worker may serve
        again: a run refused for its size may have left its heap large, and a new worker gives
        that memory back to the host."""
        worker.cached[digest] = None
        worker.cached.move_to_end(digest)
        while len(worker.cached) > CACHED_MODELS:
            worker.cached.popitem(last=False)
        healthy = reply is None or not (reply[0] == "error" and reply[1][1] == 413)
        if healthy:
            self.deaths = 0
        return healthy

    def _ask(self, worker: Worker, control: Any, message: tuple[Any, ...]) -> tuple[str, Any]:
        digest, engine, loads = message[0], message[1], message[2] is not None
        loading_since = None  # when the worker was first seen opening the model
        try:
            worker.conn.send(message)
            while not worker.conn.poll(POLL_SECONDS):
                if loads and loading_since is None and worker.node() == LOADING:
                    loading_since = time.monotonic()
                stop = control.stopped() if control is not None else None
                if stop is not None or not worker.alive():
                    node = worker.node()
                    died = stop is None and not worker.killed
                    worker.kill()
                    self._died_now(worker)
                    if stop is None:
                        raise _died(worker, node, engine, died)
                    if isinstance(stop, RunTimeout):
                        # only a load that had (nearly) the whole deadline to itself: one
                        # that began late (a worker starting on a busy host) says nothing
                        if (
                            node == LOADING
                            and loading_since is not None
                            and (time.monotonic() - loading_since > 0.9 * control.seconds)
                        ):
                            self._remember_slow(digest)
                        stop = control.timeout(node)
                    raise stop
            reply: tuple[str, Any] = worker.conn.recv()
        except (EOFError, OSError, BrokenPipeError):
            raise self.lost(worker, engine) from None
        return reply

    def lost(self, worker: Worker, engine: str) -> ServiceError:
        """The error of a run whose worker ended (its connection closed): the worker killed
        and reaped (which may wait), its replacement due; the signal or exit status named."""
        node = worker.node()
        died = not worker.killed
        worker.kill()
        self._died_now(worker)
        return _died(worker, node, engine, died)

    def _died_now(self, worker: Worker) -> None:
        """A worker died or was killed: its replacement starts once the back-off (doubled per
        death in a row) has passed, so the next run finds it started (its imports take about
        half a second) rather than paying for the start."""
        self._forget(worker)
        self.deaths += 1
        wait = 0.0
        if self.backoff:
            wait = min(MAX_RESTART_SECONDS, self.backoff * 2 ** min(self.deaths - 1, 16))
            self.next_start = time.monotonic() + wait
        timer = threading.Timer(wait, self._replace)
        timer.daemon = True  # a pending start never holds the process's exit
        timer.start()

    def _replace(self) -> None:
        """Start a worker into the free ones, if the pool has room for one (and is open)."""
        with self.lock:
            if self.closed or len(self.workers) >= self.size:
                return
            worker = self._started()
            self.workers.add(worker)
        self.free.put(worker)

    def _started(self) -> Worker:
        limits = {**self.limits, "warm_onnxruntime": self.onnxruntime_used}
        return Worker(limits, self.transport_directory())

    def _remember_slow(self, digest: bytes) -> None:
        with self.lock:
            self.slow[digest] = time.monotonic() + SLOW_LOAD_SECONDS
            self.slow.move_to_end(digest)
            while len(self.slow) > SLOW_LOADS_KEPT:
                self.slow.popitem(last=False)

    def refuse_slow(self, digest: bytes) -> None:
        """504 at once for bytes whose load outlived a run's deadline lately."""
        with self.lock:
            until = self.slow.get(digest)
            if until is not None and until <= time.monotonic():
                del self.slow[digest]
                until = None
        if until is not None:
            raise RunTimeout("loading this model took longer than a run's deadline "
                             "(OPSERVE_MAX_RUN_SECONDS) lately; the same bytes are refused "
                             f"for {SLOW_LOAD_SECONDS:g} s after that")  # fmt: skip

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
                    starts = len(self.workers) < self.size and time.monotonic() >= self.next_start
                    if starts:
                        worker = self._started()
                        self.workers.add(worker)
                        return worker
                try:
                    with self.lock:
                        self.takers += 1
                    try:
                        found = self.free.get(timeout=POLL_SECONDS)
                    finally:
                        with self.lock:
                            self.takers -= 1
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

    def take_free(self, digest: bytes) -> Worker | None:
        """A worker free now that holds the model `digest` (workers/on_loop.py), or None:
        none is free, a thread waits for one (it goes first), or the free one lacks the model
        (it is put back)."""
        with self.lock:
            if self.closed or self.takers:
                return None
        try:
            found = self.free.get_nowait()
        except queue.Empty:
            return None
        if found is None or not found.alive():
            if found is not None:
                self._forget(found)
            return None
        if digest not in found.cached:
            self.free.put(found)
            return None
        return found

    def give(self, worker: Worker, healthy: bool) -> None:
        """A worker back to the free ones after a run (killed instead when not `healthy`)."""
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


def _died(worker: Worker, node: str, engine: str, died: bool) -> ServiceError:
    """What a run that ended its worker answers: the signal or exit status named."""
    code = worker.process.returncode
    how = f"exit status {code}"
    if code is not None and code < 0:
        with contextlib.suppress(ValueError):
            how = signal.Signals(-code).name
    if engine == "exact":  # onnx.reference's Python: the inputs it cannot take are the client's
        return InvalidInput(f"the fallback worker process ended ({how}) while it ran {node}: "
                            "onnx.reference could not run the model on these inputs")  # fmt: skip
    if died and code == -signal.SIGKILL:  # not the pool's kill: the system's out-of-memory killer
        return WorkerOutOfMemory(f"the model's run ended its worker process: {how} while it ran "
                                 f"{node}, as the system's out-of-memory killer does; nothing "
                                 "else was affected")  # fmt: skip
    return WorkerDied(f"the model's run ended its worker process: {how} while it ran {node}; "
                      "nothing else was affected (the worker is replaced)")  # fmt: skip


def result_of(reply: tuple[str, Any], ctx: KernelContext) -> RunResult:
    """The run's result from a worker's reply (its outputs claimed from `ctx`, then unpacked),
    or the error it names, raised."""
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
