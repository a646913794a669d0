"""Liveness and readiness (the KServe V2 health routes), for probes and load balancers."""

from fastapi import APIRouter, Request
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
    """200 with an empty body once start-up is done; 400 before, as Triton answers."""
    return Response(status_code=200 if getattr(request.app.state, "ready", False) else 400)
