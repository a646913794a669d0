"""What the repository-control cluster tests share: replicas in explicit model control on
Triton's example repository, and the calls they check (real tritonclient, real processes)."""

import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import redis as redis_py
import tritonclient.grpc as triton_grpc
import tritonclient.http as triton_http

from tests.cluster.replicas import Replica
from tests.cluster.replicas import replica as one_replica
from tests.triton_examples import write_repository

MODELS = ["simple", "simple_int8", "custom_identity_int32"]


def example_repository(root: Path, names: list[str] | None = None) -> Path:
    return write_repository(root, names or MODELS)


@contextmanager
def replica(redis_url: str, root: Path, **settings: str) -> Iterator[Replica]:
    """One opserve process in cluster mode (tests/cluster/replicas.py: its own gRPC port),
    explicit model control on `root` (`simple_int8` loaded at start-up)."""
    given = {"model_repository": str(root), "model_control_mode": "explicit",
             "load_models": "simple_int8", "cluster_apply_seconds": "10",
             "reference_fallback": "true", **settings}  # fmt: skip
    with one_replica(redis_url, **given) as server:
        yield server


def http(server: Replica) -> triton_http.InferenceServerClient:
    return triton_http.InferenceServerClient(f"127.0.0.1:{server.port}")


def grpc(server: Replica) -> triton_grpc.InferenceServerClient:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return triton_grpc.InferenceServerClient(server.grpc_target)


def infer_pair(client: triton_http.InferenceServerClient, name: str,
               dtype: str = "INT32") -> np.ndarray:  # fmt: skip
    """OUTPUT0 of Triton's simple model (INPUT0 + INPUT1) for 0..15 and ones."""
    kind = {"INT32": np.int32, "INT8": np.int8}[dtype]
    inputs = [triton_http.InferInput(n, [1, 16], dtype) for n in ("INPUT0", "INPUT1")]
    inputs[0].set_data_from_numpy(np.arange(16, dtype=kind)[None])
    inputs[1].set_data_from_numpy(np.ones((1, 16), kind))
    return client.infer(name, inputs).as_numpy("OUTPUT0")


def store_keys(url: str, pattern: str) -> list[bytes]:
    """Keys of the cluster store matching `pattern`, read with redis-py directly."""
    with redis_py.Redis.from_url(url) as direct:
        return sorted(direct.scan_iter(match=pattern))
