"""The one connection pool to the cluster's Redis of a process, its key names, and what an
unreachable Redis becomes: `ClusterUnreachable` (503 / UNAVAILABLE, Retry-After), never a
hang past the timeout and never a 500."""

import asyncio
import logging
import math
import time
from collections.abc import Awaitable
from typing import TypeVar
from urllib.parse import quote

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import OutOfMemoryError, RedisError
from redis.exceptions import TimeoutError as RedisTimeoutError

from service.cluster.store_scripts import Script, ScriptCalls
from service.errors import Unavailable

log = logging.getLogger("opserve")
T = TypeVar("T")


class ClusterUnreachable(Unavailable):
    """The cluster store (Redis) did not answer in time: the call may succeed once it is back."""

    retry_after = 1  # seconds, sent as Retry-After (HTTP) and retry-after metadata (gRPC)
    cause = ""  # Redis's own text, for the log only


class ClusterFull(ClusterUnreachable):
    """The cluster store refused a write: Redis is out of memory (its `maxmemory`). It answered:
    what only reads goes on, and this process stays a member."""


# What a client sees of a failing store: never Redis's own text, which names its address,
# script digests and lines, key names and members (the log has it).
UNREACHABLE = "the cluster store (Redis) is unreachable; try again shortly"
FULL = ("the cluster store (Redis) is full and refuses writes (its maxmemory); try again "
        "later, or end sequences and unload models to free it")  # fmt: skip
REFUSED = "the cluster store (Redis) refused a call; try again shortly"


def _plain(error: ClusterUnreachable, exc: BaseException) -> ClusterUnreachable:
    """`error`, its cause's detail logged (once per kind and second: a Redis away fails many
    calls) and kept for the log only, never in its text."""
    now = time.monotonic()
    kind = type(exc).__name__
    if now - _logged.get(kind, -math.inf) >= 1.0:
        _logged[kind] = now
        log.warning("cluster store call failed: %s: %s", kind, str(exc)[:500])
    error.cause = str(exc)[:500]
    return error


_logged: dict[str, float] = {}


class ClusterStore:
    """redis-py's asyncio client (hiredis parses its replies when installed) on
    `url` (`redis://`, `rediss://` for TLS, a password in the URL as redis-py takes it), every
    call bounded by `timeout` seconds; every key starts with `opserve:<name>:` so deployments
    can share one Redis."""

    def __init__(self, url: str, name: str, timeout: float) -> None:
        self.name = name
        self.timeout = timeout
        self.prefix = f"opserve:{quote(name, safe='')}:"
        # One retry, on a fresh connection, for a connection that broke, never for a timeout:
        # after a Redis restart every connection the pool kept is dead, and each would
        # otherwise fail one request (503) before the pool dropped it; a Redis that does not
        # answer costs a request one timeout at most. What runs twice so is safe to: every
        # sequence script records its step's token and does nothing twice for it
        # (sequence_scripts.py), the totals and heartbeats are written whole.
        self.redis: aioredis.Redis = aioredis.Redis.from_url(
            url, socket_timeout=timeout, socket_connect_timeout=timeout,
            retry_on_timeout=False, health_check_interval=30,
            retry=Retry(NoBackoff(), 1, supported_errors=(RedisConnectionError,)),
        )  # fmt: skip
        self._scripts = ScriptCalls(self.redis.connection_pool, timeout)

    def key(self, kind: str, *parts: str | int) -> str:
        """The key of `kind` for `parts`, each part quoted so no name (a model's may hold `:`)
        can reach another's key."""
        quoted = (quote(str(part), safe="") for part in parts)
        return ":".join((self.prefix + kind, *quoted))

    async def call(self, pending: Awaitable[T]) -> T:
        """Await one Redis call; an unreachable or failing store is ClusterUnreachable. A call
        cancelled (its request gone, its task stopping) stays cancelled: redis-py (8.1) may
        absorb the cancellation of a call and answer it, or turn it into a connection error,
        which would read as a Redis away; a background loop that goes on after either would
        never stop (the heartbeat did, under test)."""
        try:
            answer = await pending
            _still_cancelled()
            return answer
        except (RedisConnectionError, RedisTimeoutError, OSError) as exc:
            _still_cancelled()
            raise _plain(ClusterUnreachable(UNREACHABLE), exc) from None
        except RedisError as exc:  # e.g. a script error, or a Redis out of memory
            _still_cancelled()
            if isinstance(exc, OutOfMemoryError) or str(exc).startswith("OOM"):
                raise _plain(ClusterFull(FULL), exc) from None
            raise _plain(ClusterUnreachable(REFUSED), exc) from None

    def script(self, lua: str) -> Script:
        """A Lua script run by its digest (loaded again when Redis lost it), on connections of
        its own (store_scripts.py)."""
        return Script(self._scripts, lua)

    async def close(self) -> None:
        await self._scripts.close()
        await self.redis.aclose()


def _still_cancelled() -> None:
    """Raise CancelledError when the running task was asked to stop (Task.cancelling)."""
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError
