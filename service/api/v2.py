"""KServe V2 routes: `GET /v2` served by FastAPI; the model routes served by the V2 lane
(v2_lane.py) and documented here, so Swagger shows them with their bodies and examples."""

from collections.abc import Callable
from typing import Annotated, Any

from fastapi import APIRouter, Body, Path
from fastapi.routing import APIRoute
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute

from api_schemas.v2 import (
    InferenceRequest,
    InferenceResponse,
    ModelMetadata,
    ServerMetadata,
    V2Error,
)
from service import __version__

EXTENSIONS = ["binary_tensor_data"]
TAG = "KServe V2"

router = APIRouter(prefix="/v2", tags=[TAG])


@router.get("", summary="Server metadata")
async def server_metadata() -> ServerMetadata:
    """The server's name, version and the protocol extensions it supports."""
    return ServerMetadata(name="opserve", version=__version__, extensions=EXTENSIONS)


def _errors(*codes: int) -> dict[int | str, dict[str, Any]]:
    words = {400: "A bad request (Triton's INVALID_ARG): body, tensor, parameter or type",
             404: "Unknown model or version", 405: "Wrong method for the route",
             413: "Request body or output over the limits",
             415: "A form or text/plain Content-Type, or an unknown Content-Encoding"}  # fmt: skip
    return {code: {"model": V2Error, "description": words[code]} for code in codes}


Name = Annotated[str, Path(description="Model name: an operator (Tile) or a repository model",
                           examples=["Tile"])]  # fmt: skip
Version = Annotated[str, Path(description="Model version: an operator's since_version",
                              examples=["13"])]  # fmt: skip
Request = Annotated[InferenceRequest, Body()]

_INFER_200 = {200: {"description": "The outputs; with binary data, the JSON part is the first "
                    "Inference-Header-Content-Length bytes",
                    "content": {"application/octet-stream": {}}}}  # fmt: skip
_READY: dict[int | str, dict[str, Any]] = {400: {"description": "Not ready"}}


def documented_routes() -> list[BaseRoute]:
    """The model routes the V2 lane serves, as OpenAPI shows them."""

    async def metadata(name: Name) -> None: ...
    async def metadata_v(name: Name, version: Version) -> None: ...
    async def ready(name: Name) -> None: ...
    async def ready_v(name: Name, version: Version) -> None: ...
    async def infer(name: Name, request: Request) -> None: ...
    async def infer_v(name: Name, version: Version, request: Request) -> None: ...

    endpoints: dict[str, tuple[Callable[..., Any], Callable[..., Any]]] = {
        "": (metadata, metadata_v),
        "/ready": (ready, ready_v),
        "/infer": (infer, infer_v),
    }
    models = {"metadata": ModelMetadata, "ready": None, "infer": InferenceResponse}

    newest = " The newest version (an operator's highest since_version)."
    routes: list[BaseRoute] = []
    for suffix, (plain, versioned) in endpoints.items():
        for path, endpoint in (("/v2/models/{name}", plain),
                               ("/v2/models/{name}/versions/{version}", versioned)):  # fmt: skip
            kind = suffix.strip("/") or "metadata"
            doc = _DOCS[kind]
            description = doc[1] + (newest if endpoint is plain else "")
            responses = (_READY | _errors(404) if kind == "ready"
                         else _INFER_200 | _errors(400, 404, 405, 413, 415) if kind == "infer"
                         else _errors(404))  # fmt: skip
            routes.append(APIRoute(
                path + suffix, endpoint, methods=["POST" if kind == "infer" else "GET"],
                tags=[TAG], summary=doc[0], description=description, responses=responses,
                operation_id=f"v2_{kind}{'_version' if endpoint is versioned else ''}",
                response_model=models[kind],
                response_class=Response if kind == "ready" else JSONResponse,
            ))  # fmt: skip
    return routes


_DOCS = {
    "metadata": (
        "Model metadata",
        "Inputs and outputs with their V2 datatypes (`datatypes` "
        "lists every allowed one) and shapes (-1: any size), and, for an operator, its "
        "attributes and how each travels (request parameter or extra input).",
    ),
    "ready": (
        "Model readiness",
        "200 when the model takes requests, 400 when it does not "
        "(as Triton answers), 404 for an unknown model or version.",
    ),
    "infer": (
        "Run an inference",
        "The Open Inference Protocol with Triton's binary tensor data "
        "extension: inputs as JSON `data` or as `binary_data_size` bytes after the JSON "
        "(its length in the Inference-Header-Content-Length header); operator attributes "
        "as request `parameters`; gzip and deflate bodies both ways. See docs/v2.md.",
    ),
}
