"""Sequences: the bookkeeping of Triton's sequence batcher, for models whose configuration has
sequence_batching (their plan: sequence_plan.py).

A sequence's requests take turns, one at a time, in the order they arrived (FIFO per model
and correlation id), whatever threads run the model; different sequences run concurrently.
Nothing is batched across sequences, so every request is a batch of one and READY is true.

As Triton (notes/triton-http.md §1.10, core sequence_batch_scheduler.cc Enqueue):
- liveness is settled when a request arrives: START opens the sequence (on an open one it
  restarts it, with Triton's warning), END closes it, a request without START to a closed one
  is refused. So a START whose model run fails leaves the sequence live, from its initial
  state, and a failed END still ends it (Triton took the slot at enqueue, and frees it);
- implicit state: the state outputs of a request that succeeded feed the next request; a
  request that fails leaves the state as it was; a START begins from the initial state;
- a sequence idle for max_sequence_idle_microseconds is released at its deadline: by the
  app's sweeper (sequence_sweeper.py, Triton's reaper thread), and by a request that finds a
  deadline past (the sweeper's wake may be a moment late).

Ours, bounded where Triton queues: the live sequences of one model are at most its sequence
slots (plan.max_live: Triton puts the sequences past them in a backlog; we refuse the START
with 503 and a Retry-After of when the model's soonest idle sequence is released), of the
process at most OPSERVE_MAX_SEQUENCES (503); a sequence's state and table entry are claimed
from the memory budget while it lives (sequence_claims.py; 503 when they cannot be); the
requests waiting in one sequence are bounded (503), and so are a sequence's state bytes (413).
"""

import asyncio
import heapq
import logging
import math
import threading
import time
from collections.abc import Callable, Hashable, Mapping

import numpy as np

from service.codecs.v2_types import from_datatype
from service.core.sequence_claims import CountedClaims, StateClaims
from service.core.sequence_request import SequenceRequest
from service.core.sequence_resend import Resend
from service.errors import InvalidInput, Overloaded, PayloadTooLarge, RunCancelled, ServiceError
from service.runtime.sequence_plan import SequencePlan

log = logging.getLogger("opserve")

ENTRY_BYTES = 1024  # what a table entry costs (the entry, its lock, key and deadline): claimed
RETRY_MOST = 60  # seconds: the longest Retry-After a refused START is told


class _Sequence:
    """One live sequence (or one whose last requests are still taking their turns)."""

    __slots__ = ("claimed", "generation", "id", "idle_seconds", "last_used", "lock", "open",
                 "pending", "queued", "state", "state_generation")  # fmt: skip

    def __init__(self, seq_id: int | str, idle_seconds: float, now: float) -> None:
        self.id = seq_id
        self.idle_seconds = idle_seconds
        self.last_used = now
        self.lock = asyncio.Lock()  # FIFO: its waiters are woken in the order they came
        self.open = False  # a START arrived, and no END since
        self.pending = 0  # requests running or waiting for their turn
        self.generation = 0  # STARTs arrived: a state of an older one is not this sequence's
        self.state: dict[str, np.ndarray] | None = None  # None: the initial state
        self.state_generation = 0
        self.claimed = 0  # bytes claimed for its state and its entry (sequence_claims.py)
        self.queued = False  # in its table's deadlines

    @property
    def deadline(self) -> float:
        """Idle once the clock is past it (and no request is pending)."""
        return self.last_used + self.idle_seconds

    def idle(self, now: float) -> bool:
        return self.pending == 0 and self.deadline < now


class _Table:
    """The live sequences of one model, and a heap of their idle deadlines: one entry per
    sequence at most, pushed when its last pending request leaves; an entry whose sequence was
    used since is pushed again, at its new deadline, when it comes up."""

    __slots__ = ("deadlines", "entries")

    def __init__(self) -> None:
        self.entries: dict[int | str, _Sequence] = {}
        self.deadlines: list[tuple[float, int, _Sequence]] = []

    def soonest(self) -> float:
        return self.deadlines[0][0] if self.deadlines else math.inf


