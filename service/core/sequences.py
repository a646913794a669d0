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
- a sequence idle for max_sequence_idle_microseconds is released: when its id comes back, and
  by `sweep()` (run by a START that finds the table full, by STARTs at most once a second, and
  by the caller at will: no thread of its own).

Ours: the number of live sequences is bounded (a START past it gets 503: it passes as
sequences end or idle out), so are the requests waiting in one sequence (503) and a
sequence's state bytes (413).
"""

import asyncio
import logging
import math
import time
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass

import numpy as np

from service.codecs.v2_types import from_datatype
from service.errors import InvalidInput, Overloaded, PayloadTooLarge, ServiceError, Unsupported
from service.runtime.sequence_plan import SequencePlan

log = logging.getLogger("opserve")

MAX_ID = 2**64 - 1
MAX_ID_BYTES = 128
SWEEP_SECONDS = 1.0  # the least time between two sweeps run by STARTs
Parameters = Mapping[str, bool | int | float | str]


@dataclass(frozen=True, slots=True)
class SequenceRequest:
    """The sequence parameters of one request; `id` 0 or "" means none was given."""

    id: int | str
    start: bool = False
    end: bool = False


def sequence_request(parameters: Parameters) -> SequenceRequest | None:
    """The request's sequence_id, sequence_start and sequence_end; None when it sends none.
    Their types are checked whatever the model (Triton's HTTP door does); a model without
    sequence batching then ignores them, as Triton does."""
    if not any(k in parameters for k in ("sequence_id", "sequence_start", "sequence_end")):
        return None
    seq_id = parameters.get("sequence_id", 0)
    if isinstance(seq_id, bool) or not isinstance(seq_id, int | str) or (
        isinstance(seq_id, int) and not 0 <= seq_id <= MAX_ID
    ):  # fmt: skip
        raise InvalidInput("Unable to parse 'sequence_id': expected an unsigned 64-bit integer "
                           f"or a string, got {_shown(seq_id)}")  # fmt: skip
    if isinstance(seq_id, str) and len(seq_id[: MAX_ID_BYTES + 1].encode()) > MAX_ID_BYTES:
        # Triton's status (UNSUPPORTED) and text; it counts bytes, as we do
        raise Unsupported("string correlation ID cannot be longer than 128 characters")
    return SequenceRequest(seq_id, _flag(parameters, "sequence_start"),
                           _flag(parameters, "sequence_end"))  # fmt: skip


def _flag(parameters: Parameters, key: str) -> bool:
    value = parameters.get(key, False)
    if not isinstance(value, bool):
        raise InvalidInput(f"Unable to parse '{key}': expected a boolean, got {_shown(value)}")
    return value


def _shown(value: object) -> str:
    return f"{type(value).__name__} {str(value)[:40]!r}"


class _Sequence:
    """One live sequence (or one whose last requests are still taking their turns)."""

    __slots__ = ("generation", "idle_seconds", "last_used", "lock", "open", "pending", "state",
                 "state_generation")  # fmt: skip

    def __init__(self, idle_seconds: float, now: float) -> None:
        self.idle_seconds = idle_seconds
        self.last_used = now
        self.lock = asyncio.Lock()  # FIFO: its waiters are woken in the order they came
        self.open = False  # a START arrived, and no END since
        self.pending = 0  # requests running or waiting for their turn
        self.generation = 0  # STARTs arrived: a state of an older one is not this sequence's
        self.state: dict[str, np.ndarray] | None = None  # None: the initial state
        self.state_generation = 0

    def idle(self, now: float) -> bool:
        return self.pending == 0 and now - self.last_used > self.idle_seconds


class Sequences:
    """Every sequence of the process: at most `max_sequences` live, at most `max_waiting`
    requests waiting in one, at most `max_state_bytes` of state kept by one."""

    def __init__(self, max_sequences: int, *, max_waiting: int = 16,
                 max_state_bytes: int = 1 << 20,
                 clock: Callable[[], float] = time.monotonic) -> None:  # fmt: skip
        self.max_sequences = max_sequences
        self.max_waiting = max_waiting
        self.max_state_bytes = max_state_bytes
        self.clock = clock
        self._table: dict[tuple[Hashable, int | str], _Sequence] = {}
        self._swept = clock()
        self._next_idle = math.inf  # no sequence goes idle before (a bound, kept by sweep)

    def __len__(self) -> int:
        """Sequences held: live, or with requests still to take their turns."""
        return len(self._table)

    def turn(self, model_key: Hashable, plan: SequencePlan,
             request: SequenceRequest | None) -> "Turn":  # fmt: skip
        """The request's turn in its sequence, an async context manager entered on the event
        loop; the model runs inside it (on any thread). Refusals come from `turn` or on entry."""
        if request is None or not request.id:
            raise InvalidInput(f"inference request to model '{plan.model_name}' must specify a "
                               "non-zero or non-empty correlation ID")  # fmt: skip
        plan.check_id(request.id)
        return Turn(self, (model_key, request.id), plan, request)

    def sweep(self, now: float | None = None) -> int:
        """Release every idle sequence; how many were."""
        now = self.clock() if now is None else now
        self._swept = now
        idle = [key for key, seq in self._table.items() if seq.idle(now)]
        for key in idle:
            log.debug("Reaper: CORRID %s: max sequence idle exceeded", key[1])
            del self._table[key]
        waiting = (s.last_used + s.idle_seconds for s in self._table.values() if not s.pending)
        self._next_idle = min(waiting, default=math.inf)
        return len(idle)

    def _arrive(self, key: tuple[Hashable, int | str], plan: SequencePlan,
                request: SequenceRequest) -> tuple[_Sequence, int]:  # fmt: skip
        """Count the request in its sequence (settling liveness): the sequence and the START
        the request belongs to."""
        now = self.clock()
        if request.start and now - self._swept >= SWEEP_SECONDS:
            self.sweep(now)
        seq = self._table.get(key)
        if seq is not None and seq.idle(now):
            del self._table[key]
            seq = None
        if not request.start and (seq is None or not seq.open):
            raise InvalidInput(f"inference request for sequence {request.id} to model "
                               f"'{plan.model_name}' must specify the START flag on the first "
                               "request of the sequence")  # fmt: skip
        if seq is None:
            seq = self._new(key, plan, now)
        elif seq.pending > self.max_waiting:
            raise Overloaded(f"sequence {request.id} of model '{plan.model_name}' has "
                             f"{self.max_waiting} requests waiting already: send a sequence's "
                             "requests one after another")  # fmt: skip
        if request.start:
            if seq.open:
                log.warning("sequence %s for model '%s' has a conflict. The previous sequence did "
                            "not end before this sequence start. Previous sequence will be "
                            "terminated early.", request.id, plan.model_name)  # fmt: skip
            seq.generation += 1
        seq.open = (seq.open or request.start) and not request.end
        seq.pending += 1
        seq.last_used = now
        return seq, seq.generation

    def _new(self, key: tuple[Hashable, int | str], plan: SequencePlan, now: float) -> _Sequence:
        full = len(self._table) >= self.max_sequences
        if full and now > self._next_idle:  # not before: a flood of STARTs costs no sweeps
            full = not self.sweep(now)
        if full:
            raise Overloaded(f"{len(self._table)} sequences are live, the most this server holds "
                             "(OPSERVE_MAX_SEQUENCES): end sequences (sequence_end), or start "
                             "this one again once idle ones are released")  # fmt: skip
        seq = self._table[key] = _Sequence(plan.idle_seconds, now)
        return seq

    def _leave(self, key: tuple[Hashable, int | str], seq: _Sequence) -> None:
        seq.pending -= 1
        seq.last_used = self.clock()
        if seq.pending:
            return
        if seq.open:
            self._next_idle = min(self._next_idle, seq.last_used + seq.idle_seconds)
        elif self._table.get(key) is seq:
            del self._table[key]


class Turn:
    """One request's turn in its sequence. `async with` waits for the sequence's earlier
    requests; inside, `inputs()` gives the control and state inputs and `keep(outputs)` the
    state for the next request, kept only if the block ends without an error."""

    __slots__ = ("_generation", "_kept", "_seq", "_sequences", "_state", "key", "plan",
                 "request")  # fmt: skip

    def __init__(self, sequences: Sequences, key: tuple[Hashable, int | str],
                 plan: SequencePlan, request: SequenceRequest) -> None:  # fmt: skip
        self._sequences = sequences
        self.key = key
        self.plan = plan
        self.request = request
        self._generation = 0
        self._seq: _Sequence | None = None
        self._state: dict[str, np.ndarray] | None = None  # None: the initial state
        self._kept: dict[str, np.ndarray] | None = None

    @property
    def state_outputs(self) -> tuple[str, ...]:
        """Outputs the model must produce for the state; not answered unless also configured."""
        return self.plan.state_outputs

    def inputs(self) -> dict[str, np.ndarray]:
        """The control inputs and the state inputs of this request (read-only arrays)."""
        request = self.request
        found = self.plan.control_tensors(request.id, request.start, request.end)
        for spec in self.plan.states:
            if self._state is not None:
                found[spec.input_name] = self._state[spec.input_name]
                continue
            if spec.initial_bytes > self._sequences.max_state_bytes:
                raise PayloadTooLarge(self._too_large(spec.initial_bytes))
            found[spec.input_name] = spec.initial()
        return found

    def keep(self, outputs: Mapping[str, np.ndarray]) -> None:
        """Copy the state outputs, to be the next request's state if this turn succeeds."""
        kept: dict[str, np.ndarray] = {}
        held = 0
        for spec in self.plan.states:
            array = outputs.get(spec.output_name)
            if array is None or array.dtype != from_datatype(spec.datatype).np_dtype:
                raise ServiceError(f"model '{self.plan.model_name}' must produce its state output "
                                   f"'{spec.output_name}' as {spec.datatype}")  # fmt: skip
            held += array.nbytes + _string_bytes(array)
            if held > self._sequences.max_state_bytes:
                raise PayloadTooLarge(self._too_large(held))
            kept[spec.input_name] = copy = np.array(array, copy=True)
            copy.flags.writeable = False
        self._kept = kept

    def _too_large(self, nbytes: int) -> str:
        return (f"the state of sequence {self.request.id} of model '{self.plan.model_name}' "
                f"would hold {nbytes} bytes, over the {self._sequences.max_state_bytes} a "
                "sequence may keep")  # fmt: skip

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
        if error is None and self._kept is not None:
            seq.state, seq.state_generation = self._kept, self._generation
        seq.lock.release()
        self._sequences._leave(self.key, seq)


def _string_bytes(array: np.ndarray) -> int:
    if array.dtype != object:
        return 0
    return sum(len(item) for item in array.flat if isinstance(item, str | bytes))
