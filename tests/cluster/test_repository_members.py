"""Repository control across replicas that differ (issue 32, item 3), with a real redis-server
and real replica processes: a member in model-control mode `none` or `poll` is not waited for
(members in explicit control still are); after Redis lost its data, a reseed by a replica that
lacks a model's folder takes the model from no replica that serves it; and that replica says
why it does not serve it, in its index, its model ready route and a load sent to it."""

import asyncio
import os
import signal
import time
from pathlib import Path

import httpx
import pytest
import redis as redis_py
from tritonclient.utils import InferenceServerException

from service.cluster.desired_state import DesiredState, Spec
from service.cluster.store import ClusterStore
from tests.cluster.redis_server import RedisServer
from tests.cluster.replicas import replica as plain_replica
from tests.cluster.repository_cluster import example_repository, grpc, http, replica

NO_FOLDER = "no such model folder"


def _until(check: object, timeout: float = 15) -> None:
    deadline = time.monotonic() + timeout
    while not check():  # type: ignore[operator]
        assert time.monotonic() < deadline, "not within the time"
        time.sleep(0.05)


def _member(url: str, pid: int) -> dict[str, str]:
    """The registration of the member whose process is `pid`, read from Redis directly."""
    with redis_py.Redis.from_url(url, decode_responses=True) as direct:
        for key in direct.scan_iter(match="opserve:*:member:*"):
            if f"%3A{pid}%3A" in key:  # the member id host:pid:token, quoted in the key
                return direct.hgetall(key)
    return {}


def _desired(url: str) -> dict[str, str]:
    with redis_py.Redis.from_url(url, decode_responses=True) as direct:
        keys = list(direct.scan_iter(match="opserve:*:repo:models"))
        return direct.hgetall(keys[0]) if keys else {}


@pytest.mark.slow  # replica processes started one after another
@pytest.mark.parametrize("mode", ["none", "poll"])
def test_a_member_outside_explicit_control_is_not_waited_for(redis: RedisServer, tmp_path: Path,
                                                             mode: str) -> None:  # fmt: skip
    root = example_repository(tmp_path)
    # a deadline the load would meet only by failing (503) if the other member were waited for
    quick = {"cluster_apply_seconds": "5"}
    with (replica(redis.url, root, **quick) as first, replica(redis.url, root, **quick) as second,
          plain_replica(redis.url, model_repository=str(root), model_control_mode=mode,
                        reference_fallback="true") as other):  # fmt: skip
        on_first, on_second = http(first), http(second)
        on_first.load_model("simple")  # 200: the member in mode `mode` is not waited for
        assert on_second.is_model_ready("simple")  # the explicit member was, before the answer
        on_first.unload_model("simple")
        assert not on_second.is_model_ready("simple")
        assert _member(redis.url, other.process.pid)["repository_control"] == "0"
        assert _member(redis.url, first.process.pid)["repository_control"] == "1"
        on_first.close()
        on_second.close()


@pytest.mark.slow  # replica processes started one after another
def test_a_reseed_by_a_replica_without_the_folder_keeps_the_model(redis: RedisServer,
                                                                  tmp_path: Path) -> None:  # fmt: skip
    full = example_repository(tmp_path / "full")
    partial = example_repository(tmp_path / "partial", ["simple_int8"])  # no `simple` folder
    with replica(redis.url, full) as first:
        on_first = http(first)
        on_first.load_model("simple", config='{"max_batch_size": 16}')
        os.kill(first.process.pid, signal.SIGSTOP)  # so the replica without the folder reseeds
        try:
            with redis_py.Redis.from_url(redis.url) as direct:
                direct.flushall()  # as a Redis without persistence restarted
            with replica(redis.url, partial) as second:  # the record is made anew from it
                assert set(_desired(redis.url)) == {"simple_int8"}
                os.kill(first.process.pid, signal.SIGCONT)
                # the first replica adds back what it serves, and keeps serving it throughout
                until = time.monotonic() + 30 * 0.2  # 30 heartbeats
                while time.monotonic() < until:
                    assert on_first.is_model_ready("simple")
                    time.sleep(0.05)
                assert "simple" in _desired(redis.url)
                assert on_first.get_model_config("simple")["max_batch_size"] == 16
                _says_why(second)
                assert on_first.is_model_ready("simple")  # the failed load took nothing away
        finally:
            os.kill(first.process.pid, signal.SIGCONT)
        on_first.close()