class Sequences:
    """Every sequence of the process, in a table per model: at most `max_sequences` live in
    all, at most the model's `plan.max_live` in one model, at most `max_waiting` requests
    waiting in one, at most `max_state_bytes` of state kept by one; each claims its state and
    entry from `claims` (sequence_claims.py)."""

    def __init__(self, max_sequences: int, *, claims: StateClaims | None = None,
                 max_waiting: int = 16, max_state_bytes: int = 1 << 20,
                 clock: Callable[[], float] = time.monotonic) -> None:  # fmt: skip
        self.max_sequences = max_sequences
        self.claims: StateClaims = claims or CountedClaims()
        self.max_waiting = max_waiting
        self.max_state_bytes = max_state_bytes
        self.clock = clock
        self.on_deadline: Callable[[float], None] | None = None
        """Told each new idle deadline (the sweeper's wake, sequence_sweeper.py)."""
        self.available = True
        """Whether steps can be taken now: always in one process (cluster mode's may not be)."""
        self._tables: dict[Hashable, _Table] = {}
        self._count = 0
        self._pushed = 0  # deadlines pushed: the heap's tie-breaker

    def __len__(self) -> int:
        """Sequences held: live, or with requests still to take their turns."""
        return self._count

    def live(self, model_key: Hashable) -> int:
        """Sequences held for one model."""
        table = self._tables.get(model_key)
        return 0 if table is None else len(table.entries)

    def turn(self, model_key: Hashable, plan: SequencePlan, request: SequenceRequest | None,
             resend: Resend | None = None) -> "Turn":  # fmt: skip
        """The request's turn in its sequence, an async context manager entered on the event
        loop; the model runs inside it (on any thread). Refusals come from `turn` or on entry.
        (`resend` is not needed: in one process a step's outcome is never unknown.)"""
        request = with_id(plan, request)
        return Turn(self, (model_key, request.id), plan, request)

    def next_idle(self) -> float:
        """The soonest idle deadline of any sequence (a lower bound: one used since may idle
        later); inf when none is waiting to go idle."""
        return min((table.soonest() for table in self._tables.values()), default=math.inf)

    def sweep(self, now: float | None = None) -> int:
        """Release every idle sequence; how many were."""
        now = self.clock() if now is None else now
        return sum(self._sweep(model_key, table, now)
                   for model_key, table in list(self._tables.items()))  # fmt: skip

    def _sweep(self, model_key: Hashable, table: _Table, now: float) -> int:
        released = 0
        while table.deadlines and table.deadlines[0][0] < now:
            seq = heapq.heappop(table.deadlines)[2]
            seq.queued = False
            if table.entries.get(seq.id) is not seq or seq.pending:
                continue  # gone, or taking turns: its last request's leaving queues it again
            if seq.idle(now):
                log.debug("Reaper: CORRID %s: max sequence idle exceeded", seq.id)
                self._drop(model_key, table, seq)
                released += 1
            else:
                self._queue(table, seq)
        return released

    def _arrive(self, key: tuple[Hashable, int | str], plan: SequencePlan,
                request: SequenceRequest) -> tuple[_Sequence, int]:  # fmt: skip
        """Count the request in its sequence (settling liveness): the sequence and the START
        the request belongs to."""
        now = self.clock()
        model_key, seq_id = key
        table = self._tables.get(model_key)
        seq = None
        if table is not None:
            if table.soonest() < now:
                self._sweep(model_key, table, now)
            seq = table.entries.get(seq_id)
            if seq is not None and seq.idle(now):
                self._drop(model_key, table, seq)
                seq = None
        if not request.start and (seq is None or not seq.open):
            raise start_needed(request, plan)
        if seq is None:
            seq = self._new(model_key, seq_id, plan, now)
        elif seq.pending > self.max_waiting:
            raise too_many_waiting(request, plan, self.max_waiting)
        if request.start:
            if seq.open:
                warn_restart(request, plan)
            seq.generation += 1
        seq.open = (seq.open or request.start) and not request.end
        seq.pending += 1
        seq.last_used = now
        return seq, seq.generation

    def _new(self, model_key: Hashable, seq_id: int | str, plan: SequencePlan,
             now: float) -> _Sequence:  # fmt: skip
        """A new sequence in the model's table, within the three bounds: the process's, the
        model's and the memory budget's."""
        if self._count >= self.max_sequences and self.next_idle() < now:
            self.sweep(now)  # the timer's sweep may not have come yet
        if self._count >= self.max_sequences:
            raise refusal(f"{self._count} sequences are live, the most this server holds "
                                "(OPSERVE_MAX_SEQUENCES)", self.next_idle(), now)  # fmt: skip
        table = self._tables.get(model_key)
        held = 0 if table is None else len(table.entries)
        if held >= plan.max_live:
            assert table is not None  # max_live is 1 at least
            raise refusal(slots_full(plan, held), table.soonest(), now)
        claim = ENTRY_BYTES + plan.state_bytes
        if not self.claims.claim(claim):
            raise refusal(f"a new sequence of model '{plan.model_name}' would keep {claim} "
                                f"bytes (its state and its entry), more than the memory budget "
                                f"has free for sequences now: {self.claims.bound()}",
                                self.next_idle(), now)  # fmt: skip
        if table is None:
            table = self._tables[model_key] = _Table()
        seq = table.entries[seq_id] = _Sequence(seq_id, plan.idle_seconds, now)
        seq.claimed = claim
        self._count += 1
        return seq

    def _leave(self, key: tuple[Hashable, int | str], seq: _Sequence) -> None:
        seq.pending -= 1
        seq.last_used = self.clock()
        if seq.pending:
            return
        table = self._tables.get(key[0])
        if table is None or table.entries.get(seq.id) is not seq:
            return
        if seq.open:
            self._queue(table, seq)
        else:
            self._drop(key[0], table, seq)

    def _queue(self, table: _Table, seq: _Sequence) -> None:
        if seq.queued:
            return
        seq.queued = True
        self._pushed += 1
        heapq.heappush(table.deadlines, (seq.deadline, self._pushed, seq))
        if self.on_deadline is not None:
            self.on_deadline(seq.deadline)

    def _drop(self, model_key: Hashable, table: _Table, seq: _Sequence) -> None:
        """Release a sequence with nothing pending: its entry, its state and its claim."""
        del table.entries[seq.id]
        self._count -= 1
        seq.state = None  # its heap entry may outlive it until its deadline comes up
        self.claims.release(seq.claimed)
        seq.claimed = 0
        if not table.entries:
            del self._tables[model_key]
        elif len(table.deadlines) > 2 * len(table.entries) + 64:  # entries of ended sequences
            table.deadlines = [d for d in table.deadlines if table.entries.get(d[2].id) is d[2]]
            heapq.heapify(table.deadlines)


