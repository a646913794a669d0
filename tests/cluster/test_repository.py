"""Repository control on every replica (issue 26, item 3), two replicas on one Redis and one
repository, explicit model control, real tritonclient over HTTP and gRPC: a load or unload on
one replica is applied on every replica before it answers, with its config override and its
`file:` contents; concurrent loads on two replicas both hold; a replica started afterwards
serves the cluster's models before it says ready."""

import threading
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import numpy as np
import pytest

from tests.api.live_server import Server
from tests.cluster.redis_server import RedisServer, redis_server
from tests.cluster.repository_cluster import (
    example_repository,
    grpc,
    http,
    infer_pair,
    replica,
    store_keys,
)

Cluster = tuple[RedisServer, Path, Server, Server]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    root = example_repository(tmp_path_factory.mktemp("repository"))
    with ExitStack() as stack:
        redis = stack.enter_context(redis_server(tmp_path_factory.mktemp("redis")))
        first = stack.enter_context(replica(redis.url, root))
        second = stack.enter_context(replica(redis.url, root))
        yield redis, root, first, second


def test_a_load_is_ready_on_every_replica_when_it_answers(cluster: Cluster) -> None:
    _redis, _root, first, second = cluster
    on_first, on_second = http(first), http(second)
    assert not on_second.is_model_ready("simple")
    # Triton's simple_http_model_control.py: "Expect max_batch_size = 16"
    on_first.load_model("simple", config='{"max_batch_size": 16}')
    assert on_second.is_model_ready("simple")  # before the load answered, not after
    assert on_second.get_model_config("simple")["max_batch_size"] == 16
    assert np.array_equal(infer_pair(on_second, "simple"), np.arange(1, 17)[None])
    on_second.unload_model("simple")
    assert not on_first.is_model_ready("simple")
    assert on_second.is_model_ready("simple_int8") and on_first.is_model_ready("simple_int8")
    on_first.close()
    on_second.close()


def test_file_contents_sent_to_one_replica_serve_on_another(cluster: Cluster) -> None:
    redis, root, first, second = cluster
    model = (root / "simple" / "1" / "model.onnx").read_bytes()
    control, on_second = grpc(first), http(second)
    # a model sent whole over gRPC: a name with no folder, its config and its file
    control.load_model("sent_whole", config='{"name": "sent_whole", "max_batch_size": 8}',
                       files={"file:1/model.onnx": model})  # fmt: skip
    outputs = [o["name"] for o in on_second.get_model_metadata("sent_whole")["outputs"]]
    assert outputs == ["OUTPUT0", "OUTPUT1"]
    assert {"name": "sent_whole", "version": "1", "state": "READY"} in (
        on_second.get_model_repository_index())  # fmt: skip
    assert len(store_keys(redis.url, "opserve:opserve:repo:blob:*")) == 1  # stored once
    control.unload_model("sent_whole")
    assert not on_second.is_model_ready("sent_whole")
    assert store_keys(redis.url, "opserve:opserve:repo:blob:*") == []  # no spec names it now
    control.close()
    on_second.close()


def test_concurrent_loads_on_two_replicas_both_hold(cluster: Cluster) -> None:
    _redis, _root, first, second = cluster
    errors: list[Exception] = []

    def load(server: Server, name: str) -> None:
        client = http(server)  # tritonclient.http's own per thread (gevent)
        try:
            client.load_model(name)
        except Exception as exc:
            errors.append(exc)
        client.close()

    threads = [threading.Thread(target=load, args=(first, "simple")),
               threading.Thread(target=load, args=(second, "custom_identity_int32"))]  # fmt: skip
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert errors == []
    clients = [http(first), http(second)]
    for client in clients:
        assert client.is_model_ready("simple") and client.is_model_ready("custom_identity_int32")
    clients[0].unload_model("simple")
    clients[1].unload_model("custom_identity_int32")
    for client in clients:
        assert not client.is_model_ready("simple")
        assert not client.is_model_ready("custom_identity_int32")
        client.close()


def test_a_replica_started_later_serves_the_models_before_it_is_ready(cluster: Cluster) -> None:
    redis, root, first, _second = cluster
    control = http(first)
    control.load_model("simple", config='{"max_batch_size": 16}')
    control.unload_model("simple_int8")  # a start-up model the cluster no longer wants
    # its timer slow (5 s): what it serves when ready is its start-up's apply, not a later turn
    with replica(redis.url, root, cluster_heartbeat_seconds="5") as late:
        joined = http(late)
        assert joined.is_model_ready("simple")
        assert joined.get_model_config("simple")["max_batch_size"] == 16
        assert not joined.is_model_ready("simple_int8")  # unloaded as the cluster wants
        index = {(row["name"], row.get("state")) for row in joined.get_model_repository_index()}
        assert ("simple", "READY") in index and ("simple_int8", "READY") not in index
        joined.close()
    control.load_model("simple_int8")
    control.unload_model("simple")
    control.close()
