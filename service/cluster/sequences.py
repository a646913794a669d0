"""Sequences on any replica: cluster mode's keeper of sequences, with the turn() of the one-process
table (service/core/sequences.py) and its rules and texts, but each sequence's state, liveness
and order kept in the cluster store, so any replica may take any step of any sequence.

A step is two round trips when no other step of its sequence is pending: ARRIVE (a ticket in
the sequence's order, liveness settled as Triton settles it on arrival, the lease and the state
when its turn has come) and FINISH (the state written back, checked against the lease's token
and the step counter, and the lease released) (sequence_scripts.py). A step whose turn has not
come asks again (TRY) every few milliseconds; in a process only the earliest waiting step of a
sequence asks (local FIFO), refreshing the claims of the others waiting behind it. A long step
renews its lease every third of it. docs/deployment.md ("Sequences on any replica") tells what a client sees.

Exactly once: every script is safe to run twice (sequence_scripts.py), so the store's retry on
a fresh connection applies nothing twice and a step whose connection broke once answers as if
it had not. A step whose replica cannot learn what its call did answers 503 "the outcome is
unknown: send the same request again" (never "nothing happened"), and is settled in the
background (sequence_settle.py) so that resend is applied once.
"""

import asyncio
import contextlib
import logging
import secrets
from collections.abc import Hashable, Iterator
from typing import Any
from urllib.parse import quote

from service.cluster.members import Membership
from service.cluster.sequence_scripts import ARRIVE, FINISH, FORGET, RENEW, TRY
from service.cluster.sequence_settle import Settler
from service.cluster.sequence_turn import ClusterTurn, Step
from service.cluster.store import ClusterFull, ClusterStore, ClusterUnreachable
from service.core.sequence_claims import StateClaims
from service.core.sequence_request import SequenceRequest
from service.core.sequence_resend import Resend
from service.core.sequences import (
    refusal,
    slots_full,
    start_needed,
    too_many_waiting,
    warn_restart,
    with_id,
)
from service.errors import Unavailable
from service.runtime.sequence_plan import SequencePlan

log = logging.getLogger("opserve")

SEQUENCE_KINDS = ("seq", "seqlease", "seqqueue", "seqclaim")  # KEYS[1] to [4]: per sequence
MOST_MODEL_KEYS = 1024  # models whose key prefixes are kept (past it they are made again)
FIRST_POLL = 0.001  # seconds: a waiting step asks again after this, then twice as long...
LONGEST_POLL = 0.02  # ...up to this


class _Local:
    """This process's steps of one sequence: tickets are taken one at a time (so in the order
    the requests came), and one waiting step at a time asks the store for its turn."""

    __slots__ = ("arrival", "asking", "pending", "waiting")

    def __init__(self) -> None:
        self.arrival = asyncio.Lock()
        self.asking = False
        self.pending = 0
        self.waiting: dict[str, asyncio.Future[None]] = {}  # by token, in ticket order

    def tokens_behind(self, token: str) -> list[str]:
        return [other for other in self.waiting if other != token]


