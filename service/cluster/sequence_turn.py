"""One request's turn in a sequence kept in the cluster store: the shape of core's Turn
(`async with`, `inputs()`, `keep(outputs)`, `state_outputs`), its state read when the turn
comes and written back when the block ends without an error (sequences.py takes the steps).
A turn the store finds a replay of the last committed step (sequence_scripts.py) runs on the
state that step read and writes nothing: its answer is the committed one."""

import asyncio
import contextlib
import math
import threading
from collections.abc import Hashable, Mapping
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from service.cluster.sequence_state import decode_state, encode_state
from service.core.sequence_claims import StateClaims
from service.core.sequence_request import SequenceRequest
from service.core.sequence_resend import Resend
from service.core.sequences import ENTRY_BYTES, RETRY_MOST, StateInputs, too_large
from service.errors import Overloaded, PayloadTooLarge, RunCancelled, ServiceError, Unavailable
from service.runtime.sequence_plan import SequencePlan

FRAMING_BYTES = 256  # per state tensor: its length, name, type and dims in the stored value
HASHED_INLINE = 1 << 20  # bytes of inputs: a request's fingerprint over more is made on a thread


@dataclass(slots=True)
class Step:
    """What the scripts need of one step: its keys, token and request, and what it learnt."""

    keys: list[str]
    member: str
    local_key: tuple[Hashable, int | str]
    request: SequenceRequest
    plan: SequencePlan
    version: str
    token: str
    idle_ms: int
    generation: int = 0  # the START this request belongs to
    counter: int = 0  # steps committed when this one took the lease
    ticketed: bool = field(default=False)
    fingerprint: bytes = b""  # of the client's request (sequence_resend.py); b"": none
    named: bool = False  # the request carries its own id
    replayed: bool = False  # a resend of the last committed step: nothing is written
    alone: bool = False  # took the lease at once, with no place in the order (ARRIVE)


class Steps(Protocol):
    """What a turn needs of the cluster's sequences (sequences.py's ClusterSequences)."""

    claims: StateClaims
    max_state_bytes: int
    max_total_bytes: int
    max_idle_ms: int
    lease_ms: int

    def keys(self, model_key: Hashable, seq_id: int | str) -> tuple[list[str], str]: ...
    def new_token(self) -> str: ...
    async def begin(self, step: "Step") -> tuple[int, bytes | None]: ...
    async def renew(self, step: "Step") -> bool: ...
    async def finish(self, step: "Step", state: bytes | None) -> str: ...
    def leave(self, step: "Step") -> None: ...
    def abandon(self, step: "Step") -> None: ...


