"""grpc.health.v1.Health, for Kubernetes' gRPC probes and grpc_health_probe: SERVING while the
data plane is ready (start-up done, no shutdown begun, and with strict readiness a ready model
repository: ServerReady's answer), NOT_SERVING otherwise. Two service names are known: "" (the
whole server) and the inference service's; any other is NOT_FOUND, as grpcio's own servicer
answers (Watch sends SERVICE_UNKNOWN for it, as the protocol says)."""

import asyncio
import contextlib
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from service.core.dataplane import DataPlane
from service.errors import NotFound
from service.grpc.door import send

SERVICE = health_pb2.DESCRIPTOR.services_by_name["Health"]
Status = health_pb2.HealthCheckResponse.ServingStatus
WATCH_SECONDS = 1.0  # how often Watch looks at readiness


class Health(health_pb2_grpc.HealthServicer):
    """Check and Watch, from the data plane's readiness."""

    def __init__(self, plane: DataPlane, services: tuple[str, ...], send_timeout: float,
                 watch_seconds: float) -> None:  # fmt: skip
        self.plane = plane
        self.services = ("", *services)
        self.send_timeout = send_timeout
        self.watch_seconds = (
            watch_seconds  # a Watch ends after this long (OPSERVE_GRPC_IDLE_SECONDS)
        )
        self.stopping = asyncio.Event()  # the server is stopping: Watch streams end

    def status(self, service: str) -> Any:
        if service not in self.services:
            return health_pb2.HealthCheckResponse.SERVICE_UNKNOWN
        ready = self.plane.server_ready()
        return health_pb2.HealthCheckResponse.SERVING if ready else (
            health_pb2.HealthCheckResponse.NOT_SERVING)  # fmt: skip

    async def Check(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        status = self.status(request.service)
        if status == health_pb2.HealthCheckResponse.SERVICE_UNKNOWN:
            raise NotFound(f"unknown service {request.service[:100]!r}: the services are "
                           f"{', '.join(repr(s) for s in self.services)}")  # fmt: skip
        return health_pb2.HealthCheckResponse(status=status)

    async def Watch(self, request: Any, context: grpc.aio.ServicerContext) -> None:
        """The status now, then again each time it changes, until the client leaves, the server
        stops (the stream then ends, NOT_SERVING its last status) or OPSERVE_GRPC_IDLE_SECONDS
        pass (it ends OK, and the client watches again: no stream holds a call slot for ever)."""
        last = None
        loop = asyncio.get_running_loop()
        ends = loop.time() + self.watch_seconds
        while True:
            # read before the status, so a stop seen here is in the status sent (readiness
            # goes off before stop_watches); one that comes during a send is seen next time
            stopping = self.stopping.is_set()
            status = self.status(request.service)
            if status != last:
                await send(context, health_pb2.HealthCheckResponse(status=status),
                           self.send_timeout)  # fmt: skip
                last = status
            left = ends - loop.time()
            if stopping or left <= 0:
                return
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.stopping.wait(), min(WATCH_SECONDS, left))

    def stop_watches(self) -> None:
        """The server is stopping (readiness already off): every Watch sends its last status
        and ends, so that no stream holds the stop to its grace period."""
        self.stopping.set()
