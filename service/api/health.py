"""Liveness and readiness (the KServe V2 health routes), for probes and load balancers."""

import signal
import threading
from types import FrameType

from fastapi import APIRouter, Request
from starlette.datastructures import State
from starlette.responses import Response

router = APIRouter(prefix="/v2/health", tags=["health"])


@router.get("/live", summary="The process is up", response_class=Response)
async def live() -> Response:
    """200 with an empty body while the process runs (Triton's 400 for "not live" cannot
    happen here: a process that answers is live)."""
    return Response(status_code=200)


@router.get("/ready", summary="Start-up is done and the service takes requests",
            response_class=Response, responses={400: {"description": "Not ready yet"}})  # fmt: skip
async def ready(request: Request) -> Response:
    """200 with an empty body once start-up is done; 400 before and once shutdown has begun, as
    Triton answers."""
    return Response(status_code=200 if getattr(request.app.state, "ready", False) else 400)


def unready_on_sigterm(state: State) -> None:
    """On SIGTERM, report not ready at once, then let uvicorn's own handler begin its graceful
    shutdown (stop accepting, finish in-flight requests). Call it after uvicorn has installed
    its handlers (from the lifespan start-up); signals only reach the main thread."""
    if threading.current_thread() is not threading.main_thread():
        return
    previous = signal.getsignal(signal.SIGTERM)

    def handler(signum: int, frame: FrameType | None) -> None:
        state.ready = False
        if callable(previous):
            previous(signum, frame)

    signal.signal(signal.SIGTERM, handler)