class ClusterTurn(StateInputs):
    """One request's turn in its sequence (core/sequences.py's Turn, kept in the store)."""

    def __init__(self, sequences: Steps, model_key: Hashable, plan: SequencePlan,
                 request: SequenceRequest, resend: Resend | None = None) -> None:  # fmt: skip
        keys, member = sequences.keys(model_key, request.id)
        version = str(model_key[1]) if isinstance(model_key, tuple) else ""
        # a configuration's idle time near 2^64 us would keep its keys for ages: capped
        idle_ms = min(max(1, round(plan.idle_seconds * 1000)), sequences.max_idle_ms)
        self.step = Step(keys, member, (model_key, request.id), request, plan, version,
                         sequences.new_token(), idle_ms)  # fmt: skip
        self.plan = plan
        self.request = request
        self._resend = resend
        self._sequences = sequences
        self._most = sequences.max_state_bytes
        self._state: dict[str, np.ndarray] | None = None  # None: the initial state
        self._kept: bytes | None = None
        self._claimed = 0
        self._lock = threading.Lock()  # keep() on a kernel thread against the turn's end
        self._ended = False
        # a timer until the first renewal is due, then the task that renews: most steps end
        # before it fires, and a timer costs less than a task started and cancelled
        self._renewing: asyncio.TimerHandle | asyncio.Task[None] | None = None

    def keep(self, outputs: Mapping[str, np.ndarray]) -> None:
        """Check and serialize the state outputs (any thread), to be written back if this turn
        succeeds; their bytes are claimed from the memory budget until it ends."""
        kept, _ = self.checked_state(outputs)
        if self.step.replayed:
            return  # its state was committed already
        value = encode_state(kept)
        if len(value) > self._most + FRAMING_BYTES * len(kept):  # bounded before it is written
            raise PayloadTooLarge(too_large(self.request, self.plan, len(value), self._most))
        with self._lock:
            if self._ended:
                raise RunCancelled(f"the request of sequence {self.request.id} ended before its "
                                   "state was kept")  # fmt: skip
            self._claim(self._claimed + len(value))
            self._kept = value

    def _claim(self, nbytes: int) -> None:
        """Hold `nbytes` in all from the memory budget (more than held: the difference)."""
        claims = self._sequences.claims
        more = nbytes - self._claimed
        if more > 0 and not claims.claim(more):
            refused = Overloaded(f"the state of sequence {self.request.id} of model "
                                 f"'{self.plan.model_name}' would hold {nbytes} bytes in this "
                                 "replica while its step runs, more than the memory budget has "
                                 f"free for sequences now: {claims.bound()}; the sequence keeps "
                                 "its state")  # fmt: skip
            refused.retry_after = 1
            raise refused
        self._claimed += max(more, 0)

    async def __aenter__(self) -> "ClusterTurn":
        sequences, step = self._sequences, self.step
        if self._resend is not None:
            step.named = self._resend.named
            resend = self._resend
            step.fingerprint = await asyncio.to_thread(resend.digest) if (
                resend.nbytes > HASHED_INLINE) else resend.digest()  # fmt: skip
        try:
            generation, value = await sequences.begin(step)
        except BaseException:
            if step.ticketed:
                sequences.abandon(step)
            raise
        if step.replayed:  # the state the committed step read (b"": the initial one)
            generation = step.generation
        try:
            usable = value if value and generation == step.generation else None
            self._claim(ENTRY_BYTES + (len(usable) if usable else self.plan.state_bytes))
            self._state = decode_state(usable) if usable else None
        except BaseException:
            await self._end(None)
            raise
        if not step.replayed:
            self._renewing = asyncio.get_running_loop().call_later(
                sequences.lease_ms / 3000, self._start_renewing)  # fmt: skip
        return self

    def _start_renewing(self) -> None:
        if not self._ended:
            self._renewing = asyncio.get_running_loop().create_task(self._renew())

    async def _renew(self) -> None:
        """Renew the lease now (a third of it has passed), then every third of it while the
        step runs."""
        sequences = self._sequences
        while True:
            with contextlib.suppress(ServiceError):  # unreachable: tried again; FINISH tells
                if not await sequences.renew(self.step):
                    return  # ran out: the write-back will find it stale
            await asyncio.sleep(sequences.lease_ms / 3000)

    async def __aexit__(self, kind: type | None, error: BaseException | None, tb: object) -> None:
        if self._renewing is not None:
            self._renewing.cancel()
        with self._lock:
            self._ended = True
        kept = self._kept if error is None else None
        result = await self._end(kept)
        if result.startswith("full:"):
            _, total, wait_ms = result.split(":")
            refused = Overloaded(f"the cluster's sequences keep {total} bytes of state in the "
                                 "cluster store; this request's would pass the most they may "
                                 f"({self._sequences.max_total_bytes}: "
                                 "OPSERVE_MEMORY_BUDGET_BYTES x OPSERVE_SEQUENCE_STATE_SHARE): "
                                 f"sequence {self.request.id} of model '{self.plan.model_name}' "
                                 "keeps its state from before this request; end sequences, or "
                                 "send it again later (Retry-After)")  # fmt: skip
            refused.retry_after = min(max(1, math.ceil(int(wait_ms) / 1000)), RETRY_MOST)
            raise refused
        if kept is not None and result != "kept":
            raise Unavailable(f"the lease of sequence {self.request.id} of model "
                              f"'{self.plan.model_name}' ran out before its state was written "
                              "back (OPSERVE_CLUSTER_SEQUENCE_LEASE_SECONDS); the sequence "
                              "keeps its state from before this request: send it again")  # fmt: skip

    async def _end(self, kept: bytes | None) -> str:
        """Write back (or not) and release; the claim and the local place go either way."""
        sequences = self._sequences
        try:  # shielded: a cancelled request still releases its lease at once
            if self.step.replayed:
                return "kept"  # by the step it replays
            return await asyncio.shield(sequences.finish(self.step, kept))
        finally:
            sequences.claims.release(self._claimed)
            self._claimed = 0
            sequences.leave(self.step)