class StateInputs:
    """What a turn gives the model run, whoever keeps the sequences (this process's Turn,
    cluster mode's ClusterTurn): `plan`, `request`, the state read (`_state`, None for the
    initial one) and the bound on a state's bytes (`_most`)."""

    __slots__ = ()
    plan: SequencePlan
    request: SequenceRequest
    _state: Mapping[str, np.ndarray] | None
    _most: int

    @property
    def state_outputs(self) -> tuple[str, ...]:
        """Outputs the model must produce for the state; not answered unless also configured."""
        return self.plan.state_outputs

    def inputs(self) -> dict[str, np.ndarray]:
        """The control inputs and the state inputs of this request (read-only arrays)."""
        return turn_inputs(self.plan, self.request, self._state, self._most)

    def checked_state(self, outputs: Mapping[str, np.ndarray]) -> tuple[dict[str, np.ndarray], int]:
        """The state outputs by their state input's name (not copied) and their bytes; a state
        output missing or of another type is the model's fault (500), a state over `_most`
        bytes is refused (413). Every keeper checks a turn's outputs so before keeping them."""
        found: dict[str, np.ndarray] = {}
        held = 0
        for spec in self.plan.states:
            array = outputs.get(spec.output_name)
            if array is None or array.dtype != from_datatype(spec.datatype).np_dtype:
                raise ServiceError(f"model '{self.plan.model_name}' must produce its state output "
                                   f"'{spec.output_name}' as {spec.datatype}")  # fmt: skip
            held += state_nbytes(array)
            if held > self._most:
                raise PayloadTooLarge(too_large(self.request, self.plan, held, self._most))
            found[spec.input_name] = array
        return found, held