def _says_why(server: object) -> None:
    """The replica without the folder says why it does not serve `simple`: index, ready route
    (HTTP 400 with the reason; gRPC not ready), and the answer to a load sent to it."""
    client, control = http(server), grpc(server)  # type: ignore[arg-type]
    _until(lambda: any(row.get("state") == "UNAVAILABLE" and NO_FOLDER in row.get("reason", "")
                       for row in client.get_model_repository_index()
                       if row["name"] == "simple"))  # fmt: skip
    answer = httpx.get(f"{server.url}/v2/models/simple/ready")  # type: ignore[attr-defined]
    assert answer.status_code == 400, answer.text
    assert answer.json()["ready"] is False
    assert "failed on this replica" in answer.json()["error"] and NO_FOLDER in answer.text
    assert not control.is_model_ready("simple")
    answer = httpx.get(f"{server.url}/v2/models/nothing_at_all/ready")  # type: ignore[attr-defined]
    assert answer.status_code != 200 and "failed on this replica" not in answer.text
    with pytest.raises(InferenceServerException) as refused:
        client.load_model("simple")
    text = refused.value.message()
    assert "the load failed on this replica (" in text and f":{server.process.pid}:" in text  # type: ignore[attr-defined]
    assert "desired state is unchanged" in text and NO_FOLDER in text
    client.close()
    control.close()


@pytest.mark.slow  # replica processes started one after another
def test_the_replica_that_reseeds_adds_back_a_model_it_failed(redis: RedisServer,
                                                              tmp_path: Path) -> None:  # fmt: skip
    full = example_repository(tmp_path / "full")
    partial = example_repository(tmp_path / "partial", ["simple_int8"])
    with replica(redis.url, full) as first, replica(redis.url, partial) as second:
        on_first = http(first)
        with pytest.raises(InferenceServerException):
            on_first.load_model("simple")  # failed on the second: desired all the same
        os.kill(first.process.pid, signal.SIGSTOP)
        try:
            with redis_py.Redis.from_url(redis.url) as direct:
                direct.flushall()
            _until(lambda: "simple" in _desired(redis.url))  # the second reseeds, and keeps it
        finally:
            os.kill(first.process.pid, signal.SIGCONT)
        until = time.monotonic() + 30 * 0.2
        while time.monotonic() < until:
            assert on_first.is_model_ready("simple")
            time.sleep(0.05)
        _says_why(second)
        on_first.close()


def test_a_merge_adds_only_what_the_record_lacks_within_its_window(redis: RedisServer) -> None:
    async def scenario() -> None:
        store = ClusterStore(redis.url, "test", 1.0)
        state = DesiredState(store, merge_seconds=1.0)
        await state.seed({"seeded": Spec('{"a": 1}')})
        epoch = (await state.read()).epoch  # type: ignore[union-attr]
        await state.write(epoch, "unloaded", None)  # removed within the window
        offered = {"seeded": Spec('{"a": 2}'), "kept": Spec('{"b": 1}'), "unloaded": Spec()}
        assert await state.merge(epoch, offered) == 1
        snapshot = await state.read()
        assert snapshot is not None and set(snapshot.models) == {"seeded", "kept"}
        assert snapshot.models["seeded"].config == '{"a": 1}'  # the record's stands
        assert snapshot.models["kept"].stamp == snapshot.generation == 3
        assert await state.merge("another epoch", {"other": Spec()}) == 0
        await state.write(epoch, "later", Spec())
        await state.write(epoch, "later", None)
        await asyncio.sleep(1.2)  # the window closed: nothing is added back any more
        assert await state.merge(epoch, {"other": Spec(), "later": Spec()}) == 0
        assert set((await state.read()).models) == {"seeded", "kept"}  # type: ignore[union-attr]
        assert not await store.redis.exists(state.keys[4])  # the window's unloads expired
        await store.close()

    asyncio.run(scenario())
