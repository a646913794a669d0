"""A small run in an isolated worker, awaited on the event loop rather than from a kernel
thread (issue 31: a client's model within the wire plus 0.5 ms of the same model in process).

A small request on a model whose runs go to the workers (a client's model) is decoded inline,
as an operator's is; at the model's run its attempt stops (InWorker), the loop sends the run to
a free worker and waits for the worker's socket (`LoopRun`), and the attempt runs again with
the reply as its run control (`Answered`), which answers the model's run. Measured on a busy
2-core host (docs/models.md, "Speed"), the thread's way cost four wake-ups a run (the loop
wakes a kernel thread, the thread the worker, the worker the thread, the thread the loop) and
the thread's decode and encode: about 0.9 ms of a 1.9 ms wait, the worker's run being 0.15 ms.

Only the common case comes here: a worker free at once that holds the model, and a message
that fits the socket's buffer (so the loop's write never waits). Otherwise the request goes to
a kernel thread as before (pool.py: it waits for a worker, starts one, sends the model's
bytes); so does a reply past the inline output allowance, which is taken there. The same ends
hold: at the deadline the worker is killed (504), as when the client leaves or the server
stops (`cancel`); a worker that ends answers with its signal or exit status, and is replaced.
"""

import asyncio
import contextlib
import os
import pickle
import struct
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from service.engines.workers.pool import FallbackPool, Worker, result_of
from service.engines.workers.transport import SHARED_BYTES, packed_nbytes, unlink
from service.errors import RunTimeout, ServiceError
from service.kernels.context import KernelContext, RunOffLoop
from service.runtime.graph import LoadedModel, RunResult

SEND_BYTES = 64 * 1024
"""Messages up to this size are written by the loop: a socket pair's buffer takes them whole."""
READ_BYTES = 256 * 1024  # read from the worker's socket per wake-up
LOOKED_AT_BYTES = 1024 * 1024  # replies up to this size are unpickled on the loop


class InWorker(RunOffLoop):
    """Raised by an inline attempt at a model whose runs go to the workers: the run to send.
    A caller that knows no better moves the work to a thread, as for RunOffLoop."""

    def __init__(self, model: LoadedModel, inputs: Mapping[str, np.ndarray],
                 outputs: Sequence[str] | None) -> None:  # fmt: skip
        super().__init__()
        self.model, self.inputs, self.outputs = model, inputs, outputs


class Answered:
    """A worker's reply as the run control of the attempt that takes it: its `fallback.run`
    answers the model's run with it, once (claimed and unpacked as the pool's replies are);
    any other run goes to the pool from a thread: inline, it raises RunOffLoop (an ensemble's
    second step in the workers, or a posted model's lookup that found another copy after an
    eviction; the pool must not be waited on from the loop). A reply past the attempt's inline
    output allowance, or whose JSON answer is too long to write inline, raises RunOffLoop
    before it is taken, and is taken on a thread."""

    def __init__(self, pool: FallbackPool, model: LoadedModel, raw: bytes,
                 reply: tuple[str, Any] | None, waited: int) -> None:  # fmt: skip
        self.fallback = self
        self.pool, self.model = pool, model
        self.raw: bytes | None = raw
        self.reply = reply  # unpickled on the loop when small (None: not yet)
        self.waited = waited  # ns the loop waited for the worker

    def check(self, node: str) -> None:
        """The run was over when this control was made: nothing stops it."""

    def run(self, model: LoadedModel, inputs: Mapping[str, np.ndarray],
            outputs: Sequence[str] | None, trace: bool, ctx: KernelContext) -> RunResult:  # fmt: skip
        allowance = ctx.inline_bytes
        inline = allowance is not None
        if self.raw is None or model is not self.model or trace:
            if inline:  # a second worker run in one attempt, or another model: a thread's
                raise RunOffLoop
            return self.pool.run(model, inputs, outputs, trace, ctx)
        if allowance is not None and self._nbytes() > allowance:
            raise RunOffLoop
        reply = self._reply()
        if inline and reply[0] == "ok":  # an answer too long to write inline: not taken yet
            packed = list(reply[1]["outputs"].values())
            if any(kind == "shm" for kind, _ in packed):
                raise RunOffLoop
            ctx.check_answer(*(value for _, value in packed))
        self.raw = self.reply = None
        return result_of(reply, ctx)

    def close(self) -> None:
        """Remove the files of a reply no attempt took (its request failed or left first)."""
        if self.raw is None:
            return
        kind, body = self._reply()
        self.raw = self.reply = None
        if kind == "ok":
            for packed_kind, value in body["outputs"].values():
                if packed_kind == "shm":
                    unlink(value[0])

    def _nbytes(self) -> int:
        """The outputs' bytes once unpacked (a reply not looked at: its own size, larger)."""
        if self.reply is None:
            return len(self.raw or b"")
        kind, body = self.reply
        return sum(packed_nbytes(v) for v in body["outputs"].values()) if kind == "ok" else 0

    def _reply(self) -> tuple[str, Any]:
        assert self.raw is not None
        return self.reply if self.reply is not None else pickle.loads(self.raw)


