"""Repository control across replicas when something is wrong (issue 26, items 3 and 5): a
replica that cannot apply a load, or does not answer in time, is named in the error (503 /
UNAVAILABLE) while the model stays desired; with Redis stopped a load or unload answers 503
with the store's text and Retry-After, loaded models keep serving, and control resumes by
itself once Redis is back."""

import os
import signal
import time
from pathlib import Path
from urllib.parse import quote

import httpx
import numpy as np
import pytest
import redis as redis_py
from tritonclient.utils import InferenceServerException

from tests.cluster.redis_server import RedisServer
from tests.cluster.repository_cluster import example_repository, grpc, http, infer_pair, replica


def _until(check: object, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while not check():  # type: ignore[operator]
        assert time.monotonic() < deadline, "not within the time"
        time.sleep(0.05)


def _shown_as(url: str) -> dict[int, str]:
    """Each live member's name in a client's text, by its PID (member ids end in a random part)."""
    with redis_py.Redis.from_url(url) as direct:
        ids = [m.decode() for m in direct.zrange("opserve:opserve:members", 0, -1)]
        return {int(direct.hget(f"opserve:opserve:member:{quote(m, safe='')}", "pid")):
                f"replica {m.rpartition(':')[2]}" for m in ids}  # fmt: skip


def test_a_replica_that_cannot_apply_a_load_is_named(redis: RedisServer, tmp_path: Path) -> None:
    full = example_repository(tmp_path / "full")
    partial = example_repository(tmp_path / "partial", ["simple_int8"])  # no `simple` folder
    with replica(redis.url, full) as first, replica(redis.url, partial) as second:
        on_first, on_second = http(first), http(second)
        with pytest.raises(InferenceServerException) as refused:
            on_first.load_model("simple")
        text = refused.value.message()
        assert refused.value.status() == "503"
        named = _shown_as(redis.url)  # the replica as a client reads it: no host name, no PID
        assert named[second.process.pid] in text and named[first.process.pid] not in text
        assert f":{second.process.pid}:" not in text
        assert "failed: failed to load 'simple'" in text and "no such model folder" in text
        assert on_first.is_model_ready("simple")  # applied where it could be: it stays desired
        assert {"name": "simple", "state": "UNAVAILABLE",
                "reason": "failed on this replica: failed to load 'simple', failed to poll from "
                          "model repository: no such model folder"} in (
            on_second.get_model_repository_index())  # fmt: skip
        on_first.unload_model("simple")  # an unload never fails for want of a folder
        assert on_second.get_model_repository_index() == [
            {"name": "simple_int8", "version": "1", "state": "READY"}]  # fmt: skip
        on_first.close()
        on_second.close()


def test_a_replica_that_does_not_answer_in_time_is_named(redis: RedisServer,
                                                         tmp_path: Path) -> None:  # fmt: skip
    root = example_repository(tmp_path)
    # heartbeats of 1 s: a stopped replica stays live for 3 s, longer than the 1 s deadline
    slow = {"cluster_heartbeat_seconds": "1", "cluster_apply_seconds": "1"}
    with replica(redis.url, root, **slow) as first, replica(redis.url, root,
                                                                       **slow) as second:  # fmt: skip
        control, on_second = grpc(first), http(second)
        os.kill(second.process.pid, signal.SIGSTOP)
        try:
            with pytest.raises(InferenceServerException) as refused:
                control.load_model("simple")
        finally:
            os.kill(second.process.pid, signal.SIGCONT)
        assert refused.value.status() == "StatusCode.UNAVAILABLE"
        # the replica named by its random part, never its host name and PID (issue 32)
        assert f":{second.process.pid}:" not in refused.value.message()
        assert "replica " in refused.value.message()
        assert "did not apply it within 1 s (OPSERVE_CLUSTER_APPLY_SECONDS" in (
            refused.value.message())  # fmt: skip
        _until(lambda: on_second.is_model_ready("simple"))  # desired: applied once it runs
        control.close()
        on_second.close()


def test_control_with_redis_away_is_503_and_serving_goes_on(redis: RedisServer,
                                                            tmp_path: Path) -> None:  # fmt: skip
    root = example_repository(tmp_path)
    with replica(redis.url, root) as first, replica(redis.url, root) as second:
        redis.stop()
        for action in ("load", "unload"):
            answer = httpx.post(f"{first.url}/v2/repository/models/simple/{action}", json={})
            assert answer.status_code == 503, answer.text
            assert "the cluster store (Redis) is unreachable" in answer.json()["error"]
            assert answer.headers["retry-after"] == "1"
        control = grpc(first)
        with pytest.raises(InferenceServerException) as refused:
            control.unload_model("simple_int8")
        assert refused.value.status() == "StatusCode.UNAVAILABLE"
        assert "the cluster store (Redis) is unreachable" in refused.value.message()
        for server in (first, second):  # nothing changed, and loaded models serve
            client = http(server)
            assert not client.is_model_ready("simple")
            expected = np.arange(1, 17, dtype=np.int8)[None]
            assert np.array_equal(infer_pair(client, "simple_int8", "INT8"), expected)
            client.close()
        redis.start()
        _until(lambda: _loads(first))  # the pool reconnects by itself
        on_second = http(second)
        assert on_second.is_model_ready("simple")
        on_second.unload_model("simple")
        assert not control.is_model_ready("simple")
        control.close()
        on_second.close()


def _loads(server: object) -> bool:
    answer = httpx.post(f"{server.url}/v2/repository/models/simple/load", json={})  # type: ignore[attr-defined]
    return answer.status_code == 200


def test_a_redis_that_lost_its_data_gets_the_record_back(redis: RedisServer,
                                                         tmp_path: Path) -> None:  # fmt: skip
    root = example_repository(tmp_path)
    model = (root / "simple" / "1" / "model.onnx").read_bytes()
    with replica(redis.url, root) as first, replica(redis.url, root) as second:
        on_first, on_second = http(first), http(second)
        on_first.load_model("simple", config='{"max_batch_size": 16}')
        on_first.load_model("sent_whole", config='{"name": "sent_whole"}',
                            files={"file:1/model.onnx": model})  # fmt: skip
        with redis_py.Redis.from_url(redis.url) as direct:
            direct.flushall()  # as a Redis without persistence restarted
        # made again from what the replicas serve from folders; the file lived in Redis only
        _until(lambda: not on_second.is_model_ready("sent_whole"))
        assert not on_first.is_model_ready("sent_whole")
        assert on_second.get_model_config("simple")["max_batch_size"] == 16
        assert on_first.is_model_ready("simple_int8") and on_second.is_model_ready("simple_int8")
        on_second.unload_model("simple")  # and control goes on with the new record
        assert not on_first.is_model_ready("simple")
        on_first.close()
        on_second.close()


@pytest.mark.parametrize("value", ["not json", '{"config": null}', '{"files": "x"}', "[1]"])
def test_a_model_whose_entry_is_no_spec_is_mended_by_a_load(redis: RedisServer, tmp_path: Path,
                                                             value: str) -> None:  # fmt: skip
    root = example_repository(tmp_path)
    with replica(redis.url, root) as first, replica(redis.url, root) as second:
        on_first, on_second = http(first), http(second)
        with redis_py.Redis.from_url(redis.url) as direct:  # written by hand, or by a bug
            direct.hset("opserve:opserve:repo:models", "simple", value)
        on_first.load_model("simple")  # what a failure's text says to do (NotApplied)
        assert on_second.is_model_ready("simple")
        on_second.unload_model("simple")
        assert not on_first.is_model_ready("simple")
        on_first.close()
        on_second.close()


def test_with_redis_away_the_cluster_index_shows_sequence_models_unavailable(
    redis: RedisServer, tmp_path: Path
) -> None:
    """Both cluster pieces at once: explicit control (the cluster's index) and sequences kept
    in Redis; with Redis stopped the sequence model is UNAVAILABLE in the index as its ready
    route says, the stateless one stays READY, and both come back."""
    root = example_repository(tmp_path / "models", ["simple_int8", "simple_sequence"])
    with replica(redis.url, root, load_models="simple_int8,simple_sequence") as server:
        client = http(server)

        def states() -> dict[str, str]:
            return {row["name"]: row["state"] for row in client.get_model_repository_index()}

        assert states() == {"simple_int8": "READY", "simple_sequence": "READY"}
        redis.stop()
        try:
            _until(lambda: not client.is_model_ready("simple_sequence"))
            assert states() == {"simple_int8": "READY", "simple_sequence": "UNAVAILABLE"}
        finally:
            redis.start()
        _until(lambda: states() == {"simple_int8": "READY", "simple_sequence": "READY"})
        client.close()
