"""The store's script calls (service/cluster/store_scripts.py) against a real Redis: answers as
redis-py's own EVALSHA gives them, a script Redis lost loaded again, a broken connection
retried once on a fresh one, an error reply and a cancelled call leaving no reply for the next
call to read, a stalled Redis bounded by the timeout."""

import asyncio
import os
import signal
import time
from typing import Any

import pytest

from service.cluster.store import ClusterStore, ClusterUnreachable
from tests.cluster.redis_server import RedisServer

ECHO = "return {KEYS[1], ARGV[1], ARGV[2], ARGV[3], ARGV[4], #ARGV}"
SLOW = """
local t = redis.call('TIME')
local stop = tonumber(t[1]) * 1000000 + tonumber(t[2]) + 200000
while true do
  t = redis.call('TIME')
  if tonumber(t[1]) * 1000000 + tonumber(t[2]) >= stop then break end
end
return ARGV[1]
"""
ARGS: list[Any] = [b"\x00\xff\r\n$3\r\n", "caf\u00e9", 12345678901234, 2.5, b""]


def run(store: ClusterStore, scenario: Any) -> Any:
    async def whole() -> Any:
        try:
            return await scenario()
        finally:
            await store.close()

    return asyncio.run(whole())


def test_answers_are_redis_pys_own(redis: RedisServer) -> None:
    store = ClusterStore(redis.url, "test", 2.0)

    async def scenario() -> tuple[Any, Any]:
        ours = await store.call(store.script(ECHO)(keys=["k:1"], args=ARGS))
        theirs = await store.redis.register_script(ECHO)(keys=["k:1"], args=ARGS)
        return ours, theirs

    ours, theirs = run(store, scenario)
    assert ours == theirs == [b"k:1", ARGS[0], "caf\u00e9".encode(), b"12345678901234", b"2.5", 5]


def test_a_bool_is_refused_as_redis_py_refuses_it(redis: RedisServer) -> None:
    store = ClusterStore(redis.url, "test", 2.0)
    with pytest.raises(TypeError, match="True"):
        run(store, lambda: store.script(ECHO)(keys=["k"], args=[True]))


def test_a_script_redis_lost_is_loaded_again(redis: RedisServer) -> None:
    store = ClusterStore(redis.url, "test", 2.0)
    script = store.script(ECHO)

    async def scenario() -> list[Any]:
        first = await store.call(script(keys=["a"], args=[1, 2, 3, 4]))
        await store.redis.script_flush()
        assert await store.redis.script_exists(script.sha.decode()) == [False]
        second = await store.call(script(keys=["b"], args=[5, 6, 7, 8]))
        return [first, second]

    assert run(store, scenario) == [[b"a", b"1", b"2", b"3", b"4", 4],
                                    [b"b", b"5", b"6", b"7", b"8", 4]]  # fmt: skip


def test_a_broken_connection_is_tried_once_on_a_fresh_one(redis: RedisServer) -> None:
    store = ClusterStore(redis.url, "test", 2.0)
    script = store.script(ECHO)

    async def scenario() -> tuple[Any, int]:
        await store.call(script(keys=["a"], args=[1, 2, 3, 4]))  # a connection kept idle
        before = int((await store.redis.info("stats"))["total_connections_received"])
        killed = await store.redis.client_kill_filter(_type="normal", skipme=True)
        assert killed >= 1
        found = await store.call(script(keys=["b"], args=[5, 6, 7, 8]))
        after = int((await store.redis.info("stats"))["total_connections_received"])
        return found, after - before

    found, opened = run(store, scenario)
    assert found == [b"b", b"5", b"6", b"7", b"8", 4]
    assert opened >= 1  # the killed one was replaced


def test_an_error_reply_keeps_the_connection_and_its_text_stays_in_the_log(
    redis: RedisServer,
) -> None:
    store = ClusterStore(redis.url, "test", 2.0)

    async def scenario() -> tuple[str, Any, int]:
        echo = store.script(ECHO)
        await store.call(echo(keys=["a"], args=[1, 2, 3, 4]))
        before = int((await store.redis.info("stats"))["total_connections_received"])
        with pytest.raises(ClusterUnreachable) as refused:
            await store.call(store.script("return redis.call('NOSUCHCOMMAND')")())
        found = await store.call(echo(keys=["b"], args=[5, 6, 7, 8]))
        after = int((await store.redis.info("stats"))["total_connections_received"])
        return str(refused.value), found, after - before

    text, found, opened = run(store, scenario)
    assert "NOSUCHCOMMAND" not in text and "refused a call" in text
    assert found == [b"b", b"5", b"6", b"7", b"8", 4]
    assert opened == 0


def test_a_cancelled_call_leaves_no_reply_for_the_next(redis: RedisServer) -> None:
    store = ClusterStore(redis.url, "test", 2.0)
    slow = store.script(SLOW)

    async def scenario() -> list[Any]:
        await store.call(slow(args=["warm"]))
        pending = asyncio.ensure_future(store.call(slow(args=["cancelled"])))
        await asyncio.sleep(0.05)  # sent; Redis runs it
        pending.cancel()
        with pytest.raises(asyncio.CancelledError):
            await pending
        return [await store.call(slow(args=[f"next {i}"])) for i in range(3)]

    assert run(store, scenario) == [b"next 0", b"next 1", b"next 2"]


def test_a_stalled_redis_is_bounded_by_the_timeout(redis: RedisServer) -> None:
    store = ClusterStore(redis.url, "test", 0.3)
    echo = store.script(ECHO)
    assert redis.process is not None
    pid = redis.process.pid

    async def scenario() -> tuple[float, Any]:
        await store.call(echo(keys=["a"], args=[1, 2, 3, 4]))
        os.kill(pid, signal.SIGSTOP)
        try:
            began = time.monotonic()
            with pytest.raises(ClusterUnreachable):
                await store.call(echo(keys=["b"], args=[1, 2, 3, 4]))
            waited = time.monotonic() - began
        finally:
            os.kill(pid, signal.SIGCONT)
        return waited, await store.call(echo(keys=["c"], args=[5, 6, 7, 8]))

    waited, found = run(store, scenario)
    assert 0.25 <= waited < 3.0  # the timeout, never a hang (a busy host may add some)
    assert found == [b"c", b"5", b"6", b"7", b"8", 4]
