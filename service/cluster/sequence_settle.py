"""Steps whose replica never learnt what its last store call did (the connection broke twice,
Redis stalled past the timeout, the request was cancelled mid-call): the replica answered 503
"the outcome is unknown", and settles each such step once the store answers again (SETTLE,
sequence_scripts.py): a write-back that ran is marked in doubt, so the client's resend is
answered as a replay; a step that did not is fenced, so a call of it still queued in a stalled
Redis does nothing when it runs. Only a fault costs these calls: a step that ends well makes
none."""

import asyncio
import logging
import time
from dataclasses import dataclass

from service.cluster.sequence_scripts import SETTLE
from service.cluster.store import ClusterStore, ClusterUnreachable

log = logging.getLogger("opserve")

MOST_UNSETTLED = 4096  # steps a replica keeps to settle; past it the oldest is given up (logged)
SETTLE_SECONDS = 600.0  # how long a step is tried: a command queued in a stalled Redis may wait
PAUSE = 0.05  # seconds between rounds while the store does not answer


@dataclass(frozen=True, slots=True)
class Unsettled:
    keys: list[str]
    token: str
    member: str
    idle_ms: int
    until: float  # time.monotonic(): tried until then


class Settler:
    """This process's steps to settle, tried in the background until the store answers."""

    def __init__(self, store: ClusterStore, lease_ms: int) -> None:
        self.store = store
        self.lease_ms = lease_ms
        self._settle = store.script(SETTLE)
        self._steps: dict[str, Unsettled] = {}  # by token, oldest first
        self._task: asyncio.Task[None] | None = None

    def __len__(self) -> int:
        return len(self._steps)

    def add(self, keys: list[str], token: str, member: str, idle_ms: int) -> None:
        """A step to settle (its token: a step added twice is settled once)."""
        if token not in self._steps and len(self._steps) >= MOST_UNSETTLED:
            oldest = next(iter(self._steps))
            log.warning("gave up settling sequence step %s (%s): more than %d steps wait to be "
                        "settled", oldest, self._steps.pop(oldest).keys[0], MOST_UNSETTLED)  # fmt: skip
        self._steps[token] = Unsettled(keys, token, member, idle_ms,
                                       time.monotonic() + SETTLE_SECONDS)  # fmt: skip
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        while self._steps:
            for step in list(self._steps.values()):
                if step.until < time.monotonic():
                    log.warning("gave up settling sequence step %s (%s): the cluster store did "
                                "not answer", step.token, step.keys[0])  # fmt: skip
                    self._steps.pop(step.token, None)
                    continue
                try:
                    found = await self.store.call(self._settle(keys=step.keys, args=[
                        step.token, step.idle_ms, step.member, self.lease_ms]))  # fmt: skip
                except ClusterUnreachable:
                    break
                self._steps.pop(step.token, None)
                log.info("sequence step %s (%s) settled: %s", step.token, step.keys[0],
                         found.decode() if isinstance(found, bytes) else found)  # fmt: skip
            else:
                continue
            await asyncio.sleep(PAUSE)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
