"""Liveness and readiness (the KServe V2 health routes), for probes and load balancers."""

from fastapi import APIRouter, Request
from starlette.responses import Response

router = APIRouter(prefix="/v2/health", tags=["health"])


@router.get("/live", summary="The process is up")
async def live() -> Response:
    return Response(status_code=200)


@router.get("/ready", summary="Start-up is done and the service takes requests")
async def ready(request: Request) -> Response:
    return Response(status_code=200 if getattr(request.app.state, "ready", False) else 503)
