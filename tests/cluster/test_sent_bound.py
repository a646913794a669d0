"""OPSERVE_MAX_SENT_MODEL_BYTES over the cluster (issue 32, item 2): three models of 1.5 MB sent
whole at once through three real replicas on a real Redis, the bound 2 MB. The record's write
counts the files of every spec (desired_state.py): one load is served on every replica, the
others are refused (413) and serve nowhere, and Redis keeps only the blobs a spec names."""

import threading
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import httpx
import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from tests.cluster.redis_server import RedisServer, redis_server
from tests.cluster.replicas import Replica
from tests.cluster.repository_cluster import example_repository, replica, store_keys

MOST = 2_000_000
PADDING = 1_500_000 // 4  # float32 elements of an unused initializer: 1.5 MB a model


def _sent_model(root: Path, seed: int) -> bytes:
    """Triton's simple model with an initializer of its own (so each has its own digest)."""
    model = onnx.load(root / "simple" / "1" / "model.onnx")
    padding = np.random.default_rng(seed).random(PADDING, dtype=np.float32)
    model.graph.initializer.append(numpy_helper.from_array(padding, "padding"))
    return model.SerializeToString()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[RedisServer, Path,
                                                                         list[Replica]]]:  # fmt: skip
    root = example_repository(tmp_path_factory.mktemp("repository"))
    with ExitStack() as stack:
        redis = stack.enter_context(redis_server(tmp_path_factory.mktemp("redis")))
        servers = [stack.enter_context(replica(redis.url, root,
                                               max_sent_model_bytes=str(MOST)))
                   for _ in range(3)]  # fmt: skip
        yield redis, root, servers


def _load(server: Replica, name: str, model: bytes) -> httpx.Response:
    import base64

    body = {"parameters": {"config": f'{{"name": "{name}", "max_batch_size": 8}}',
                           "file:1/model.onnx": base64.b64encode(model).decode()}}  # fmt: skip
    return httpx.post(f"http://127.0.0.1:{server.port}/v2/repository/models/{name}/load",
                      json=body, timeout=60)  # fmt: skip


def _ready(server: Replica, name: str) -> bool:
    answer = httpx.get(f"http://127.0.0.1:{server.port}/v2/models/{name}/ready", timeout=10)
    return answer.status_code == 200


def test_the_sent_bound_holds_over_the_cluster(cluster: tuple[RedisServer, Path,
                                                              list[Replica]]) -> None:  # fmt: skip
    redis, root, servers = cluster
    names = [f"sent{i}" for i in range(3)]
    models = [_sent_model(root, i) for i in range(3)]
    answers: dict[str, httpx.Response] = {}
    threads = [threading.Thread(target=lambda s=s, n=n, m=m: answers.__setitem__(n, _load(s, n, m)))
               for s, n, m in zip(servers, names, models, strict=True)]  # fmt: skip
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    codes = sorted(answer.status_code for answer in answers.values())
    assert codes == [200, 413, 413], {n: a.text for n, a in answers.items()}
    loaded = next(name for name, answer in answers.items() if answer.status_code == 200)
    for name, answer in answers.items():
        if name != loaded:
            text = answer.json()["error"]
            assert "OPSERVE_MAX_SENT_MODEL_BYTES" in text and "opserve:" not in text
    # no split: the loaded model on every replica, the refused ones on none
    for server in servers:
        assert _ready(server, loaded)
        for name in names:
            if name != loaded:
                assert not _ready(server, name), (server.port, name)
    with httpx.Client() as client:
        blobs = store_keys(redis.url, "opserve:opserve:repo:blob:*")
        assert len(blobs) == 1  # the refused loads' uploads are gone at once
        unload = client.post(f"http://127.0.0.1:{servers[1].port}/v2/repository/models/"
                             f"{loaded}/unload", timeout=60)  # fmt: skip
        assert unload.status_code == 200
    # the bound is free again: another of them loads through any replica
    other = next(name for name in names if name != loaded)
    assert _load(servers[2], other, models[names.index(other)]).status_code == 200
    assert all(_ready(server, other) for server in servers)
