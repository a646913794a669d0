"""What the raw ASGI lanes (operator_lane.py, v2_lane.py) share: the limits and guards a
large request is held to, and a `serve` that keeps the request's memory reservation until the
last byte of its answer was handed to the server."""

from starlette.types import Receive, Scope, Send

from service.codecs.limits import Limits
from service.core.memory_budget import MemoryBudget, Reservation
from service.core.offload import Offloader


class Lane:
    """A raw ASGI app answering one family of routes; subclasses write `_serve`."""

    def __init__(
        self,
        limits: Limits,
        max_output_bytes: int,
        max_request_bytes: int,
        offloader: Offloader,
        budget: MemoryBudget | None = None,
        body_timeout: float = 60.0,
        send_timeout: float = 60.0,
        max_answer_bytes: int | None = None,
    ) -> None:
        self.limits = limits
        self.max_output_bytes = max_output_bytes
        self.max_request_bytes = max_request_bytes
        self.offloader = offloader
        self.budget = budget or MemoryBudget(1 << 62, 0.0)  # none given: unbounded
        self.body_timeout = body_timeout
        self.send_timeout = send_timeout
        self.max_answer_bytes = max_answer_bytes

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
