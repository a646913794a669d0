"""grpc.health.v1.Health, for Kubernetes' gRPC probes and grpc_health_probe: SERVING while the
data plane is ready (start-up done, no shutdown begun, and with strict readiness a ready model
repository: ServerReady's answer), NOT_SERVING otherwise. Two service names are known: "" (the
whole server) and the inference service's; any other is NOT_FOUND, as grpcio's own servicer
answers (Watch sends SERVICE_UNKNOWN for it, as the protocol says)."""

import asyncio
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

    def __init__(self, plane: DataPlane, services: tuple[str, ...], send_timeout: float) -> None:
        self.plane = plane
        self.services = ("", *services)
        self.send_timeout = send_timeout

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
        """The status now, then again each time it changes, until the client leaves."""
        last = None
        while True:
            status = self.status(request.service)
            if status != last:
                await send(context, health_pb2.HealthCheckResponse(status=status),
                           self.send_timeout)  # fmt: skip
                last = status
            await asyncio.sleep(WATCH_SECONDS)