class Turn(StateInputs):
    """One request's turn in its sequence. `async with` waits for the sequence's earlier
    requests; inside, `inputs()` gives the control and state inputs and `keep(outputs)` the
    state for the next request, kept only if the block ends without an error."""

    __slots__ = ("_ended", "_generation", "_grown", "_kept", "_kept_bytes", "_lock", "_most",
                 "_seq", "_sequences", "_state", "key", "plan", "request")  # fmt: skip

    def __init__(self, sequences: Sequences, key: tuple[Hashable, int | str],
                 plan: SequencePlan, request: SequenceRequest) -> None:  # fmt: skip
        self._sequences = sequences
        self._most = sequences.max_state_bytes
        self.key = key
        self.plan = plan
        self.request = request
        self._generation = 0
        self._seq: _Sequence | None = None
        self._state: dict[str, np.ndarray] | None = None  # None: the initial state
        self._kept: dict[str, np.ndarray] | None = None
        self._kept_bytes = 0  # what the kept state claims, its entry included
        self._grown = 0  # claimed by this turn beyond the sequence's claim
        # A run on a kernel thread may call keep() after the turn ended (its request was
        # cancelled: the thread finishes its node first); what it would claim then is never
        # given back, so a claim and the turn's end are one after the other.
        self._lock = threading.Lock()
        self._ended = False

    def keep(self, outputs: Mapping[str, np.ndarray]) -> None:
        """Copy the state outputs, to be the next request's state if this turn succeeds; a
        state larger than the sequence's claim claims the difference (any thread)."""
        state, held = self.checked_state(outputs)
        self._claim(ENTRY_BYTES + held)
        kept: dict[str, np.ndarray] = {}
        for name, array in state.items():
            kept[name] = copy = np.array(array, copy=True)
            copy.flags.writeable = False
        self._kept = kept

    def _claim(self, nbytes: int) -> None:
        """Have `nbytes` claimed for the sequence once this turn ends (the claim it holds,
        and what this turn claims more)."""
        assert self._seq is not None
        with self._lock:
            if self._ended:
                raise RunCancelled(f"the request of sequence {self.request.id} ended before its "
                                   "state was kept")  # fmt: skip
            self._claim_more(nbytes)

    def _claim_more(self, nbytes: int) -> None:
        assert self._seq is not None
        claims = self._sequences.claims
        more = nbytes - self._seq.claimed - self._grown
        if more > 0 and not claims.claim(more):
            refused = Overloaded(f"the state of sequence {self.request.id} of model "
                                 f"'{self.plan.model_name}' would grow to {nbytes} bytes, more "
                                 f"than the memory budget has free for sequences now: "
                                 f"{claims.bound()}; the sequence keeps its state")  # fmt: skip
            refused.retry_after = 1
            raise refused
        self._grown += max(more, 0)
        self._kept_bytes = nbytes

    async def __aenter__(self) -> "Turn":
        seq, self._generation = self._sequences._arrive(self.key, self.plan, self.request)
        self._seq = seq
        try:
            await seq.lock.acquire()
        except BaseException:  # cancelled while waiting: no longer counted
            self._sequences._leave(self.key, seq)
            raise
        if seq.state_generation != self._generation:
            seq.state = None  # an earlier START's: no request after this one can use it
        self._state = seq.state
        return self

    async def __aexit__(self, kind: type | None, error: BaseException | None, tb: object) -> None:
        seq = self._seq
        assert seq is not None
        claims = self._sequences.claims
        with self._lock:
            self._ended = True
            grown, self._grown = self._grown, 0
        if error is None and self._kept is not None:
            seq.state, seq.state_generation = self._kept, self._generation
            claims.release(seq.claimed + grown - self._kept_bytes)  # a smaller state
            seq.claimed = self._kept_bytes
        else:
            claims.release(grown)
        seq.lock.release()
        self._sequences._leave(self.key, seq)