class ClusterSequences:
    """Every sequence of the cluster, kept in `store`; `claims` holds the state of a step
    while it runs (the process's memory budget); `lease_seconds` bounds how long a dead
    replica's step holds its sequence. The cluster holds at most `max_sequences` live
    sequences and `max_total_bytes` of their state; a sequence's keys live at most
    `max_idle_seconds` idle, whatever its model's configuration says."""

    def __init__(self, store: ClusterStore, members: Membership, claims: StateClaims,
                 lease_seconds: float, *, max_waiting: int = 16,
                 max_state_bytes: int = 1 << 20, max_sequences: int = 1000,
                 max_total_bytes: int = 256 << 20,
                 max_idle_seconds: float = 86400.0) -> None:  # fmt: skip
        self.store = store
        self.members = members
        self.claims = claims
        self.lease_ms = max(1, round(lease_seconds * 1000))
        self.max_waiting = max_waiting
        self.max_state_bytes = max_state_bytes
        self.max_sequences = max_sequences
        self.max_total_bytes = max_total_bytes
        self.max_idle_ms = max(1, round(max_idle_seconds * 1000))
        self._cluster = [store.key("seqall"), store.key("seqheld"), store.key("seqbytes")]
        self._model_keys: dict[tuple[str, str], tuple[str, ...]] = {}
        self._forget = store.script(FORGET)
        self._arrive, self._try = store.script(ARRIVE), store.script(TRY)
        self._renew, self._finish = store.script(RENEW), store.script(FINISH)
        self._local: dict[tuple[Hashable, int | str], _Local] = {}
        self.settler = Settler(store, self.lease_ms)

    @property
    def available(self) -> bool:
        """Whether the store answered last (the heartbeat's or a step's call)."""
        return self.members.reachable

    def turn(self, model_key: Hashable, plan: SequencePlan, request: SequenceRequest | None,
             resend: Resend | None = None) -> ClusterTurn:  # fmt: skip
        """The request's turn in its sequence, as sequences.Sequences.turn; `resend` lets the
        store tell a client's resend of the last committed step."""
        return ClusterTurn(self, model_key, plan, with_id(plan, request), resend)

    # --- the steps, called by ClusterTurn ---

    def keys(self, model_key: Hashable, seq_id: int | str) -> tuple[list[str], str]:
        """The eight keys of sequence_scripts.py, and the id's member in the model's table."""
        name, version = model_key if isinstance(model_key, tuple) else (model_key, "")
        member = f"{'s' if isinstance(seq_id, str) else 'i'}{seq_id}"  # 42 and "42" differ
        # store.key quotes each part: the model's parts once per model, not on every step
        found = self._model_keys.get((name, version))
        if found is None:
            if len(self._model_keys) >= MOST_MODEL_KEYS:
                self._model_keys.clear()
            key = self.store.key
            found = (*(key(kind, name, version) + ":" for kind in SEQUENCE_KINDS),
                     key("seqlive", name, version))  # fmt: skip
            self._model_keys[(name, version)] = found
        tail = quote(member, safe="")
        return [*(prefix + tail for prefix in found[:-1]), found[-1], *self._cluster], member

    def _cluster_keys(self) -> list[str]:
        return list(self._cluster)

    async def begin(self, step: Step) -> tuple[int, bytes | None]:
        """Take a ticket, then the lease when the step's turn comes (setting the step's counter
        of committed steps): the state's START generation and the state; refusals as the
        one-process table's."""
        local = self._local.setdefault(step.local_key, _Local())
        local.pending += 1
        try:
            await self._queue_to_arrive(step, local)
            try:
                with self._unknown(step):
                    reply = await self._call(self._arrive(keys=step.keys, args=[
                        step.token, int(step.request.start), int(step.request.end),
                        self.lease_ms, step.idle_ms, step.plan.max_live, step.member,
                        self.max_waiting, step.version, step.fingerprint, int(step.named),
                        self.max_sequences, self.max_total_bytes,
                        step.plan.state_bytes]))  # fmt: skip
            finally:
                local.arrival.release()
            got = self._arrived(step, reply)
            if got is None:
                with self._unknown(step):
                    got = await self._wait(step, local)
            step.counter, generation, value = got
            return generation, value
        except BaseException:
            self._leave(step.local_key, local)
            raise

    @contextlib.contextmanager
    def _unknown(self, step: Step) -> Iterator[None]:
        """Around a step's store calls whose outcome may be unknown: the step is settled later,
        and its client told so."""
        try:
            yield
        except asyncio.CancelledError:  # the request is gone: its call may still have run
            self.settler.add(step.keys, step.token, step.member, step.idle_ms)
            raise
        except ClusterFull as exc:  # refused before it wrote anything, or settled as below
            self.settler.add(step.keys, step.token, step.member, step.idle_ms)
            raise ClusterFull(f"{exc}; request of sequence {step.request.id} of model "
                              f"'{step.plan.model_name}': send the same request again later, "
                              "it will not be applied twice") from None  # fmt: skip
        except ClusterUnreachable as exc:
            self.settler.add(step.keys, step.token, step.member, step.idle_ms)
            log.warning("sequence step %s (%s): %s", step.token, step.keys[0], exc.cause)
            raise outcome_unknown(step) from None

    async def _queue_to_arrive(self, step: Step, local: _Local) -> None:
        """Wait for this process's earlier steps of the sequence to take their tickets, at
        most the store's timeout: each of them waits up to that timeout for Redis, so with a
        Redis that hangs the Nth step would otherwise answer only after N timeouts."""
        if not local.arrival.locked():  # taken at once, never waited for: no timer (most steps)
            await local.arrival.acquire()
            return
        try:
            async with asyncio.timeout(self.store.timeout):
                await local.arrival.acquire()
        except TimeoutError:
            raise ClusterUnreachable(
                f"the cluster store (Redis) is unreachable: the earlier requests of sequence "
                f"{step.request.id} on this replica still wait for it; try again shortly"
            ) from None

    def _arrived(self, step: Step, reply: list[Any]) -> tuple[int, int, bytes | None] | None:
        kind = _text(reply[0])
        if kind == "replay":
            step.replayed = True
            return 0, 0, reply[1] or None
        if kind == "closed":
            raise start_needed(step.request, step.plan)
        if kind == "fenced":  # never for a live step: its token was given up
            raise Unavailable(f"request of sequence {step.request.id} of model "
                              f"'{step.plan.model_name}' was given up: send it again")  # fmt: skip
        if kind == "full":
            held, wait_ms = int(reply[1]), int(reply[2])
            raise refusal(slots_full(step.plan, held), wait_ms / 1000, 0)
        if kind in ("all", "bytes"):
            raise refusal(cluster_full(kind, int(reply[1]), self), int(reply[2]) / 1000, 0)
        if kind == "busy":
            raise too_many_waiting(step.request, step.plan, self.max_waiting)
        step.generation = int(reply[1])
        if int(reply[2]):
            warn_restart(step.request, step.plan)
        step.ticketed = True
        if kind == "go":
            step.alone = _text(reply[6]) == "1"
            return _state(reply[3:6])
        return None

    async def _wait(self, step: Step, local: _Local) -> tuple[int, int, bytes | None]:
        """Wait for the step's turn: this process's earliest waiting step asks the store."""
        turn = local.waiting[step.token] = asyncio.get_running_loop().create_future()
        try:
            self._next_asker(local)
            await turn
            delay = FIRST_POLL
            while True:
                reply = await self._call(self._try(keys=step.keys, args=[
                    step.token, self.lease_ms, step.idle_ms, step.member,
                    *local.tokens_behind(step.token)]))  # fmt: skip
                kind = _text(reply[0])
                if kind == "go":
                    return _state(reply[1:4])
                if kind == "lost":
                    raise Unavailable(f"request of sequence {step.request.id} of model "
                                      f"'{step.plan.model_name}' lost its place in the "
                                      "sequence's order (its claim ran out): send it again")  # fmt: skip
                await asyncio.sleep(delay)
                delay = min(2 * delay, LONGEST_POLL)
        finally:
            local.waiting.pop(step.token, None)
            if turn.done() and not turn.cancelled():
                local.asking = False
            self._next_asker(local)

    @staticmethod
    def _next_asker(local: _Local) -> None:
        if local.asking:
            return
        for turn in local.waiting.values():
            if not turn.done():
                local.asking = True
                turn.set_result(None)
                return

    async def renew(self, step: Step) -> bool:
        """Renew the step's lease; False when it ran out (another step may hold it now)."""
        found = await self._call(self._renew(keys=step.keys, args=[
            step.token, self.lease_ms, step.idle_ms, step.member]))  # fmt: skip
        return bool(found)

    async def finish(self, step: Step, state: bytes | None) -> str:
        """Write `state` back (None: a failed step, nothing written) and release the lease and
        the ticket: 'kept', 'stale' or 'released'."""
        commit = state is not None
        with self._unknown(step):
            found = await self._call(self._finish(keys=step.keys, args=[
                step.token, step.counter, int(commit), step.generation, step.idle_ms,
                step.member, self.lease_ms, state or b"", step.fingerprint,
                self.max_total_bytes, int(step.alone)]))  # fmt: skip
        return _text(found)

    async def forget(self, name: str) -> int:
        """Remove every sequence's keys of model `name` (all its versions: it was unloaded),
        and their place in the cluster's counts; a bounded batch per call. The number of
        sequences removed."""
        store, dropped = self.store, 0
        pattern = _glob(self.store.key("seq", name)) + ":*"
        cursor = 0
        while True:
            cursor, found = await store.call(store.redis.zscan(
                store.key("seqheld"), cursor, match=pattern, count=500))  # fmt: skip
            keys = [key for key, _ in found]
            if keys:
                dropped += int(await store.call(self._forget(
                    keys=self._cluster_keys(), args=[store.prefix, *keys])))  # fmt: skip
            if not cursor:
                return dropped

    def leave(self, step: Step) -> None:
        local = self._local.get(step.local_key)
        if local is not None:
            self._leave(step.local_key, local)

    def _leave(self, key: tuple[Hashable, int | str], local: _Local) -> None:
        local.pending -= 1
        if not local.pending and self._local.get(key) is local:
            del self._local[key]

    def abandon(self, step: Step) -> None:
        """Give up a ticket without waiting (a cancelled request): its claim would run out
        anyway, this frees its place at once."""
        task = asyncio.get_running_loop().create_task(self._quietly(self.finish(step, None)))
        _abandoned.add(task)
        task.add_done_callback(_abandoned.discard)

    @staticmethod
    async def _quietly(call: Any) -> None:
        with contextlib.suppress(ClusterUnreachable):
            await call

    async def _call(self, pending: Any) -> Any:
        """A store call; an unreachable store also makes the sequence models not ready until the
        heartbeat reaches it again."""
        try:
            return await self.store.call(pending)
        except ClusterFull:
            raise  # Redis answered: only the calls that write are refused
        except ClusterUnreachable:
            self.members.reachable = False
            raise

    def new_token(self) -> str:
        return secrets.token_hex(8)


