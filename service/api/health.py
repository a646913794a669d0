"""Readiness on SIGTERM: the V2 health routes (v2_routes.py) answer not ready from the first
moment of a graceful shutdown, so load balancers stop sending before the server stops."""

import signal
import threading
from collections.abc import Callable
from types import FrameType
from typing import Protocol


class Serving(Protocol):
    serving: bool


def unready_on_sigterm(plane: Serving, *then: Callable[[], None]) -> None:
    """On SIGTERM, report not ready at once, run `then` (the gRPC server stops taking calls),
    then let uvicorn's own handler begin its graceful shutdown (stop accepting, finish in-flight
    requests). Call it after uvicorn has installed its handlers (from the lifespan start-up);
    signals only reach the main thread."""
    if threading.current_thread() is not threading.main_thread():
        return
    previous = signal.getsignal(signal.SIGTERM)

    def handler(signum: int, frame: FrameType | None) -> None:
        plane.serving = False
        for action in then:
            action()
        if callable(previous):
            previous(signum, frame)

    signal.signal(signal.SIGTERM, handler)
