"""The gRPC server of one worker: grpc.aio on the worker's own event loop (uvicorn's), made,
started and stopped by the app's lifespan, never at import. It serves Triton's
inference.GRPCInferenceService, grpc.health.v1.Health and server reflection, every call
through the door (door.py).

Its channel arguments: message sizes from the request and answer limits; keepalive as Triton's
(server pings every OPSERVE_GRPC_KEEPALIVE_SECONDS), but client pings accepted every
OPSERVE_GRPC_MIN_PING_SECONDS, with no call open too (tritonclient's keepalive example);
SO_REUSEPORT only with several workers, each of which binds the port after the fork, so that a
second server started on a port in use fails to start instead of sharing it unseen; and the
bounds of what a message holds before the door has claimed it (messages.py):
- no per-message decompression: the door inflates a compressed message itself, claiming from
  the memory budget as it grows (grpc core would inflate it whole first);
- no BDP probe: HTTP/2 flow control then holds a call whose message the door has not asked for
  to the initial window, 64 KiB (with the probe, grpc grows the window to what it measures of
  the link: 8 concurrent unread 40 MiB calls held 66 MiB of the server's memory on loopback,
  2 MiB without); a message the door reads still comes at full speed, as grpc opens the
  window to its whole length once it is asked for;
- at most OPSERVE_GRPC_MAX_STREAMS_PER_CONNECTION calls open on one connection (HTTP/2's
  SETTINGS_MAX_CONCURRENT_STREAMS: a client's further calls wait on its side), so that one
  connection cannot take every place of OPSERVE_GRPC_MAX_CALLS.
"""

import asyncio
import logging

import grpc
from grpc_reflection.v1alpha import reflection, reflection_pb2

from service.core.api_keys import parse_keys
from service.core.dataplane import DataPlane
from service.core.memory_budget import MemoryBudget
from service.core.message_room import MessageRoom
from service.grpc.api_keys import ApiKeys
from service.grpc.door import Door
from service.grpc.health import SERVICE as HEALTH
from service.grpc.health import Health
from service.grpc.messages import Messages
from service.grpc.servicer import SERVICE as INFERENCE
from service.grpc.servicer import Servicer
from service.settings import MiB, Settings
from service.telemetry.recorder import Telemetry

log = logging.getLogger("opserve")
COMPRESSION = {"gzip": grpc.Compression.Gzip, "deflate": grpc.Compression.Deflate}
REFLECTION = reflection_pb2.DESCRIPTOR.services_by_name["ServerReflection"]
FREE_READS = 1
"""Unary calls whose message may be read with nothing taken from the memory budget: the fixed
margin above it (3 x OPSERVE_MAX_REQUEST_BYTES at most, message_room.READ_COPIES), where small
calls' reads pass while the budget is full."""


def options(settings: Settings) -> list[tuple[str, int]]:
    """The server's channel arguments (grpc's channel_arg_names.h)."""
    return [
        ("grpc.max_receive_message_length", settings.max_request_bytes),
        # the core refuses a larger answer first (OPSERVE_MAX_ANSWER_BYTES); room for its head
        ("grpc.max_send_message_length", settings.max_answer_bytes + MiB),
        ("grpc.so_reuseport", int(settings.workers > 1)),
        ("grpc.keepalive_time_ms", int(settings.grpc_keepalive_seconds * 1000)),
        ("grpc.keepalive_timeout_ms", 20_000),
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.min_ping_interval_without_data_ms", int(settings.grpc_min_ping_seconds * 1000)),
        ("grpc.per_message_decompression", 0),
        ("grpc.http2.bdp_probe", 0),
        ("grpc.max_concurrent_streams", settings.grpc_max_streams_per_connection),
    ]  # fmt: skip


class GrpcServer:
    """Started by `start()` on the running loop; `begin_stop()` (on SIGTERM) closes the port at
    once and lets calls in flight finish within the grace period; `stop()` awaits that."""

    def __init__(self, settings: Settings, plane: DataPlane, budget: MemoryBudget,
                 telemetry: Telemetry) -> None:  # fmt: skip
        self.settings = settings
        room = MessageRoom(budget, settings.max_request_bytes, FREE_READS)
        messages = Messages(room, plane.execution.offloader, settings.max_request_bytes)
        self.door = Door(plane, telemetry, budget, messages, settings.grpc_max_calls,
                         settings.grpc_max_calls_per_client, settings.body_timeout_seconds,
                         settings.send_timeout_seconds, settings.grpc_idle_seconds,
                         settings.grpc_max_streams, settings.grpc_max_streams_per_client)  # fmt: skip
        self.servicer = Servicer(plane, budget, settings.send_timeout_seconds)
        self.health = Health(plane, (INFERENCE.full_name,), settings.send_timeout_seconds)
        self.server: grpc.aio.Server | None = None
        self.stopping: asyncio.Task[None] | None = None
        self.port = 0

    async def start(self) -> None:
        """Bind OPSERVE_HOST:OPSERVE_GRPC_PORT and serve; a port that cannot be bound stops
        the start-up (RuntimeError)."""
        settings = self.settings
        keys = parse_keys(settings.api_keys.get_secret_value())
        server = grpc.aio.server(
            interceptors=[ApiKeys(keys, self.door)] if keys else None,
            options=options(settings),
            # only when asked: even NoCompression costs every call a compression negotiation
            compression=COMPRESSION.get(settings.grpc_compression),
        )
        served = reflection.aio.ReflectionServicer((INFERENCE.full_name, HEALTH.full_name,
                                                    REFLECTION.full_name))  # fmt: skip
        for service, servicer in ((INFERENCE, self.servicer), (HEALTH, self.health),
                                  (REFLECTION, served)):  # fmt: skip
            handlers = {route.rpartition("/")[2]: handler
                        for route, handler in self.door.handlers(service, servicer).items()}  # fmt: skip
            server.add_generic_rpc_handlers(
                [grpc.method_handlers_generic_handler(service.full_name, handlers)]
            )
            server.add_registered_method_handlers(service.full_name, handlers)
        host = f"[{settings.host}]" if ":" in settings.host else settings.host
        self.port = server.add_insecure_port(f"{host}:{settings.grpc_port}")
        await server.start()
        self.server = server
        log.info("gRPC served on %s:%d", settings.host, self.port)

    def begin_stop(self) -> None:
        """Stop taking calls now; those in flight get the grace period (safe from a signal
        handler on the loop's thread: it only schedules)."""
        if self.server is None or self.stopping is not None:
            return
        self.servicer.stop_streams()
        self.health.stop_watches()
        grace = float(self.settings.graceful_shutdown_seconds)
        self.stopping = asyncio.get_event_loop().create_task(self.server.stop(grace))

    async def stop(self) -> None:
        """Stop (if not begun) and wait until the server has stopped."""
        self.begin_stop()
        if self.stopping is not None:
            await self.stopping
