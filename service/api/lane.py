"""What the raw ASGI lanes (operator_lane.py, v2_lane.py) share: the body and answer guards a
request is held to, and a `serve` that keeps the request's memory reservation until the last
byte of its answer was handed to the server."""

from dataclasses import dataclass

from starlette.types import Receive, Scope, Send

from service.core.execution import Execution
from service.core.memory_budget import MemoryBudget, Reservation


@dataclass(frozen=True)
class Guards:
    """The limits of one request's body and answer (OPSERVE_* settings)."""

    max_request_bytes: int
    body_timeout: float = 60.0  # seconds for the whole body (408 after)
    send_timeout: float = 60.0  # seconds a client may read nothing of its answer


class Lane:
    """A raw ASGI app answering one family of routes; subclasses write `_serve`."""

    def __init__(self, execution: Execution, budget: MemoryBudget, guards: Guards) -> None:
        self.execution = execution
        self.offloader = execution.offloader
        self.budget = budget
        self.guards = guards
        self.max_request_bytes = guards.max_request_bytes
        self.body_timeout = guards.body_timeout
        self.send_timeout = guards.send_timeout

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self.serve(scope, receive, send)

    async def serve(self, scope: Scope, receive: Receive, send: Send) -> int:
        """Answer the request; the status sent (499 when the client left first)."""
        held = Reservation(self.budget)  # holds nothing unless the request turns out large
        try:
            return await self._serve(scope, receive, send, held)
        finally:
            held.release()  # after the last byte of the answer was handed to the server

    async def _serve(self, scope: Scope, receive: Receive, send: Send, held: Reservation) -> int:
        raise NotImplementedError
