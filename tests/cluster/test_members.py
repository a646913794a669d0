"""Membership against a real Redis: each process registers with a heartbeat, leaves when it
stops, counts as gone once its heartbeat runs out, and an unreachable Redis is a 503-kind
error within the timeout, never a hang."""

import asyncio
import os
import subprocess
import sys
import time
from collections.abc import Callable

import pytest

from service.cluster.cluster import Cluster
from service.cluster.store import ClusterUnreachable
from service.errors import Unavailable
from service.settings import Settings
from tests.api.live_server import ROOT
from tests.cluster.redis_server import RedisServer


def _settings(url: str, **more: object) -> Settings:
    return Settings(cluster_redis_url=url, cluster_heartbeat_seconds=0.2,
                    cluster_timeout_seconds=0.5, **more)  # type: ignore[arg-type]  # fmt: skip


def test_cluster_mode_is_off_without_a_url() -> None:
    """No cluster, and not even redis-py imported (cluster/joined.py): in a process of its own,
    as the tests' imports would have it loaded."""
    code = ("import sys; from service.main import create_app; app = create_app(); "
            "print(app.state.cluster, app.state.plane.shared_control, 'redis' in sys.modules)")  # fmt: skip
    shown = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, check=True)  # fmt: skip
    assert shown.stdout.split() == ["None", "None", "False"]


def test_members_see_each_other_and_leave(redis: RedisServer) -> None:
    async def scenario() -> None:
        first, second = Cluster(_settings(redis.url)), Cluster(_settings(redis.url))
        await first.start()
        await second.start()
        assert await first.members.live() == sorted([first.members.id, second.members.id])
        await second.members.beat({"applied": "7"})
        assert (await first.members.member(second.members.id))["applied"] == "7"
        await second.stop()
        assert await first.members.live() == [first.members.id]
        await first.stop()

    asyncio.run(scenario())


def test_a_member_whose_heartbeat_stops_counts_as_gone(redis: RedisServer) -> None:
    async def scenario() -> None:
        alive, silent = Cluster(_settings(redis.url)), Cluster(_settings(redis.url))
        await alive.start()
        await silent.members.beat()  # registered once, never again: as a SIGKILLed process
        assert silent.members.id in await alive.members.live()
        await asyncio.sleep(0.8)  # 3 heartbeats of 0.2 s, and a margin
        assert await alive.members.live() == [alive.members.id]
        assert await alive.members.member(silent.members.id) == {}
        await alive.stop()
        await silent.store.close()

    asyncio.run(scenario())


def test_deployments_with_other_names_do_not_see_each_other(redis: RedisServer) -> None:
    async def scenario() -> None:
        blue = Cluster(_settings(redis.url, cluster_name="blue"))
        green = Cluster(_settings(redis.url, cluster_name="green"))
        await blue.start()
        await green.start()
        assert await blue.members.live() == [blue.members.id]
        await blue.stop()
        await green.stop()

    asyncio.run(scenario())


async def _eventually(check: Callable[[], bool], within: float = 5.0) -> None:
    """`check` holds within `within` seconds (a heartbeat's few turns; more on a busy host)."""
    deadline = time.monotonic() + within
    while not check():
        assert time.monotonic() < deadline, "not within the time"
        await asyncio.sleep(0.05)


def test_an_unreachable_store_is_unavailable_within_the_timeout(redis: RedisServer) -> None:
    async def scenario() -> None:
        cluster = Cluster(_settings(redis.url))
        await cluster.start()
        assert cluster.members.reachable
        redis.stop()
        began = time.monotonic()
        with pytest.raises(ClusterUnreachable, match=r"cluster store .*unreachable") as refused:
            await cluster.members.live()
        assert time.monotonic() - began < 2
        assert isinstance(refused.value, Unavailable) and refused.value.retry_after == 1
        await _eventually(lambda: not cluster.members.reachable)  # the heartbeat noticed
        redis.start()
        await _eventually(lambda: cluster.members.reachable)  # and came back by itself
        assert await cluster.members.live() == [cluster.members.id]
        await cluster.stop()

    asyncio.run(scenario())


def test_keys_quote_names_so_none_reaches_another(redis: RedisServer) -> None:
    cluster = Cluster(_settings(redis.url))
    assert cluster.store.key("seq", "a:b", 1) != cluster.store.key("seq", "a", "b:1")
    assert cluster.store.key("seq", "m").startswith("opserve:opserve:seq:")
    asyncio.run(cluster.store.close())


def test_a_server_in_cluster_mode_registers_and_serves_stateless_calls_without_redis(
    redis: RedisServer,
) -> None:
    import json
    import urllib.request

    from tests.api.live_server import serve

    with serve(cluster_redis_url=redis.url, cluster_heartbeat_seconds="0.2") as server:

        async def members() -> list[str]:
            cluster = Cluster(_settings(redis.url))
            try:
                return await cluster.members.live()
            finally:
                await cluster.store.close()

        assert len(asyncio.run(members())) == 1
        redis.stop()
        body = json.dumps({"inputs": {"data": {"dtype": "int64", "shape": [2], "data": [2, 3]}}})
        request = urllib.request.Request(f"{server.url}/v1/ops/Shape/15", body.encode(),
                                         {"Content-Type": "application/json"})  # fmt: skip
        with urllib.request.urlopen(request, timeout=5) as answer:
            assert json.load(answer)["outputs"]["shape"]["data"] == [2]
    # the server left the cluster when it stopped; Redis was away then: its key runs out


def test_stopping_ends_the_heartbeat_whenever_it_comes(redis: RedisServer) -> None:
    """A stop that lands in the middle of a Redis call ends the heartbeat: redis-py 8.1 may
    answer a cancelled call, and a loop that went on after it never stopped."""

    async def scenario() -> None:
        for attempt in range(60):
            cluster = Cluster(_settings(redis.url))
            cluster.members.interval = 0.0005  # a beat almost always in flight
            await cluster.start()
            await asyncio.sleep(0.001 * (attempt % 7))
            await asyncio.wait_for(cluster.stop(), timeout=3)

    asyncio.run(scenario())


def test_calls_right_after_a_redis_restart_do_not_fail(redis: RedisServer) -> None:
    """Every connection the pool kept is dead once Redis restarted; a call on one is tried
    once more on a fresh connection, not answered 503."""

    async def scenario() -> None:
        cluster = Cluster(_settings(redis.url))
        await asyncio.gather(*(cluster.members.live() for _ in range(6)))  # six pooled
        redis.stop()
        redis.start()
        await asyncio.gather(*(cluster.members.live() for _ in range(6)))
        await cluster.store.close()

    asyncio.run(scenario())
