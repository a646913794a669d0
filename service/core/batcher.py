"""Triton's dynamic batcher: the requests of one model version queue, and batches of their rows
run as one (policy: core/batch_policy.py, read from the model's `dynamic_batching` block).

How a batch forms (core's DynamicBatchScheduler::GetDynamicBatch, rewritten here for one event
loop): the queued requests are taken in priority order (level 1 first; in a level, in arrival
order, then those whose timeout DELAYed them). Rows add up while they fit in max_batch_size and
while each request matches the first one's inputs (names, types, and shapes past the batch
dimension: such requests alone can share one tensor). A batch runs at once when it reaches a
preferred batch size (the largest reachable), when it cannot grow (the next request does not
fit or does not match, or it holds the largest preferred size), when max_queue_delay is 0, or
when its oldest request has waited max_queue_delay; else the batcher waits for more requests,
at most until that delay or the nearest queue timeout. At most `instances` batches run at once
(the instance groups' counts); while they run, the queue grows, so batches form under load even
with no delay.

Everything happens on the event loop, driven by events (a request arrives, a batch ends, a
timer fires): no task of its own, nothing to stop. A batch runs through execution.py like any
work: on a kernel thread, under the run deadline and the memory budget (its concatenated
inputs claimed), and its rows go back to their requests as views of the batch's outputs; each
request then encodes its own outputs in its own form (JSON, binary, shared memory,
classification). A request whose inputs are refused fails alone, before it queues; a batch
whose run refuses its inputs runs again request by request, so one request's bad data fails
that request, not its batch mates. A request whose client leaves is taken out of the queue
(a batch already running finishes without it). A queue full answers 503, Triton's words.

When the batcher is idle (nothing queued, an instance free, no delay) a request runs as on a
model without batching: the direct path, inline when small, with nothing added but a count."""

import asyncio
import time
from collections import deque
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from time import perf_counter_ns
from typing import Any

import numpy as np

from api_schemas.v2 import Parameter
from service.core.batch_policy import DELAY, BatchPolicy
from service.core.execution import ClientWatch, Disconnected, Execution
from service.core.memory_budget import MemoryBudget
from service.core.model import model_parameters
from service.core.statistics import ModelStatistics, Timings
from service.errors import Overloaded, RunCancelled, ServiceError, Unavailable
from service.kernels.context import KernelContext
from service.runtime import engine_time
from service.runtime.run_control import CLIENT_LEFT

Key = tuple[tuple[str, str, tuple[int, ...]], ...]
"""What requests must share to be batched: each input's name, dtype and shape past dim 0."""


class Pending:
    """One request in the queue."""

    __slots__ = ("cancelled", "enqueued", "feeds", "future", "key", "level", "rows",
                 "timeout_at", "timings", "turn", "wanted")  # fmt: skip

    def __init__(self, feeds: dict[str, np.ndarray], wanted: list[str], level: int,
                 timeout_at: int, timings: Timings, turn: Any = None) -> None:  # fmt: skip
        self.feeds = feeds
        self.wanted = wanted  # the outputs answered (a sequence's state outputs run too)
        self.turn = turn  # a sequence step's turn (core/sequences.py): its controls and state
        self.level = level
        self.timeout_at = timeout_at  # monotonic ns; 0: none
        self.timings = timings
        first = next(iter(feeds.values()))
        self.rows = int(first.shape[0])
        self.key: Key = tuple(sorted((name, a.dtype.str, a.shape[1:]) for name, a in feeds.items()))
        self.enqueued = time.monotonic_ns()
        self.future: asyncio.Future[dict[str, np.ndarray]] = (
            asyncio.get_running_loop().create_future())  # fmt: skip
        self.cancelled = False

    def fail(self, exc: BaseException) -> None:
        if not self.future.done():
            self.future.set_exception(exc)

    def leave(self) -> None:
        """Its client left: answered so, and taken out at the next look at the queue."""
        self.cancelled = True
        self.fail(RunCancelled(CLIENT_LEFT))


