"""Redis bounded per cluster (issue 32, item 2): two real replicas on a real redis-server with a
`maxmemory` and `noeviction`, as docs/deployment.md advises. Live sequences are counted in Redis
against OPSERVE_MAX_SEQUENCES and their state bytes against the cluster's bound, refused with
503 and Retry-After before Redis fills; a Redis that is full anyway refuses only the calls that
write (in plain words, never Redis's own text); an idle time near 2^64 us is capped; an unloaded
model's sequence keys leave the store."""

import time
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

import httpx
import numpy as np
import onnx
import pytest
import redis as redis_py
from onnx import TensorProto, helper, numpy_helper

from tests.cluster.redis_server import RedisServer, redis_server
from tests.cluster.replicas import Replica
from tests.cluster.repository_cluster import example_repository, replica
from tests.cluster.sequence_models import _history
from tests.triton_examples import write_repository

MAX_SEQUENCES = 8
BUDGET, SHARE = 16 << 20, 0.25
STATE_BYTES_BOUND = int(BUDGET * SHARE)  # the cluster's sequences' state, in Redis
BIG_ELEMENTS = 200_000  # int32: 800,000 bytes of state per big sequence
MAX_IDLE_SECONDS = 60
# what a client must never read: Redis's own words, its address, scripts and keys
INTERNALS = ("OOM command", "script", "user_script", "maxmemory'", "127.0.0.1", "opserve:opserve",
             "EVALSHA", "Error ")  # fmt: skip


def _big() -> onnx.ModelProto:
    """STATE_OUT: BIG_ELEMENTS copies of INPUT; OUTPUT: how many elements the state held."""
    zeros = numpy_helper.from_array(np.zeros(BIG_ELEMENTS, np.int32), "zeros")
    nodes = [helper.make_node("Add", ["zeros", "INPUT"], ["STATE_OUT"]),
             helper.make_node("Shape", ["STATE_IN"], ["OUTPUT"])]  # fmt: skip
    graph = helper.make_graph(
        nodes, "big",
        [helper.make_tensor_value_info("INPUT", TensorProto.INT32, [1]),
         helper.make_tensor_value_info("STATE_IN", TensorProto.INT32, [None])],
        [helper.make_tensor_value_info("OUTPUT", TensorProto.INT64, [1]),
         helper.make_tensor_value_info("STATE_OUT", TensorProto.INT32, [None])], [zeros])  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)


def _config(name: str, idle_us: int, state: str, output: str, dims: int = -1) -> str:
    return (f'name: "{name}"\nmax_batch_size: 0\nsequence_batching {{\n'
            f"  max_sequence_idle_microseconds: {idle_us}\n"
            "  oldest { max_candidate_sequences: 100 }\n"
            f'  state [ {{ input_name: "{state}_IN" output_name: "{state}_OUT" '
            "data_type: TYPE_INT32 dims: [ -1 ] } ]\n}\n"
            'input [ { name: "INPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]\n'
            f'output [ {{ name: "OUTPUT" data_type: {output} dims: [ {dims} ] }} ]\n'
            "instance_group [ { count: 1 kind: KIND_CPU } ]\n")  # fmt: skip


def _repository(root: Path) -> Path:
    example_repository(root)
    write_repository(root, ["simple"])
    models = {"counter": (_history(), _config("counter", 60_000_000, "HIST", "TYPE_INT32")),
              "big": (_big(), _config("big", 60_000_000, "STATE", "TYPE_INT64", 1)),
              "forever": (_history(), _config("forever", 18446744073709551000, "HIST",
                                              "TYPE_INT32"))}  # fmt: skip
    for name, (model, config) in models.items():
        (root / name / "1").mkdir(parents=True)
        onnx.save(model, root / name / "1" / "model.onnx")
        (root / name / "config.pbtxt").write_text(config)
    return root


@dataclass
class Cluster:
    redis: RedisServer
    replicas: list[Replica]

    def direct(self) -> redis_py.Redis:
        return redis_py.Redis.from_url(self.redis.url)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    root = _repository(tmp_path_factory.mktemp("models"))
    settings = {"load_models": "simple,counter,big,forever", "max_sequences": str(MAX_SEQUENCES),
                "memory_budget_bytes": str(BUDGET), "sequence_state_share": str(SHARE),
                "cluster_sequence_max_idle_seconds": str(MAX_IDLE_SECONDS),
                "cluster_timeout_seconds": "2"}  # fmt: skip
    with ExitStack() as stack:
        redis = stack.enter_context(redis_server(tmp_path_factory.mktemp("redis")))
        with redis_py.Redis.from_url(redis.url) as direct:
            direct.config_set("maxmemory-policy", "noeviction")
            used = int(direct.info("memory")["used_memory"])
            direct.config_set("maxmemory", used + (24 << 20))
        replicas = [stack.enter_context(replica(redis.url, root, **settings)) for _ in range(2)]
        yield Cluster(redis, replicas)


