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
from service.core.readiness import readiness_of
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
        self.stopping = asyncio.Event()  # the server is stopping: Watch streams end

    def status(self, service: str) -> Any:
        if service not in self.services:
            return health_pb2.HealthCheckResponse.SERVICE_UNKNOWN
        ready = self.plane.server_ready()
        if not ready:  # gRPC's answer has no room for it: the log says why (once)
            readiness_of(self.plane).server_reason()
        return health_pb2.HealthCheckResponse.SERVING if ready else (
            health_pb2.HealthCheckResponse.NOT_SERVING)  # fmt: skip

    async def Check(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        status = self.status(request.service)
        if status == health_pb2.HealthCheckResponse.SERVICE_UNKNOWN:
            raise NotFound(f"unknown service {request.service[:100]!r}: the services are "
                           f"{', '.join(repr(s) for s in self.services)}")  # fmt: skip
        return health_pb2.HealthCheckResponse(status=status)

    async def Watch(self, request: Any, context: grpc.aio.ServicerContext) -> None:
        """The status now, then again each time it changes, until the client leaves or the
        server stops (the stream then ends, NOT_SERVING its last status). Not ended when idle:
        a client checking health on its channel takes an ended Watch for a failing server; a
        Watch holds one of its client's stream places (OPSERVE_GRPC_MAX_STREAMS_PER_CLIENT,
        call_slots.py), none of its call slots, and with API keys needs one."""
        last = None
        while True:
            # read before the status, so a stop seen here is in the status sent (readiness
            # goes off before stop_watches); one that comes during a send is seen next time
            stopping = self.stopping.is_set()
            status = self.status(request.service)
            if status != last:
                await send(context, health_pb2.HealthCheckResponse(status=status),
                           self.send_timeout)  # fmt: skip
                last = status
            if stopping:
                return
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.stopping.wait(), WATCH_SECONDS)

    def stop_watches(self) -> None:
        """The server is stopping (readiness already off): every Watch sends its last status
        and ends, so that no stream holds the stop to its grace period."""
        self.stopping.set()