class DynamicBatcher:
    """The queue and batches of one repository model version (`entry`)."""

    def __init__(self, entry: Any, policy: BatchPolicy, execution: Execution,
                 budget: MemoryBudget, stats: ModelStatistics, max_queued: int) -> None:  # fmt: skip
        self.entry = entry
        self.policy = policy
        self.execution = execution
        self.budget = budget
        self.stats = stats
        self.max_queued = max(1, max_queued)  # the server's own bound over all levels
        self.queues = [deque[Pending]() for _ in range(policy.levels)]
        self.delayed = [deque[Pending]() for _ in range(policy.levels)]
        self.queued = 0
        self.running = 0  # batches (and direct runs) going on
        self._timer: asyncio.TimerHandle | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._delivered: asyncio.Future[None] | None = None  # preserve_ordering's last batch

    # --- the direct path ---

    @property
    def idle(self) -> bool:
        """Whether a request may run at once, alone, as without batching."""
        return (self.queued == 0 and self.running < self.policy.instances
                and self.policy.delay_ns == 0)  # fmt: skip

    @contextmanager
    def direct(self) -> Iterator[None]:
        """Around a direct run: it holds an instance, and the queue is looked at after it."""
        self.running += 1
        try:
            yield
        finally:
            self.running -= 1
            if self.queued:
                self._schedule()

    # --- the queue ---

    async def submit(self, inputs: Mapping[str, np.ndarray], outputs: Sequence[str] | None,
                     parameters: Mapping[str, Parameter], timings: Timings,
                     disconnected: Disconnected | None = None,
                     turn: Any = None) -> dict[str, np.ndarray]:  # fmt: skip
        """Queue a decoded request (a sequence's step with its `turn`: its control and state
        inputs join the batch, and its state outputs are kept for its next step); its own
        outputs once its batch ran (client form: the configuration's reshapes undone).
        Refused at once: bad inputs (Triton's texts), a bad priority or timeout, a full
        queue."""
        policy, io = self.policy, self.entry.io
        model_parameters(parameters)
        level = policy.level(parameters)
        timeout_us = policy.timeout_us(level, parameters)
        feeds = io.graph_inputs(inputs)
        wanted = io.output_names(outputs)
        if turn is not None:
            feeds.update(turn.inputs())
        self._check_room(level)
        timeout_at = time.monotonic_ns() + timeout_us * 1000 if timeout_us else 0
        pending = Pending(feeds, wanted, level, timeout_at, timings, turn)
        timings.batched = True  # its execution is counted with its batch's
        self.queues[level - 1].append(pending)
        self.queued += 1
        self._schedule()
        watch = None if disconnected is None else ClientWatch(disconnected, pending.leave)
        try:
            return await pending.future
        except asyncio.CancelledError:
            pending.cancelled = True  # taken out at the next look at the queue
            raise
        finally:
            if watch is not None:
                watch.stop()

    def _check_room(self, level: int) -> None:
        size = self.policy.policies[level - 1].max_queue_size
        in_level = len(self.queues[level - 1]) + len(self.delayed[level - 1])
        if size and in_level >= size:
            raise Unavailable("Exceeds maximum queue size")  # Triton's words
        if self.queued >= self.max_queued:
            raise Overloaded(f"Exceeds maximum queue size: {self.queued} requests wait for "
                             f"model '{self.entry.name[:100]}' (OPSERVE_MAX_QUEUED_RUNS); "
                             "retry later")  # fmt: skip

    def _order(self) -> Iterator[tuple[deque[Pending], Pending]]:
        """The queued requests in the order batches take them."""
        for queue, delayed in zip(self.queues, self.delayed, strict=True):
            for item in queue:
                yield queue, item
            for item in delayed:
                yield delayed, item

    def _schedule(self) -> None:
        """Start every batch that should run now; set a timer for the next look when one
        waits for more requests."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        loop = asyncio.get_running_loop()
        while self.queued and self.running < self.policy.instances:
            now = time.monotonic_ns()
            self._expire(now)
            if not self.queued:
                return
            batch, wait_ns = self._form(now)
            if not batch:
                self._timer = loop.call_later(wait_ns / 1e9, self._schedule)
                return
            for queue, item in batch:
                assert queue[0] is item  # a batch is always a prefix of the order
                queue.popleft()
            self.queued -= len(batch)
            self.running += 1
            self._start([item for _, item in batch])

    def _start(self, batch: list[Pending]) -> None:
        task = asyncio.get_running_loop().create_task(self._run(batch))
        self._tasks.add(task)  # held until done: the loop keeps only a weak reference
        task.add_done_callback(self._tasks.discard)

    def _expire(self, now: int) -> None:
        """Take out the requests whose client left, and those past their queue timeout:
        refused (REJECT) or moved behind their level's others (DELAY)."""
        for level, queue in enumerate(self.queues):
            delay = self.policy.policies[level].timeout_action == DELAY
            kept: deque[Pending] = deque()
            for item in queue:
                if item.cancelled:
                    self.queued -= 1
                elif item.timeout_at and now > item.timeout_at:
                    if delay:
                        item.timeout_at = 0
                        self.delayed[level].append(item)
                    else:
                        self.queued -= 1
                        item.fail(Unavailable("Request timeout expired"))  # Triton's words
                else:
                    kept.append(item)
            if len(kept) != len(queue):
                self.queues[level] = kept
            delayed = self.delayed[level]
            if any(item.cancelled for item in delayed):
                self.delayed[level] = deque(item for item in delayed if not item.cancelled)
                self.queued -= len(delayed) - len(self.delayed[level])

    def _form(self, now: int) -> tuple[list[tuple[deque[Pending], Pending]], int]:
        """The batch to run now (empty: none yet, and how long to wait for more)."""
        policy = self.policy
        pending: list[tuple[deque[Pending], Pending]] = []
        rows, best, send_now = 0, 0, False
        for queue, item in self._order():
            if pending:
                if rows + item.rows > policy.max_preferred and not best:
                    best = len(pending)
                if rows + item.rows > policy.max_batch_size or item.key != pending[0][1].key:
                    send_now = True
                    break
            pending.append((queue, item))
            rows += item.rows
            if rows in policy.preferred:
                best = len(pending)
        oldest = min(item.enqueued for _, item in pending)
        waited = now - oldest
        delay_exceeded = policy.delay_ns and waited >= policy.delay_ns
        if best and not delay_exceeded:
            return pending[:best], 0
        if send_now or rows >= policy.max_preferred or delay_exceeded or not policy.delay_ns:
            return pending, 0
        wait = policy.delay_ns - waited
        timeouts = [item.timeout_at for _, item in self._order() if item.timeout_at]
        if timeouts:
            wait = min(wait, max(min(timeouts) - now, 1000))
        return [], wait

    # --- a batch's run ---

    async def _run(self, batch: list[Pending]) -> None:
        started = perf_counter_ns()
        for item in batch:
            item.timings.started = started
        turn = self._ordering_turn()
        try:
            results = await self._execute(batch)
        finally:
            self.running -= 1
            self._schedule()
        if turn is not None:
            before, mine = turn
            if before is not None:
                await asyncio.shield(before)
            mine.set_result(None)
        for item, result in zip(batch, results, strict=True):
            if item.future.done():
                continue  # its client left
            if isinstance(result, BaseException):
                item.future.set_exception(result)
            else:
                item.future.set_result(result)

    def _ordering_turn(self) -> tuple[asyncio.Future[None] | None, asyncio.Future[None]] | None:
        """With preserve_ordering: the future of the batch before (answered first) and this
        batch's own."""
        if not self.policy.preserve_ordering:
            return None
        before = self._delivered
        mine = self._delivered = asyncio.get_running_loop().create_future()
        return before, mine

    async def _execute(self, batch: list[Pending]) -> list[Any]:
        """Each request's outputs, or its failure: the batch at once; again one request at a
        time when the batch's run refused its inputs (a client's fault: 4xx)."""
        try:
            async with self.budget.reservation() as held:
                work = BatchWork(self.entry, batch)
                results: list[Any] = await self.execution.run(work, held, inline=False)
        except ServiceError as exc:
            if len(batch) > 1 and 400 <= exc.status_code < 500 and exc.status_code != 499:
                return [(await self._execute([item]))[0] for item in batch]
            return [exc] * len(batch)
        except Exception as exc:
            return [exc] * len(batch)
        self.stats.executed(work.rows, work.input_ns, work.infer_ns, work.output_ns)
        return results