class LoopRun:
    """One run sent to a free worker and awaited on the event loop; `cancel` (the client
    left, the server stops) and the deadline kill the worker at once. Event loop only."""

    __slots__ = ("control", "future", "late", "pool")

    def __init__(self, pool: FallbackPool, control: Any) -> None:
        self.pool = pool
        self.control = control  # runtime/run_control.RunControl: deadline and stop reason
        self.future: asyncio.Future[bytes] | None = None
        self.late = False

    def cancel(self, reason: str) -> None:
        """Stop the run: the worker is killed and the run answers `reason`'s error."""
        self.control.cancel(reason)
        if self.future is not None:
            self.future.cancel()

    async def answer(self, asked: InWorker) -> Answered | None:
        """The run's reply, awaited here; None when it is not for the loop (no free worker
        holds the model, a large message): the caller runs it on a thread."""
        control, model = self.control, asked.model
        stop = control.stopped()
        if stop is not None:
            raise stop
        self.pool.refuse_slow(model.source_id)
        if any(isinstance(a, np.ndarray) and a.nbytes >= SHARED_BYTES
               for a in asked.inputs.values()):  # fmt: skip
            return None  # written to shared memory: a thread's work
        with self.pool.counted(model.engine) as given:  # as pool.run counts its runs
            message = (model.source_id, model.engine, None, {n: ("value", a) for n, a in
                       asked.inputs.items()}, asked.outputs, False, given)  # fmt: skip
            data = pickle.dumps(message, pickle.HIGHEST_PROTOCOL)
            if len(data) > SEND_BYTES:
                return None
            worker = self.pool.take_free(model.source_id)
            if worker is None:
                return None
            started = time.perf_counter_ns()
            raw = await self._ask(worker, data, model.engine)  # failed: the worker is gone
        healthy = False
        try:
            reply = pickle.loads(raw) if len(raw) <= LOOKED_AT_BYTES else None
            if reply is not None and reply[0] == "missing":  # never sent: it holds the model
                healthy = True
                return None
            healthy = self.pool.answered(worker, model.source_id, reply)
            return Answered(self.pool, model, raw, reply, time.perf_counter_ns() - started)
        finally:
            if healthy:
                self.pool.give(worker, True)
            else:  # killed and reaped off the loop
                _off_loop(self.pool.give, worker, False)

    async def _ask(self, worker: Worker, data: bytes, engine: str) -> bytes:
        """The worker's reply to `data`; on a failure, the worker is killed (or found dead)
        and forgotten, and the run's error raised."""
        loop = asyncio.get_running_loop()
        fd = worker.conn.fileno()
        self.future = future = loop.create_future()
        timer = loop.call_at(loop.time() + max(self.control.left(), 0.0), self._at_deadline)
        try:
            worker.conn.send_bytes(data)  # blocking: the buffer takes it whole (SEND_BYTES)
            loop.add_reader(fd, _read, fd, bytearray(), future)
            raw = await future
        except asyncio.CancelledError:
            _stop_reading(loop, fd)  # before the worker's connection is closed
            node = worker.node()
            worker.process.kill()  # now; reaped off the loop (its wait may take a moment)
            _off_loop(self.pool.lost, worker, engine)
            stop = self.control.stopped()
            if self.late or isinstance(stop, RunTimeout):
                raise self.control.timeout(node) from None
            if stop is not None:
                raise stop from None
            raise  # the request's task was cancelled: its run is killed all the same
        except (EOFError, OSError):
            _stop_reading(loop, fd)
            error: ServiceError = await loop.run_in_executor(None, self.pool.lost, worker, engine)
            raise (self.control.stopped() or error) from None
        finally:
            timer.cancel()
            self.future = None
        _stop_reading(loop, fd)
        return raw

    def _at_deadline(self) -> None:
        self.late = True
        if self.future is not None:
            self.future.cancel()


def _read(fd: int, buffer: bytearray, future: "asyncio.Future[bytes]") -> None:
    """The socket is readable: take what is there (one read never waits), and answer `future`
    with the message once it is whole (multiprocessing.Connection's framing)."""
    if future.done():
        return
    try:
        chunk = os.read(fd, READ_BYTES)
    except OSError as exc:
        future.set_exception(exc)
        return
    if not chunk:
        future.set_exception(EOFError())
        return
    buffer += chunk
    if len(buffer) < 4:
        return
    (size,) = struct.unpack("!i", buffer[:4])
    start = 4
    if size == -1:  # over 2 GiB: an 8-byte size follows
        if len(buffer) < 12:
            return
        (size,) = struct.unpack("!Q", buffer[4:12])
        start = 12
    if len(buffer) >= start + size:
        future.set_result(bytes(buffer[start : start + size]))


def _stop_reading(loop: asyncio.AbstractEventLoop, fd: int) -> None:
    """Stop watching the worker's socket, and make it blocking again: uvloop's add_reader
    made it non-blocking (libuv's poll handle does), and a run on a thread reads and writes
    it blocking (a read there found EAGAIN and took the worker for dead)."""
    loop.remove_reader(fd)
    with contextlib.suppress(OSError):
        os.set_blocking(fd, True)


def _off_loop(call: Callable[..., Any], *args: Any) -> None:
    """`call(*args)` on the loop's default executor, not waited for; here when the executor
    takes no more work (the loop is closing)."""
    try:
        asyncio.get_running_loop().run_in_executor(None, call, *args)
    except RuntimeError:
        call(*args)
