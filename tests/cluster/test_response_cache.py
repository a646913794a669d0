"""The cluster's response cache (service/cluster/response_cache.py) with a real redis-server and
two real replicas: a request answered on replica A is a hit on replica B; entries expire and
stay within OPSERVE_RESPONSE_CACHE_BYTES together; with Redis stopped every request still
answers (uncached), and the cache works again once it is back."""

import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import redis as redis_py

from tests.cluster.redis_server import RedisServer, redis_server
from tests.cluster.replicas import Replica, replicas
from tests.v2.test_response_cache import _counts, _graph, _http, _infer

FLUSH = 0.1  # OPSERVE_CLUSTER_STATISTICS_SECONDS
CAP = 4096  # OPSERVE_RESPONSE_CACHE_BYTES: the shared cache's whole size
SECONDS = 30  # OPSERVE_RESPONSE_CACHE_SECONDS


@pytest.fixture(scope="module")
def redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    with redis_server(tmp_path_factory.mktemp("redis")) as server:
        yield server


@pytest.fixture(scope="module")
def pair(redis: RedisServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[Replica]]:
    root: Path = tmp_path_factory.mktemp("models")
    (root / "cached" / "1").mkdir(parents=True)
    (root / "cached" / "1" / "model.onnx").write_bytes(_graph("Transpose"))
    (root / "cached" / "config.pbtxt").write_text(
        'name: "cached"\nmax_batch_size: 0\nresponse_cache { enable: true }')  # fmt: skip
    with replicas(2, redis.url, model_repository=str(root), response_cache_bytes=str(CAP),
                  response_cache_seconds=str(SECONDS), cluster_statistics_seconds=str(FLUSH),
                  cluster_timeout_seconds="0.5") as started:  # fmt: skip
        yield started


def _cluster_counts(server: Replica) -> dict[str, int]:
    time.sleep(4 * FLUSH)  # every replica's totals written
    return _counts(_http(server).get_inference_statistics("cached"))


def _entries(redis: RedisServer) -> list[bytes]:
    with redis_py.Redis.from_url(redis.url) as client:
        return list(client.scan_iter("opserve:opserve:cache:*"))


def test_a_hit_on_b_for_a_request_answered_on_a(pair: list[Replica], redis: RedisServer) -> None:
    a, b = pair
    before = _cluster_counts(a)
    x = np.arange(12, dtype=np.float32).reshape(3, 4) - 2.5
    np.testing.assert_array_equal(_infer(_http(a), "cached", x), x.T)  # miss on A
    np.testing.assert_array_equal(_infer(_http(b), "cached", x), x.T)  # hit on B
    np.testing.assert_array_equal(_infer(_http(b), "cached", x, binary=False), x.T)  # hit, JSON
    after = _cluster_counts(b)
    delta = {k: after[k] - before[k] for k in after}
    assert delta == {"success": 3, "fail": 0, "cache_hit": 2, "cache_miss": 1,
                     "compute_infer": 1, "executions": 1}  # fmt: skip
    with redis_py.Redis.from_url(redis.url) as client:
        ttls = [client.pttl(key) for key in _entries(redis)]
    assert ttls and all(0 < ttl <= SECONDS * 1000 for ttl in ttls)  # every entry expires


def test_entries_stay_within_the_cap(pair: list[Replica], redis: RedisServer) -> None:
    a, b = pair
    client = _http(a)
    rows = [np.full((4, 16), i, np.float32) for i in range(30)]  # 256 bytes of data each
    for row in rows:
        _infer(client, "cached", row)
    with redis_py.Redis.from_url(redis.url) as store:
        sizes = [store.strlen(key) for key in _entries(redis)]
        total = int(store.get("opserve:opserve:cache-total") or 0)
    assert sum(sizes) == total <= CAP
    assert 0 < len(sizes) < len(rows)  # the oldest dropped
    before = _cluster_counts(b)
    np.testing.assert_array_equal(_infer(_http(b), "cached", rows[-1]), rows[-1].T)
    assert _cluster_counts(b)["cache_hit"] == before["cache_hit"] + 1  # the newest is kept


def test_redis_away_means_uncached_not_failed(pair: list[Replica], redis: RedisServer) -> None:
    a, b = pair
    x = np.linspace(0, 1, 6, dtype=np.float32).reshape(2, 3)
    redis.stop()
    try:
        for server in (a, b, a):
            np.testing.assert_array_equal(_infer(_http(server), "cached", x), x.T)
    finally:
        redis.start()
    _wait_for_store(a)
    y = x + 7
    np.testing.assert_array_equal(_infer(_http(a), "cached", y), y.T)
    before = _cluster_counts(b)
    np.testing.assert_array_equal(_infer(_http(b), "cached", y), y.T)
    assert _cluster_counts(b)["cache_hit"] == before["cache_hit"] + 1  # cached again


def _wait_for_store(server: Replica) -> None:
    """Until the stats call (which needs Redis) answers again and the cache's pause is over."""
    deadline = time.monotonic() + 20
    while True:
        try:
            _counts(_http(server).get_inference_statistics("cached"))
            time.sleep(1.2)  # AWAY_SECONDS
            return
        except Exception as exc:  # 503 while the replica reconnects
            if time.monotonic() > deadline:
                raise AssertionError("the cluster store did not come back") from exc
            time.sleep(0.2)