class BatchWork:
    """A batch's run as execution.py's Work: its requests' inputs concatenated (claimed), the
    graph run once, each request's rows split back off as views."""

    __slots__ = ("batch", "entry", "infer_ns", "input_ns", "output_ns", "rows", "timings")

    def __init__(self, entry: Any, batch: list[Pending]) -> None:
        self.entry = entry
        self.batch = batch
        self.rows = sum(item.rows for item in batch)
        self.timings = Timings()
        self.input_ns = self.infer_ns = self.output_ns = 0

    @property
    def holding(self) -> int:
        return 0  # its inputs are held by their requests

    def __call__(self, ctx: KernelContext) -> list[dict[str, np.ndarray]]:
        began = perf_counter_ns()
        batch, entry = self.batch, self.entry
        first = batch[0]
        if len(batch) == 1:
            feeds = first.feeds
        else:
            if ctx.claims is not None:
                ctx.claims.claim(sum(a.nbytes for item in batch for a in item.feeds.values()))
            feeds = {name: np.concatenate([item.feeds[name] for item in batch])
                     for name in first.feeds}  # fmt: skip
        wanted = list(dict.fromkeys(name for item in batch for name in item.wanted))
        if first.turn is not None:  # a sequence model's steps: its state outputs too
            wanted += [name for name in first.turn.state_outputs if name not in wanted]
        engine_time.take()
        ran = perf_counter_ns()
        produced = entry.model.run(feeds, wanted, ctx=ctx).outputs
        ended = perf_counter_ns()
        span = engine_time.take() or (ran, ended)
        results, offset = [], 0
        for item in batch:
            mine = {}
            for name in wanted if item.turn is not None else item.wanted:
                array = produced[name]
                if array.ndim == 0 or array.shape[0] != self.rows:
                    raise ServiceError(f"output '{name[:100]}' of model '{entry.name[:100]}' "
                                       f"has {array.shape[:1] or 'no'} rows for a batch of "
                                       f"{self.rows}: it cannot be split back to the batch's "
                                       "requests (a model with dynamic_batching must answer "
                                       "one row per input row)")  # fmt: skip
                mine[name] = array if len(batch) == 1 else array[offset : offset + item.rows]
            if item.turn is not None:
                item.turn.keep(mine)  # as RepositoryModel.infer keeps a step's state
                mine = {name: mine[name] for name in item.wanted}
            results.append(entry.io.client_outputs(mine))
            offset += item.rows
        done = perf_counter_ns()
        self.input_ns = span[0] - began
        self.infer_ns = span[1] - span[0]
        self.output_ns = done - span[1]
        for item in batch:
            item.timings.compute_input += self.input_ns
            item.timings.compute_infer = self.infer_ns
            item.timings.compute_output += self.output_ns
        return results
