"""Replicas of one cluster for tests: n opserve processes (tests/api/live_server.serve) on one
Redis, each with its own HTTP and gRPC ports, as a load balancer's backends."""

from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass

from tests.api.live_server import Server, free_port, serve


@dataclass(frozen=True)
class Replica(Server):
    """A server of the cluster and its gRPC port (0: none)."""

    grpc_port: int = 0

    @property
    def grpc_target(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"


@contextmanager
def replica(redis_url: str, *argv: str, wait_path: str = "/v2/health/ready",
            **settings: str) -> Iterator[Replica]:  # fmt: skip
    """One server in cluster mode on `redis_url` (a fast heartbeat and a gRPC port of its own
    unless given), stopped at the end."""
    settings = {"cluster_redis_url": redis_url, "cluster_heartbeat_seconds": "0.2",
                "grpc_port": str(free_port()), **settings}  # fmt: skip
    with serve(*argv, wait_path=wait_path, **settings) as server:
        yield Replica(server.process, server.port, server.host, int(settings["grpc_port"]))


@contextmanager
def replicas(count: int, redis_url: str, *argv: str, wait_path: str = "/v2/health/ready",
             **settings: str) -> Iterator[list[Replica]]:  # fmt: skip
    """`count` servers in cluster mode on `redis_url` with the same OPSERVE_* `settings`,
    all stopped at the end."""
    with ExitStack() as stack:
        yield [stack.enter_context(replica(redis_url, *argv, wait_path=wait_path, **settings))
               for _ in range(count)]  # fmt: skip
