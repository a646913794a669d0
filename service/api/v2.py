"""The KServe V2 routes as OpenAPI shows them. The V2 lane (v2_lane.py, v2_routes.py) serves
every `/v2` path; FastAPI only documents them here, so Swagger shows each with its body and
answers."""

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Annotated, Any

from fastapi import Body, Path
from fastapi.routing import APIRoute
from pydantic import BaseModel
from starlette.responses import JSONResponse
from starlette.routing import BaseRoute

from api_schemas.v2 import (
    InferenceRequest,
    InferenceResponse,
    ModelMetadata,
    ModelReady,
    ServerLive,
    ServerMetadata,
    ServerReady,
    V2Error,
)

TAG = "KServe V2"
HEALTH_TAG = "health"

_WORDS = {
    400: "A bad request (Triton's INVALID_ARG): body, tensor, parameter or type; not ready",
    404: "Unknown model, version or route", 405: "Wrong method for the route",
    408: "The body did not arrive within OPSERVE_BODY_TIMEOUT_SECONDS",
    413: "Request body, output or memory share over the limits",
    415: "A form or text/plain Content-Type, or an unknown Content-Encoding",
    501: "Not offered here (Triton's UNSUPPORTED)",
    503: "Not available now: a model not at ready state, model control off, a busy budget",
}  # fmt: skip

Name = Annotated[str, Path(description="Model name: an operator (Tile) or a repository model",
                           examples=["Tile"])]  # fmt: skip
Version = Annotated[str, Path(description="Model version: an operator's since_version, a "
                              "repository model's version folder", examples=["13"])]  # fmt: skip


@dataclass(frozen=True)
class Documented:
    """One V2 route as OpenAPI shows it."""

    method: str
    path: str
    summary: str
    description: str
    answer: type[BaseModel] | None = None
    errors: tuple[int, ...] = (404,)
    body: type[BaseModel] | None = None
    tag: str = TAG
    extra: dict[int | str, dict[str, Any]] = field(default_factory=dict)


_INFER_200: dict[int | str, dict[str, Any]] = {200: {"description": "The outputs; with binary data, the JSON part is the first "
                    "Inference-Header-Content-Length bytes",
                    "content": {"application/octet-stream": {}}}}  # fmt: skip
_NEWEST = " Without a version: the newest ready one."

DOCUMENTED = (
    Documented("GET", "/v2", "Server metadata", "The server's name, version and the protocol "
               "extensions it serves.", ServerMetadata, ()),
    Documented("GET", "/v2/health/live", "The process is up", "200 `{\"live\": true}` while "
               "the process runs; 400 once runs that did not stop hold every kernel thread "
               "(restart it).", ServerLive, tag=HEALTH_TAG, errors=(400,)),
    Documented("GET", "/v2/health/ready", "The server takes requests", "200 `{\"ready\": true}`"
               " once start-up is done; 400 before, during shutdown, and (strict readiness) "
               "while a repository model failed or none is ready.", ServerReady, tag=HEALTH_TAG,
               errors=(400,)),
    Documented("GET", "/v2/models/{name}", "Model metadata", "Inputs and outputs with their "
               "V2 datatypes (`datatypes` lists every allowed one) and shapes (-1: any size; "
               "`[-1]` for an operator tensor of any rank), and, for an operator, its "
               "attributes and how each travels." + _NEWEST, ModelMetadata, (404, 503)),
    Documented("GET", "/v2/models/{name}/ready", "Model readiness", "200 when the model takes "
               "requests, 400 when it does not, 404 for an unknown model.", ModelReady,
               errors=(400, 404)),
    Documented("POST", "/v2/models/{name}/infer", "Run an inference", "The Open Inference "
               "Protocol with Triton's binary tensor data extension: inputs as JSON `data` or "
               "as `binary_data_size` bytes after the JSON (its length in the "
               "Inference-Header-Content-Length header); operator attributes as request "
               "`parameters`; gzip and deflate bodies both ways. See docs/v2.md." + _NEWEST,
               InferenceResponse, (400, 404, 405, 408, 413, 415, 503), InferenceRequest,
               extra=_INFER_200),
)  # fmt: skip


def _errors(codes: tuple[int, ...]) -> dict[int | str, dict[str, Any]]:
    return {code: {"model": V2Error, "description": _WORDS[code]} for code in codes}


def documented_routes() -> list[BaseRoute]:
    """The routes the V2 lane serves, as OpenAPI shows them (model routes with and without a
    version)."""
    routes: list[BaseRoute] = []
    for doc in DOCUMENTED:
        paths = [doc.path]
        if doc.path.startswith("/v2/models/{name}"):
            paths.append(doc.path.replace("{name}", "{name}/versions/{version}"))
        for path in paths:
            routes.append(APIRoute(
                path, _endpoint(path, doc.body), methods=[doc.method], tags=[doc.tag],
                summary=doc.summary, description=doc.description,
                responses={**doc.extra, **_errors(doc.errors)}, response_model=doc.answer,
                operation_id=_operation_id(doc.method, path), response_class=JSONResponse,
            ))  # fmt: skip
    return routes


def _operation_id(method: str, path: str) -> str:
    words = [p for p in path.strip("/").split("/") if not p.startswith("{")]
    versioned = "_version" if "{version}" in path else ""
    return f"v2_{method.lower()}_{'_'.join(words[1:]) or 'server'}{versioned}"


def _endpoint(path: str, body: type[BaseModel] | None) -> Callable[..., Any]:
    """A do-nothing endpoint whose signature shows the path parameters and the body."""
    if "{version}" in path:
        if body is not None:

            async def versioned_body(name: Name, version: Version,
                                     request: Annotated[body, Body()]) -> None: ...  # type: ignore[valid-type]  # fmt: skip

            return versioned_body

        async def versioned(name: Name, version: Version) -> None: ...

        return versioned
    if "{name}" in path:
        if body is not None:

            async def named_body(name: Name, request: Annotated[body, Body()]) -> None: ...  # type: ignore[valid-type]

            return named_body

        async def named(name: Name) -> None: ...

        return named

    async def plain() -> None: ...

    return plain