_abandoned: set[asyncio.Task[None]] = set()


def outcome_unknown(step: Step) -> ClusterUnreachable:
    """A step whose replica cannot learn what its store call did (it is settled later)."""
    return ClusterUnreachable(f"the cluster store (Redis) is unreachable: whether request of "
                              f"sequence {step.request.id} of model '{step.plan.model_name}' "
                              "was applied is unknown; send the same request again (the same "
                              "inputs, flags and request id) shortly: it will not be applied "
                              "twice")  # fmt: skip


def cluster_full(kind: str, held: int, sequences: ClusterSequences) -> str:
    """The cluster's bound a new sequence would pass, for a refusal's text."""
    if kind == "all":
        return (f"{held} sequences are live in the cluster, the most it holds "
                f"(OPSERVE_MAX_SEQUENCES: {sequences.max_sequences})")  # fmt: skip
    return (f"the cluster's sequences keep {held} bytes of state in the cluster store, the most "
            f"they may ({sequences.max_total_bytes}: OPSERVE_MEMORY_BUDGET_BYTES x "
            "OPSERVE_SEQUENCE_STATE_SHARE)")  # fmt: skip


def _glob(text: str) -> str:
    """`text` matched literally in a Redis MATCH pattern."""
    return "".join(f"\\{char}" if char in "*?[]\\" else char for char in text)


def _state(found: list[Any]) -> tuple[int, int, bytes | None]:
    step, generation, state = found
    return int(step or 0), int(generation or 0), state


def _text(item: Any) -> str:
    return item.decode() if isinstance(item, bytes) else str(item)
