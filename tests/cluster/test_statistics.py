"""Statistics of a cluster (service/cluster/statistics.py), with a real redis-server and real
opserve processes: the stats call through any replica, HTTP or gRPC, answers the sum over the
live replicas, exactly; a replica killed leaves the sum once its heartbeat runs out; a member's
totals lost in Redis are written again whole; Redis away is 503 / UNAVAILABLE with the store's
text while inference and /metrics go on, and everything is back when it returns. Each test
counts on an operator version of its own, so the module's replicas are shared."""

import asyncio
import json
import time
import urllib.error
import urllib.request
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest
import redis as redis_py
import tritonclient.grpc as triton_grpc
import tritonclient.http as triton_http
from tritonclient.utils import InferenceServerException

from service.cluster.cluster import Cluster
from service.settings import Settings
from tests.cluster.redis_server import RedisServer, redis_server
from tests.cluster.replicas import Replica, replica, replicas

FLUSH = 0.1  # seconds between two writes of a replica's totals (OPSERVE_CLUSTER_STATISTICS_SECONDS)
SETTINGS = {"cluster_statistics_seconds": str(FLUSH), "cluster_timeout_seconds": "2"}
TILE = {"inputs": [{"name": "input", "shape": [2], "datatype": "INT64", "data": [1, 2]},
                   {"name": "repeats", "shape": [1], "datatype": "INT64", "data": [2]}]}  # fmt: skip
BAD_TILE = {"inputs": [{"name": "input", "shape": [2], "datatype": "INT64", "data": [1, 2]},
                       {"name": "repeats", "shape": [1], "datatype": "INT64", "data": [-1]}]}  # fmt: skip
PHASES = ("queue", "compute_input", "compute_infer", "compute_output")


@pytest.fixture(scope="module")
def redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    with redis_server(tmp_path_factory.mktemp("redis")) as server:
        yield server


@pytest.fixture(scope="module")
def pair(redis: RedisServer) -> Iterator[list[Replica]]:
    with replicas(2, redis.url, **SETTINGS) as started:
        yield started


def _post(server: Replica, path: str, body: dict[str, Any]) -> int:
    request = urllib.request.Request(f"{server.url}{path}", json.dumps(body).encode(),
                                     {"Content-Type": "application/json"})  # fmt: skip
    try:
        with urllib.request.urlopen(request, timeout=5) as answer:
            return int(answer.status)
    except urllib.error.HTTPError as refused:
        return refused.code


def _stats(server: Replica, model: str, version: str) -> dict[str, Any]:
    url = f"{server.url}/v2/models/{model}/versions/{version}/stats"
    with urllib.request.urlopen(url, timeout=5) as answer:
        (found,) = json.load(answer)["model_stats"]
    return found  # type: ignore[no-any-return]


def _until(check: Callable[[], bool], within: float = 5.0) -> None:
    deadline = time.monotonic() + within
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"not so within {within} s")
        time.sleep(0.05)


def _grpc(server: Replica) -> triton_grpc.InferenceServerClient:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return triton_grpc.InferenceServerClient(server.grpc_target)


def _grpc_tile(client: triton_grpc.InferenceServerClient, version: str) -> None:
    inputs = [triton_grpc.InferInput("input", [2], "INT64"),
              triton_grpc.InferInput("repeats", [1], "INT64")]  # fmt: skip
    inputs[0].set_data_from_numpy(np.array([1, 2]))
    inputs[1].set_data_from_numpy(np.array([2]))
    assert client.infer("Tile", inputs, model_version=version).as_numpy("output").tolist() == [
        1, 2, 1, 2]  # fmt: skip


def test_stats_through_either_replica_answer_the_sum_exactly(pair: list[Replica]) -> None:
    first, second = pair
    began = time.time_ns() // 1_000_000
    for _ in range(3):
        assert _post(first, "/v2/models/Tile/versions/13/infer", TILE) == 200
    for _ in range(2):
        assert _post(first, "/v2/models/Tile/versions/13/infer", BAD_TILE) == 400
    for _ in range(2):
        assert _post(second, "/v2/models/Tile/versions/13/infer", TILE) == 200
    client = _grpc(second)
    for _ in range(2):
        _grpc_tile(client, "13")
    client.close()
    _until(lambda: _stats(first, "Tile", "13")["execution_count"] == 7)
    time.sleep(4 * FLUSH)  # more writes of the same totals: nothing counted twice
    for server in pair:
        stats = _stats(server, "Tile", "13")
        assert (stats["inference_count"], stats["execution_count"]) == (7, 7)
        counts = stats["inference_stats"]
        assert (counts["success"]["count"], counts["fail"]["count"]) == (7, 2)
        for phase in PHASES:
            assert counts[phase]["count"] == 7, phase
        assert counts["success"]["ns"] >= counts["compute_infer"]["ns"] > 0
        ((batch),) = stats["batch_stats"]
        assert (batch["batch_size"], batch["compute_infer"]["count"]) == (1, 7)
        assert began <= stats["last_inference"] <= time.time_ns() // 1_000_000


