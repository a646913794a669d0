"""The loop of cluster mode's background work (the heartbeat, the statistics' writes): a step
every few seconds for the life of the process, which no failure of one step may end."""

import asyncio
import logging
from collections.abc import Awaitable, Callable

from service.cluster.store import ClusterUnreachable

log = logging.getLogger("opserve")


async def repeat(step: Callable[[], Awaitable[object]], interval: float, what: str,
                 first_wait: bool = False) -> None:  # fmt: skip
    """Run `step` every `interval` seconds until cancelled (after one wait when
    `first_wait`). A store away is the step's to report (ClusterUnreachable); any other
    failure is logged with its traceback and the loop goes on: a task that died silently
    would leave this replica out of the cluster (no heartbeat) or its counts stale."""
    if first_wait:
        await asyncio.sleep(interval)
    while True:
        try:
            await step()
        except ClusterUnreachable:
            pass
        except Exception:
            log.exception("cluster %s failed; tried again in %s s", what, interval)
        await asyncio.sleep(interval)
