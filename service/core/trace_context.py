"""A request's trace as a door and the core share it, whatever the protocol: the caller's W3C
traceparent, the door's own stamps (Triton's HTTP_RECV_START/END and HTTP_SEND_START/END, or
GRPC_WAITREAD_START/END and GRPC_SEND_START/END) and the core's steps that Timings does not
keep (the response cache's lookup and insert). A door makes one only while tracing is on
(`Tracing.on`) and calls `close` once its answer is sent: a sampled request's record is
written then, as Triton writes a trace when its request is released, after the send."""

from collections.abc import Callable
from time import perf_counter_ns

Stamps = list[tuple[str, int]]  # Triton's names and perf_counter_ns times, in order
DOORS = {"HTTP": ("HTTP_RECV_START", "HTTP_RECV_END", "HTTP_SEND_START", "HTTP_SEND_END"),
         "GRPC": ("GRPC_WAITREAD_START", "GRPC_WAITREAD_END", "GRPC_SEND_START",
                  "GRPC_SEND_END")}  # fmt: skip


class TraceContext:
    """One request's trace context; `door` "HTTP" or "GRPC" (None: a caller with no door of
    its own, whose record is written as soon as the core is done)."""

    __slots__ = ("door", "finish", "received", "sending", "steps", "traceparent", "waiting")

    def __init__(self, door: str | None = None, waiting: int = 0) -> None:
        self.door = door
        self.waiting = waiting  # the door began to read the request (perf_counter_ns)
        self.received = 0  # ... and had it whole
        self.sending = 0  # the door began to send the answer
        self.traceparent: str | None = None
        self.steps: Stamps = []  # the core's own stamps besides Timings' (the cache's)
        # set by the core when the request was sampled: writes its record, given the door's
        # send stamps
        self.finish: Callable[[Stamps], None] | None = None

    def read(self) -> None:
        """The door has the whole request now."""
        self.received = perf_counter_ns()

    def send(self) -> None:
        """The door begins to send the answer now."""
        self.sending = perf_counter_ns()

    def step(self, name: str) -> None:
        """One of the core's steps, stamped now."""
        self.steps.append((name, perf_counter_ns()))

    def front(self) -> Stamps:
        """The door's receive stamps."""
        if self.door is None:
            return []
        names = DOORS[self.door]
        return [(names[0], self.waiting), (names[1], self.received or self.waiting)]

    def close(self) -> None:
        """The answer is sent (or never will be): the record, when sampled, is written with
        the door's send stamps (both now when the send never began)."""
        finish, self.finish = self.finish, None
        if finish is None:
            return
        if self.door is None:
            finish([])
            return
        end = perf_counter_ns()
        names = DOORS[self.door]
        finish([(names[2], self.sending or end), (names[3], end)])
