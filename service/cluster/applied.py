"""Acknowledgements of the repository's desired state: each replica publishes in its member
hash the generation it applied (`repository_applied`, `<epoch>:<generation>`) and the models it
failed to load there (`repository_failed`, JSON name -> reason); a control call waits until
every live member that takes part in repository control (members.CONTROL) has applied its
generation, or answers which did not."""

import asyncio
import json
import logging
import time

from service.cluster.members import CONTROL, Membership
from service.errors import Unavailable

log = logging.getLogger("opserve")
APPLIED = "repository_applied"
FAILED = "repository_failed"
POLL_SECONDS = 0.05
SETTLE_HEARTBEATS = 1.5
"""How long after this process finds Redis again every live member has beaten once more."""


class NotApplied(Unavailable):
    """A load or unload applied on the replica that took it, but not on every live replica
    within OPSERVE_CLUSTER_APPLY_SECONDS (HTTP 503, gRPC UNAVAILABLE): the text names each
    replica that did not, and why. The change stays desired."""


async def wait_applied(members: Membership, epoch: str, generation: int, name: str,
                       action: str, deadline_seconds: float) -> None:  # fmt: skip
    """Wait until every live member has applied `generation` of record `epoch` (for a load,
    without failing model `name`): NotApplied naming the others when one failed (once none is
    still pending) or at the deadline. A member that leaves meanwhile is no longer waited for;
    one that has not beaten since Redis came back is waited for (SETTLE_HEARTBEATS)."""
    deadline = time.monotonic() + deadline_seconds
    # Redis just came back (or this process just joined): the other live members register
    # again within a heartbeat; until then live() would leave them out, and not wait for them
    settled = members.reachable_since + SETTLE_HEARTBEATS * members.interval
    await asyncio.sleep(max(0.0, min(settled, deadline) - time.monotonic()))
    while True:
        pending, failed, live = await _look(members, epoch, generation, name, action)
        if not pending and not failed:
            return
        if not pending or time.monotonic() >= deadline:
            log.warning("%s of model %s not applied: pending %s, failed %s", action, name[:100],
                        sorted(pending), failed)  # fmt: skip
            raise NotApplied(_message(name, action, live, pending, failed, deadline_seconds))
        await asyncio.sleep(POLL_SECONDS)


async def _look(members: Membership, epoch: str, generation: int, name: str,
                action: str) -> tuple[dict[str, str], dict[str, str], int]:  # fmt: skip
    """(members still pending: what they applied, members that failed: why, how many live
    members take part in repository control)."""
    pending: dict[str, str] = {}
    failed: dict[str, str] = {}
    taking_part = 0
    for member in await members.live():
        info = await members.member(member)
        if info.get(CONTROL) == "0":  # mode none or poll: it never applies the record
            continue
        taking_part += 1
        applied = info.get(APPLIED, "")
        their_epoch, _, their_generation = applied.partition(":")
        if their_epoch != epoch or _number(their_generation) < generation:
            pending[member] = f"applied {applied.partition(':')[2] or 'nothing'} of {generation}"
            continue
        reason = _failures(info).get(name) if action == "load" else None
        if reason is not None:
            failed[member] = reason
    return pending, failed, taking_part


def _message(name: str, action: str, live: int, pending: dict[str, str],
             failed: dict[str, str], deadline: float) -> str:  # fmt: skip
    """`the load of 'm' ... not on 2 of 3 replicas: <id>: failed: ...; <id>: ...`"""
    parts = [f"{_shown(member)}: failed: {reason[:300]}"
             for member, reason in sorted(failed.items())]  # fmt: skip
    parts += [f"{_shown(member)}: did not apply it within {deadline:g} s "
              f"(OPSERVE_CLUSTER_APPLY_SECONDS; {what})"
              for member, what in sorted(pending.items())]  # fmt: skip
    shown = parts[:5] + ([f"and {len(parts) - 5} more"] if len(parts) > 5 else [])
    return (f"the {action} of '{name[:100]}' applied on this replica but not on "
            f"{len(parts)} of {live} replicas: {'; '.join(shown)}; the model stays "
            f"{'desired' if action == 'load' else 'unloaded'} in the cluster: "
            f"{action} it again to retry")  # fmt: skip


def _shown(member: str) -> str:
    """A member as a client reads it: its random part, never its host name and PID (the log
    names them with it)."""
    return f"replica {member.rpartition(':')[2]}"


def _failures(info: dict[str, str]) -> dict[str, str]:
    try:
        found = json.loads(info.get(FAILED) or "{}")
    except ValueError:
        return {}
    return {str(k): str(v) for k, v in found.items()} if isinstance(found, dict) else {}


def _number(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        return -1