def test_tritonclient_reads_the_sum_over_http_and_grpc(pair: list[Replica]) -> None:
    first = pair[0]
    for server in pair:
        for _ in range(2):
            assert _post(server, "/v2/models/Tile/versions/6/infer", TILE) == 200
    for server in pair:  # each sees its own counts at once, the other's after its next write
        _until(lambda s=server: _stats(s, "Tile", "6")["execution_count"] == 4)  # type: ignore[misc]
    http = triton_http.InferenceServerClient(f"127.0.0.1:{first.port}")
    (answer,) = http.get_inference_statistics("Tile", "6")["model_stats"]
    assert answer["inference_count"] == 4 and answer["inference_stats"]["success"]["count"] == 4
    http.close()
    client = _grpc(first)
    (message,) = client.get_inference_statistics("Tile", "6").model_stats
    assert (message.inference_count, message.inference_stats.queue.count) == (4, 4)
    everything = client.get_inference_statistics().model_stats
    assert {(s.name, s.version): s.execution_count for s in everything}[("Tile", "6")] == 4
    client.close()


def test_a_killed_replica_leaves_the_sum_once_its_heartbeat_runs_out(
    pair: list[Replica], redis: RedisServer
) -> None:
    first, _ = pair
    with replica(redis.url, **SETTINGS) as doomed:
        for _ in range(5):
            assert _post(doomed, "/v2/models/Shape/versions/15/infer", _shape()) == 200
        assert _post(first, "/v2/models/Shape/versions/15/infer", _shape()) == 200
        _until(lambda: _stats(first, "Shape", "15")["execution_count"] == 6)
        doomed.process.kill()  # SIGKILL: no goodbye, its registration runs out (3 x 0.2 s)
        doomed.process.wait()
        _until(lambda: _stats(first, "Shape", "15")["execution_count"] == 1, within=3)


def test_totals_lost_by_redis_are_written_again_whole(
    pair: list[Replica], redis: RedisServer
) -> None:
    first, second = pair
    for server in pair:
        assert _post(server, "/v2/models/Shape/versions/13/infer", _shape()) == 200
    _until(lambda: _stats(first, "Shape", "13")["execution_count"] == 2)
    redis_py.Redis(port=redis.port).flushall()  # as a Redis restarted without persistence
    # nothing new counted: each replica writes every version again once it finds its hash gone
    _until(lambda: _stats(first, "Shape", "13")["execution_count"] == 2)
    _until(lambda: _stats(second, "Shape", "13")["execution_count"] == 2)


def test_redis_away_stats_503_inference_and_metrics_go_on(
    pair: list[Replica], redis: RedisServer
) -> None:
    first, second = pair
    redis.stop()
    try:
        began = time.monotonic()
        with pytest.raises(urllib.error.HTTPError) as refused:
            _stats(first, "Shape", "1")
        assert time.monotonic() - began < 3
        assert refused.value.code == 503 and refused.value.headers["Retry-After"] == "1"
        assert "cluster store (Redis) is unreachable" in refused.value.read().decode()
        client = _grpc(second)
        with pytest.raises(InferenceServerException, match=r"UNAVAILABLE.*cluster store"):
            client.get_inference_statistics("Shape", "1")
        for server in pair:  # stateless inference and each replica's /metrics do not need Redis
            assert _post(server, "/v2/models/Shape/versions/1/infer", _shape()) == 200
            with urllib.request.urlopen(f"{server.url}/metrics", timeout=5) as metrics:
                assert b'model="Shape"' in metrics.read()
        _grpc_shape(client, "21")
    finally:
        redis.start()
    _until(lambda: _stats(second, "Shape", "1")["execution_count"] == 2)  # counted while away
    (message,) = client.get_inference_statistics("Shape", "21").model_stats
    assert message.execution_count == 1
    client.close()


def test_unreadable_totals_of_a_member_are_left_out(
    pair: list[Replica], redis: RedisServer
) -> None:
    """A value under our prefix that is not a replica's totals adds nothing, and is no 500."""
    first, _ = pair
    for version in ("23", "24"):
        assert _post(first, f"/v2/models/Shape/versions/{version}/infer", _shape()) == 200
        _until(lambda v=version: _stats(first, "Shape", v)["execution_count"] == 1)  # type: ignore[misc]

    async def scenario() -> None:
        settings = Settings(cluster_redis_url=redis.url, cluster_heartbeat_seconds=0.2)  # type: ignore[arg-type]
        stranger = Cluster(settings)
        await stranger.start()  # a live member whose totals are not ours to read
        key = stranger.store.key("stats", stranger.members.id)
        good = {"last": 1, "inferences": 1, "executions": 1, "success": [1, 1], "fail": [0, 0],
                **{phase: [1, 1] for phase in PHASES}, "batches": {"1": [1, 1, 1, 1]}}  # fmt: skip
        await stranger.store.redis.hset(key, mapping={
            "Shape:23": json.dumps({**good, "success": [1, -5]}),  # a negative count
            "Shape:24": json.dumps(good)})  # fmt: skip
        await asyncio.to_thread(_check)
        await stranger.stop()

    def _check() -> None:
        assert _stats(first, "Shape", "23")["execution_count"] == 1  # left out whole
        assert _stats(first, "Shape", "24")["execution_count"] == 2  # a readable one counts

    asyncio.run(scenario())


def _grpc_shape(client: triton_grpc.InferenceServerClient, version: str) -> None:
    data = triton_grpc.InferInput("data", [2, 3], "FP32")
    data.set_data_from_numpy(np.zeros((2, 3), np.float32))
    assert client.infer("Shape", [data], model_version=version).as_numpy("shape").tolist() == [2, 3]


def _shape() -> dict[str, Any]:
    return {"inputs": [{"name": "data", "shape": [2, 3], "datatype": "FP32", "data": [0.0] * 6}]}
