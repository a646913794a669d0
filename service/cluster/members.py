"""Who is alive: each replica (each worker process of each replica) registers itself with a
heartbeat. A member is a hash `member:<id>` (host, pid, start time, and whatever the pieces
of cluster mode publish, e.g. the repository generation it applied) that expires unless
refreshed, and an entry in the sorted set `members` scored by when it expires, so the live
members are one range query. Times are Redis's own clock (TIME), never the replicas'.

A member says in its registration whether it takes part in repository control (`CONTROL`:
"1" only where repository.py runs, i.e. explicit model control), so a load or unload waits
for those members only: one in mode `none` or `poll` never applies the cluster's record."""

import asyncio
import logging
import os
import secrets
import socket
import time
from collections.abc import Mapping

from service.cluster.store import ClusterFull, ClusterStore, ClusterUnreachable
from service.cluster.timer import repeat

log = logging.getLogger("opserve")
CONTROL = "repository_control"
"""Field of a member's hash: "1" when it applies the repository's desired state, "0" when not
(a member without it, from an older release, is taken to apply it)."""

# KEYS[1] members, KEYS[2] the member's hash; ARGV: id, ttl ms, then field, value pairs.
# allow-oom: a Redis full (maxmemory, noeviction) still takes the heartbeat, which rewrites
# what it wrote before, so the members stay (and their models ready) while calls that would
# add to it are refused
_BEAT = """#!lua flags=allow-oom
local now = redis.call('TIME')
local ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
redis.call('ZADD', KEYS[1], ms + tonumber(ARGV[2]), ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', ms)
if #ARGV > 2 then redis.call('HSET', KEYS[2], unpack(ARGV, 3)) end
redis.call('PEXPIRE', KEYS[2], ARGV[2])
return ms
"""
# KEYS[1] members: the ids whose heartbeat has not run out
_LIVE = """
local now = redis.call('TIME')
local ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
return redis.call('ZRANGEBYSCORE', KEYS[1], ms, '+inf')
"""


class Membership:
    """This process as a member of the cluster: `start()` begins its heartbeat every
    `interval` seconds (its registration lives 3 intervals), `stop()` leaves at once.
    `reachable` is whether the last heartbeat reached Redis, since `reachable_since`."""

    def __init__(self, store: ClusterStore, interval: float) -> None:
        self.store = store
        self.interval = interval
        self.id = f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"
        self.info: dict[str, str] = {"host": socket.gethostname(), "pid": str(os.getpid()),
                                     "started": str(time.time()), CONTROL: "0"}  # fmt: skip
        self.reachable = False
        self.reachable_since = 0.0  # monotonic time of the last beat that found Redis again
        self._beat = store.script(_BEAT)
        self._live = store.script(_LIVE)
        self._task: asyncio.Task[None] | None = None

    @property
    def ttl_ms(self) -> int:
        return max(1, round(self.interval * 3000))

    def member_key(self, member_id: str) -> str:
        return self.store.key("member", member_id)

    async def beat(self, fields: Mapping[str, str] | None = None) -> None:
        """Refresh this member's registration now, publishing `fields` with it (they stay in
        `info` and go with every later beat too)."""
        if fields:
            self.info.update(fields)
        flat = [item for pair in self.info.items() for item in pair]
        keys = [self.store.key("members"), self.member_key(self.id)]
        try:
            await self.store.call(self._beat(keys=keys, args=[self.id, self.ttl_ms, *flat]))
        except ClusterFull:
            raise  # it answered: still reachable
        except ClusterUnreachable:
            if self.reachable:
                log.warning("cluster store (Redis) unreachable: member %s missed a heartbeat",
                            self.id)  # fmt: skip
            self.reachable = False
            raise
        if not self.reachable:
            log.info("cluster member %s registered (cluster %r)", self.id, self.store.name)
            self.reachable_since = time.monotonic()
        self.reachable = True

    async def live(self) -> list[str]:
        """Ids of the members whose heartbeat has not run out (this one among them)."""
        found = await self.store.call(self._live(keys=[self.store.key("members")]))
        return sorted(_text(item) for item in found)

    async def member(self, member_id: str) -> dict[str, str]:
        """What a member published (empty when its registration ran out)."""
        found = await self.store.call(self.store.redis.hgetall(self.member_key(member_id)))
        return {_text(k): _text(v) for k, v in found.items()}

    def start(self) -> None:
        self._task = asyncio.create_task(self._heartbeat(), name="cluster-heartbeat")

    async def _heartbeat(self) -> None:
        await repeat(self.beat, self.interval, "heartbeat")  # beat() logs a store away once

    async def stop(self) -> None:
        """Stop the heartbeat and leave the cluster (best effort: Redis may be away)."""
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        try:
            await self.store.call(self.store.redis.zrem(self.store.key("members"), self.id))
            await self.store.call(self.store.redis.delete(self.member_key(self.id)))
        except ClusterUnreachable:
            pass  # its registration runs out by itself


def _text(item: bytes | str) -> str:
    return item.decode() if isinstance(item, bytes) else item
