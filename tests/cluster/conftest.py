"""Fixtures of the cluster tests: a real Redis per test."""

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cluster.redis_server import RedisServer, redis_server


@pytest.fixture
def redis(tmp_path: Path) -> Iterator[RedisServer]:
    with redis_server(tmp_path) as server:
        yield server
