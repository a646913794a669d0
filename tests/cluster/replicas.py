"""Replicas of one cluster for tests: n opserve processes (tests/api/live_server.serve) on one
Redis, each with its own port, as a load balancer's backends."""

from collections.abc import Iterator
from contextlib import ExitStack, contextmanager

from tests.api.live_server import Server, serve


@contextmanager
def replicas(count: int, redis_url: str, *argv: str, wait_path: str = "/v2/health/ready",
             **settings: str) -> Iterator[list[Server]]:  # fmt: skip
    """`count` servers in cluster mode on `redis_url` with the same OPSERVE_* `settings`
    (a fast heartbeat unless given), all stopped at the end."""
    settings = {"cluster_redis_url": redis_url, "cluster_heartbeat_seconds": "0.2", **settings}
    with ExitStack() as stack:
        yield [stack.enter_context(serve(*argv, wait_path=wait_path, **settings))
               for _ in range(count)]  # fmt: skip
