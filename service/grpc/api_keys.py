"""API keys on gRPC (OPSERVE_API_KEYS): the same keys as HTTP, from the call's metadata
`authorization: Bearer <key>`. As on HTTP, what probes and tools call without credentials
stays open: the health service, ServerLive and ServerReady (HTTP's /v2/health/*), and server
reflection (HTTP's documentation pages)."""

from collections.abc import Awaitable, Callable
from typing import Any

import grpc

from service.core.api_keys import REFUSED, UNAUTHORIZED, authorized
from service.errors import Unauthorized
from service.grpc.door import Door

OPEN_METHODS = ("/grpc.health.v1.Health/Check", "/inference.GRPCInferenceService/ServerLive",
                "/inference.GRPCInferenceService/ServerReady")  # fmt: skip
"""The probes, each one quick unary call. Streams (health Watch, reflection) need a key: a
stream holds a call slot for as long as it stays open, so unauthenticated clients could
otherwise hold every slot (issue 25)."""


class ApiKeys(grpc.aio.ServerInterceptor):
    """Answers UNAUTHENTICATED, through the door (counted and logged), to a call without a
    valid key; hands any other call on."""

    def __init__(self, keys: tuple[bytes, ...], door: Door) -> None:
        self.keys = keys
        refuse = door.refusing(UNAUTHORIZED, Unauthorized(REFUSED))
        self.refusals = (grpc.stream_unary_rpc_method_handler(refuse),
                         grpc.stream_stream_rpc_method_handler(refuse))  # fmt: skip

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[Any]],
        details: grpc.HandlerCallDetails,
    ) -> Any:
        handler = await continuation(details)
        if handler is None or details.method.startswith(OPEN_METHODS):
            return handler
        if self._has_key(details.invocation_metadata):
            return handler
        return self.refusals[1] if handler.response_streaming else self.refusals[0]

    def _has_key(self, metadata: Any) -> bool:
        for key, value in metadata:
            if key == "authorization":
                return authorized(value.encode() if isinstance(value, str) else value, self.keys)
        return False