def _step(server: Replica, model: str, seq_id: int, value: int, *, start: bool = False,
          end: bool = False) -> httpx.Response:  # fmt: skip
    body = {"inputs": [{"name": "INPUT", "shape": [1], "datatype": "INT32", "data": [value]}],
            "parameters": {"sequence_id": seq_id, "sequence_start": start,
                           "sequence_end": end}}  # fmt: skip
    return httpx.post(f"http://127.0.0.1:{server.port}/v2/models/{model}/infer", json=body,
                      timeout=30)  # fmt: skip


def _stateless(server: Replica) -> httpx.Response:
    inputs = [{"name": name, "shape": [1, 16], "datatype": "INT32", "data": [1] * 16}
              for name in ("INPUT0", "INPUT1")]  # fmt: skip
    return httpx.post(f"http://127.0.0.1:{server.port}/v2/models/simple/infer",
                      json={"inputs": inputs}, timeout=30)  # fmt: skip


def _plain(answer: httpx.Response) -> str:
    text = answer.json()["error"]
    assert not [word for word in INTERNALS if word in text], text
    return text


def test_live_sequences_are_counted_cluster_wide(cluster: Cluster) -> None:
    first, second = cluster.replicas
    for seq_id in range(1, MAX_SEQUENCES + 1):  # each replica alone would take 6 of its own
        answer = _step(cluster.replicas[seq_id % 2], "counter", seq_id, seq_id, start=True)
        assert answer.status_code == 200, answer.text
    for server in (first, second):
        refused = _step(server, "counter", 100, 1, start=True)
        assert refused.status_code == 503
        assert 1 <= int(refused.headers["retry-after"]) <= 60
        text = _plain(refused)
        assert f"{MAX_SEQUENCES} sequences are live in the cluster" in text
        assert "OPSERVE_MAX_SEQUENCES" in text
    assert _stateless(second).status_code == 200
    # a live sequence goes on; one ended makes room
    assert _step(second, "counter", 1, 7).json()["outputs"][0]["data"] == [0, 1, 7]
    assert _step(first, "counter", 2, 8, end=True).status_code == 200
    assert _step(second, "counter", 100, 1, start=True).status_code == 200
    for seq_id in (1, *range(3, MAX_SEQUENCES + 1), 100):
        assert _step(first, "counter", seq_id, 0, end=True).status_code == 200
    with cluster.direct() as direct:
        assert direct.zcard("opserve:opserve:seqall") == 0


def _used(direct: redis_py.Redis) -> tuple[int, int]:
    memory = direct.info("memory")
    return int(memory["used_memory"]), int(memory["maxmemory"])


def test_state_bytes_are_bounded_before_redis_fills(cluster: Cluster) -> None:
    first, second = cluster.replicas
    per_sequence = 4 * BIG_ELEMENTS  # its state (the framing adds a few bytes)
    fits = STATE_BYTES_BOUND // per_sequence  # 5: the sixth's write-back would pass the bound
    kept = []
    for seq_id in range(1, fits + 2):
        answer = _step(cluster.replicas[seq_id % 2], "big", seq_id, seq_id, start=True)
        if answer.status_code != 200:
            break
        assert answer.json()["outputs"][0]["data"] != [BIG_ELEMENTS]  # the initial state
        kept.append(seq_id)
    assert kept == list(range(1, fits + 1))
    assert answer.status_code == 503
    assert 1 <= int(answer.headers["retry-after"]) <= 60
    text = _plain(answer)
    assert "OPSERVE_SEQUENCE_STATE_SHARE" in text and "keeps its state" in text
    # a next step would keep its state and the one it read (for a resend): refused too,
    # and the sequence keeps its state from before
    grown = _step(second, "big", 1, 5)
    assert grown.status_code == 503 and "keeps its state" in _plain(grown)
    with cluster.direct() as direct:
        total = int(direct.hget("opserve:opserve:seqbytes", "#") or 0)
        assert fits * per_sequence <= total <= STATE_BYTES_BOUND
        used, most = _used(direct)
        assert used < most - (8 << 20)  # Redis is far from full: the bound held first
    # Redis refused nothing: the other models, stateless calls and state reads go on
    assert _step(first, "big", 2, 5, end=True).json()["outputs"][0]["data"] == [BIG_ELEMENTS]
    assert _step(first, "counter", 50, 3, start=True).status_code == 200
    assert _step(second, "counter", 50, 4, end=True).json()["outputs"][0]["data"] == [0, 3, 4]
    assert _stateless(first).status_code == 200
    assert httpx.get(f"http://127.0.0.1:{second.port}/v2/models/big/ready").status_code == 200