def with_id(plan: SequencePlan, request: SequenceRequest | None) -> SequenceRequest:
    """The request, refused unless it names a correlation id the model's CORRID can carry
    (every keeper of sequences checks it so, before any turn)."""
    if request is None or not request.id:
        raise InvalidInput(f"inference request to model '{plan.model_name}' must specify a "
                           "non-zero or non-empty correlation ID")  # fmt: skip
    plan.check_id(request.id)
    return request


def turn_inputs(plan: SequencePlan, request: SequenceRequest,
                state: Mapping[str, np.ndarray] | None, most: int) -> dict[str, np.ndarray]:  # fmt: skip
    """The control inputs of a request and its state inputs: the sequence's `state`, or the
    initial state (None, or an input it lacks), refused (413) when over `most` bytes. Every
    keeper of sequences gives its turns these (this process's, and cluster mode's)."""
    found = plan.control_tensors(request.id, request.start, request.end)
    for spec in plan.states:
        if state is not None and spec.input_name in state:
            found[spec.input_name] = state[spec.input_name]
            continue
        if spec.initial_bytes > most:
            raise PayloadTooLarge(too_large(request, plan, spec.initial_bytes, most))
        found[spec.input_name] = spec.initial()
    return found


def state_nbytes(array: np.ndarray) -> int:
    """Bytes an array of state holds, its strings' bytes counted (every keeper counts so)."""
    if array.dtype != object:
        return int(array.nbytes)
    return int(array.nbytes) + sum(
        len(item) for item in array.flat if isinstance(item, str | bytes)
    )


# Triton's texts and ours, shared with cluster mode's sequences (service/cluster/sequences.py)


def start_needed(request: SequenceRequest, plan: SequencePlan) -> InvalidInput:
    """A request without START to a sequence that is not live (Triton's text)."""
    return InvalidInput(f"inference request for sequence {request.id} to model "
                        f"'{plan.model_name}' must specify the START flag on the first "
                        "request of the sequence")  # fmt: skip


def too_many_waiting(request: SequenceRequest, plan: SequencePlan, most: int) -> Overloaded:
    return Overloaded(f"sequence {request.id} of model '{plan.model_name}' has {most} requests "
                      "waiting already: send a sequence's requests one after another")  # fmt: skip


def warn_restart(request: SequenceRequest, plan: SequencePlan) -> None:
    """Triton's warning for a START on a sequence that did not end."""
    log.warning("sequence %s for model '%s' has a conflict. The previous sequence did not end "
                "before this sequence start. Previous sequence will be terminated early.",
                request.id, plan.model_name)  # fmt: skip


def slots_full(plan: SequencePlan, held: int) -> str:
    """The model's bound of live sequences, for a refusal's text."""
    return (f"model '{plan.model_name}' has {held} live sequence{'s' * (held > 1)}, the most its "
            f"configuration allows (Triton's sequence slots: {plan.max_live_source})")  # fmt: skip


def too_large(request: SequenceRequest, plan: SequencePlan, nbytes: int, most: int) -> str:
    return (f"the state of sequence {request.id} of model '{plan.model_name}' would hold "
            f"{nbytes} bytes, over the {most} a sequence may keep")  # fmt: skip


def refusal(bound: str, soonest: float, now: float) -> Overloaded:
    """503 past a bound, with Retry-After: when the soonest idle sequence is released."""
    wait = min(max(1, math.ceil(soonest - now)), RETRY_MOST) if soonest < math.inf else 1
    when = "when the soonest idle one is released" if soonest < math.inf else "when one ends"
    refused = Overloaded(f"{bound}: end sequences (sequence_end), or start this one again "
                         f"in {wait} s (Retry-After), {when}")  # fmt: skip
    refused.retry_after = wait
    return refused
