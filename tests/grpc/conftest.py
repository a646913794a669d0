"""Fixtures of the gRPC tests: one real server per test process (HTTP and gRPC), serving the
operators and Triton's example repository (tests/triton_examples.py) in explicit model control
with every model loaded and client shared memory on, driven by tritonclient.grpc and by the raw
generated stubs."""

import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
import tritonclient.grpc as triton
from tritonclient.grpc import service_pb2_grpc

from tests.api.live_server import Server, free_port, serve
from tests.triton_examples import write_repository


@dataclass(frozen=True)
class Served:
    """A server and its gRPC port."""

    http: Server
    grpc_port: int

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"


@contextmanager
def serve_grpc(*argv: str, log_to: Path | None = None, **settings: str) -> Iterator[Served]:
    """`serve` with a gRPC port of its own (its log in `log_to` when given)."""
    port = free_port()
    with serve(*argv, grpc_port=str(port), log_to=log_to, **settings) as http:
        yield Served(http, port)


def repository(root: Path) -> dict[str, str]:
    """The settings of a server of Triton's example repository written under `root`."""
    write_repository(root)
    return {"model_repository": str(root),
            "allow_client_shm": "true", "model_control_mode": "explicit", "load_models": "*"}  # fmt: skip


@pytest.fixture(scope="session")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    with serve_grpc(**repository(tmp_path_factory.mktemp("repository"))) as running:
        yield running


@contextmanager
def triton_client(served: Served) -> Iterator[triton.InferenceServerClient]:
    """tritonclient.grpc's client of `served` (its import-time warnings hushed), closed after."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        made = triton.InferenceServerClient(served.target)
    try:
        yield made
    finally:
        made.close()


@pytest.fixture(scope="session")
def client(served: Served) -> Iterator[triton.InferenceServerClient]:
    with triton_client(served) as made:
        yield made


@pytest.fixture(scope="session")
def stub(served: Served) -> Iterator[service_pb2_grpc.GRPCInferenceServiceStub]:
    channel = grpc.insecure_channel(served.target)
    yield service_pb2_grpc.GRPCInferenceServiceStub(channel)
    channel.close()
