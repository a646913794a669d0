"""The store's Lua scripts, each run as one EVALSHA on connections of their own: a sequence step
is two script calls, and redis-py's per-call layers (its pool's lock, a task per write under
Python 3.11's wait_for, its encoder, retry and metrics wrappers) cost more than the round
trip itself on a local Redis (a script that only answers: 0.195 ms through them, 0.115 ms
here; bench/bench_sequences.py, docs/v2.md). redis-py's Connection still connects,
authenticates, selects the database, speaks TLS and parses (hiredis); what this adds is a plain
list of idle connections and the rules the store's client kept: each call bounded by the
store's timeout, one retry on a fresh connection for a connection that broke (never for a
timeout), a script loaded again when Redis lost it."""

import asyncio
import hashlib
from collections.abc import Sequence
from typing import Any

from redis.asyncio.connection import AbstractConnection, ConnectionPool
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

MOST_IDLE = 32  # connections kept between calls; more, opened by a burst, are closed after it

Arg = str | bytes | int | float


class ScriptCalls:
    """Connections made as `pool`'s are (its URL, password, TLS, database), each call bounded by
    `timeout` seconds from its start on the connection to its answer."""

    def __init__(self, pool: ConnectionPool, timeout: float) -> None:
        self.timeout = timeout
        self._make = pool.connection_class
        # the call's own timeout bounds the write and the read together: none per socket call
        self._kwargs = {**pool.connection_kwargs, "socket_timeout": None}
        self._idle: list[AbstractConnection] = []

    async def run(self, script: "Script", keys: Sequence[Arg], args: Sequence[Arg]) -> Any:
        """The script's answer (bytes, int or a list of them); redis-py's errors as its client
        raises them (a RedisError, a ConnectionError or TimeoutError when Redis is away)."""
        packed = _pack((b"EVALSHA", script.sha, len(keys), *keys, *args))
        for attempt in (1, 2):
            conn = self._idle.pop() if self._idle and attempt == 1 else self._make(**self._kwargs)
            try:
                async with asyncio.timeout(self.timeout):
                    answer = await _evalsha(conn, script, packed)
            except TimeoutError:
                await conn.disconnect(nowait=True)
                raise RedisTimeoutError("the cluster store did not answer in time") from None
            except (RedisConnectionError, OSError):
                await conn.disconnect(nowait=True)
                if attempt == 2:
                    raise
                continue  # the connection broke (after a Redis restart every idle one has)
            except ResponseError:  # Redis's error reply: the connection has nothing left
                self._keep(conn)
                raise
            except BaseException:  # e.g. a cancellation mid-call: a reply may be left unread
                await conn.disconnect(nowait=True)
                raise
            self._keep(conn)
            return answer
        raise AssertionError("unreachable")

    def _keep(self, conn: AbstractConnection) -> None:
        if len(self._idle) < MOST_IDLE:
            self._idle.append(conn)
        else:
            closing = asyncio.get_running_loop().create_task(conn.disconnect(nowait=True))
            _closing.add(closing)  # held until it ends (the loop keeps only a weak reference)
            closing.add_done_callback(_closing.discard)

    async def close(self) -> None:
        idle, self._idle = self._idle, []
        for conn in idle:
            await conn.disconnect(nowait=True)


class Script:
    """A Lua script, called as redis-py's Script is: `await script(keys=..., args=...)`."""

    def __init__(self, calls: ScriptCalls, lua: str) -> None:
        self.lua = lua.encode()
        self.sha = hashlib.sha1(self.lua).hexdigest().encode()
        self._calls = calls

    async def __call__(self, keys: Sequence[Arg] = (), args: Sequence[Arg] = ()) -> Any:
        return await self._calls.run(self, keys, args)


_closing: set[asyncio.Task[None]] = set()


async def _evalsha(conn: AbstractConnection, script: Script, packed: bytes) -> object:
    await conn.send_packed_command(packed, check_health=False)
    try:
        return await conn.read_response()
    except NoScriptError:  # Redis restarted, or SCRIPT FLUSH: load it and call again
        await conn.send_packed_command(_pack((b"SCRIPT", b"LOAD", script.lua)), check_health=False)
        await conn.read_response()
        await conn.send_packed_command(packed, check_health=False)
        return await conn.read_response()


def _pack(args: Sequence[Arg]) -> bytes:
    """One command in Redis's protocol (RESP); the exact types first (half the time of
    isinstance tests, for the 30 arguments of a step's script)."""
    parts = [b"*%d\r\n" % len(args)]
    for arg in args:
        if type(arg) is bytes:
            data = arg
        elif type(arg) is str:
            data = arg.encode()
        elif type(arg) is int or type(arg) is float:
            data = repr(arg).encode()
        else:
            data = _other(arg)
        parts.append(b"$%d\r\n%b\r\n" % (len(data), data))
    return b"".join(parts)


def _other(arg: object) -> bytes:
    """An argument of another type, as redis-py's encoder takes it (never a bool)."""
    if isinstance(arg, bool) or not isinstance(arg, (str, bytes, bytearray, memoryview, int,
                                                     float)):  # fmt: skip
        raise TypeError(f"a script argument must be str, bytes or a number, not {arg!r}")
    if isinstance(arg, str):
        return arg.encode()
    if isinstance(arg, (int, float)):
        return repr(int(arg) if isinstance(arg, int) else float(arg)).encode()
    return bytes(arg)
