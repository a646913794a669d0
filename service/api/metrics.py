"""`GET /metrics`: the Prometheus metrics of every worker (service/telemetry/metrics.py)."""

from collections.abc import Callable

from fastapi import APIRouter, Request
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.datastructures import State
from starlette.responses import Response

router = APIRouter(tags=["operations"])


@router.get("/metrics", summary="Prometheus metrics of every worker", response_class=Response,
            responses={200: {"content": {CONTENT_TYPE_LATEST: {}}}})  # fmt: skip
async def metrics(request: Request) -> Response:
    """Requests, bytes, latency, in-flight requests and models loaded, in Prometheus' text
    format (what each metric means: docs/deployment.md)."""
    return Response(request.app.state.metrics.render(), media_type=CONTENT_TYPE_LATEST)


def models_loaded(state: State) -> Callable[[], int]:
    """How many model versions of `state.repository` are loaded and ready."""

    def count() -> int:
        repository = getattr(state, "repository", None)
        return 0 if repository is None else int(repository.ready())

    return count