def test_an_unloaded_models_sequence_keys_leave_the_store(cluster: Cluster) -> None:
    first, second = cluster.replicas
    with cluster.direct() as direct:
        assert direct.keys("opserve:opserve:seq:big:*")  # the sequences the test above left
        unload = httpx.post(f"http://127.0.0.1:{second.port}/v2/repository/models/big/unload",
                            timeout=60)  # fmt: skip
        assert unload.status_code == 200, unload.text
        assert direct.keys("opserve:opserve:seq*:big:*") == []
        assert int(direct.hget("opserve:opserve:seqbytes", "#") or 0) < 100_000
        assert not [k for k in direct.zrange("opserve:opserve:seqall", 0, -1) if b":big:" in k]
    # the bytes are free again: a big sequence of a model loaded again fits
    load = httpx.post(f"http://127.0.0.1:{first.port}/v2/repository/models/big/load",
                      timeout=60)  # fmt: skip
    assert load.status_code == 200, load.text
    assert _step(first, "big", 1, 1, start=True).status_code == 200
    assert _step(second, "big", 1, 1, end=True).json()["outputs"][0]["data"] == [BIG_ELEMENTS]


def test_an_idle_time_near_2_64_us_is_capped(cluster: Cluster) -> None:
    first, second = cluster.replicas
    assert _step(first, "forever", 9, 1, start=True).status_code == 200
    lease_ms = 3000  # OPSERVE_CLUSTER_SEQUENCE_LEASE_SECONDS' default
    with cluster.direct() as direct:
        keys = direct.keys("opserve:opserve:seq*:forever:*")
        assert keys
        for key in keys:
            assert 0 < direct.pttl(key) <= MAX_IDLE_SECONDS * 1000 + lease_ms, key
        assert _step(second, "forever", 9, 2, end=True).json()["outputs"][0]["data"] == [0, 1, 2]
        for key in direct.keys("opserve:opserve:seq*:forever:*"):
            assert 0 < direct.pttl(key) <= MAX_IDLE_SECONDS * 1000 + lease_ms, key


def test_a_full_redis_refuses_only_the_calls_that_write(cluster: Cluster) -> None:
    first, second = cluster.replicas
    assert _step(first, "counter", 60, 1, start=True).status_code == 200
    with cluster.direct() as direct:
        room = _used(direct)[1]
        direct.config_set("maxmemory", 1)  # full: every write that adds is refused (OOM)
        try:
            refused = _step(second, "counter", 60, 2)
            assert refused.status_code == 503
            assert "is full" in _plain(refused) and refused.headers["retry-after"]
            for server in (first, second):  # counts that cannot be written
                assert _stateless(server).status_code == 200
            time.sleep(1.5)  # past the members' registrations (3 heartbeats of 0.2 s)
            for server in (first, second):
                base = f"http://127.0.0.1:{server.port}"
                assert httpx.get(f"{base}/v2/health/ready").status_code == 200
                assert httpx.get(f"{base}/v2/models/counter/ready").status_code == 200
                stats = httpx.get(f"{base}/v2/models/simple/stats")
                assert stats.status_code == 503 and "statistics" in _plain(stats)
        finally:
            direct.config_set("maxmemory", room)
        # the refused step was not applied: sent again, it runs once
        assert _step(second, "counter", 60, 2, end=True).json()["outputs"][0]["data"] == [0, 1, 2]
        time.sleep(1.0)  # a statistics write
        stats = httpx.get(f"http://127.0.0.1:{first.port}/v2/models/simple/stats")
        assert stats.status_code == 200


def test_a_redis_away_is_named_in_plain_words(cluster: Cluster) -> None:
    first, second = cluster.replicas
    cluster.redis.stop()
    try:
        refused = _step(first, "counter", 70, 1, start=True)
        assert refused.status_code == 503 and refused.headers["retry-after"]
        text = _plain(refused)
        assert "unreachable" in text and str(cluster.redis.port) not in text
        stats = httpx.get(f"http://127.0.0.1:{second.port}/v2/models/simple/stats")
        assert stats.status_code == 503 and str(cluster.redis.port) not in _plain(stats)
        assert _stateless(second).status_code == 200
    finally:
        cluster.redis.start()
