"""Fixtures of the V2 tests: one real server per test process, driven by tritonclient.http."""

import warnings
from collections.abc import Iterator

import pytest
import tritonclient.http as triton

from tests.api.live_server import Server, serve


@pytest.fixture(scope="session")
def server() -> Iterator[Server]:
    with serve() as running:
        yield running


@pytest.fixture(scope="session")
def client(server: Server) -> Iterator[triton.InferenceServerClient]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        triton_client = triton.InferenceServerClient(f"127.0.0.1:{server.port}")
    yield triton_client
    triton_client.close()
