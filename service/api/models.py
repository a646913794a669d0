"""v1 model routes: list the repository's models; run a posted model (JSON or multipart) or a
repository model.

The runs are served by the model lane (model_lane.py), in front of FastAPI like the operator
lane, so they are held to the body reader, the memory budget, the answer limit, the run
deadline and the send timeout; the POST routes here only document them."""

from typing import Annotated, Any

from fastapi import APIRouter, Path, Request

from api_schemas.models import (
    ModelRunResponse,
    RepositoryIndex,
)
from api_schemas.responses import ErrorResponse
from service.runtime.repository import ModelRepository
from service.runtime.serve import describe_entry

_ERRORS = {
    400: "Malformed JSON or multipart body (too many parts, a part too large)",
    408: "The body did not arrive within OPSERVE_BODY_TIMEOUT_SECONDS",
    404: "Unknown model or version",
    413: "Request body, a tensor, an output or the graph's live intermediates over the limits",
    415: "A body neither application/json nor multipart/form-data",
    422: "A model or request the service refuses: every node it cannot run, a bad input, ...",
    503: "The memory budget or the kernel threads' queue had no room; retry after Retry-After",
    504: "The run took longer than OPSERVE_MAX_RUN_SECONDS (the text names the node)",
}
ERRORS: dict[int | str, dict[str, Any]] = {
    status: {"model": ErrorResponse, "description": text} for status, text in _ERRORS.items()
}
_MULTIPART = {"schema": {
    "type": "object", "required": ["model"],
    "properties": {
        "model": {"type": "string", "format": "binary",
                  "description": "The model file (a serialized onnx.ModelProto)"},
        "request": {"type": "string", "description": "The other fields of the JSON body, as "
                    "one JSON object (inputs, outputs, output_format, trace, engine); {} by default",
                    "examples": ['{"inputs": {"x": {"dtype": "float", "data": [[1, 2, 3]]}}}']},
    },
}}  # fmt: skip
_RUN_BODY = {"requestBody": {"required": True, "content": {
    "application/json": {"schema": {"$ref": "#/components/schemas/ModelRunRequest"}},
    "multipart/form-data": _MULTIPART,
}}}  # fmt: skip
_OPTIONS_BODY = {"requestBody": {"required": False, "content": {
    "application/json": {"schema": {"$ref": "#/components/schemas/ModelRunOptions"}},
}}}  # fmt: skip

ModelName = Annotated[str, Path(description="A model of the repository",
                                examples=["tile_shape"])]  # fmt: skip
Version = Annotated[int, Path(description="One of the model's versions", examples=[1], ge=1)]


router = APIRouter(prefix="/v1/models", tags=["models"], responses=ERRORS)


@router.get("", summary="List the repository's models")
async def list_models(request: Request) -> RepositoryIndex:
    """Every repository model with its versions: ready or not (and why), inputs and outputs."""
    repository: ModelRepository = request.app.state.repository
    models = [{"name": name, "reason": repository.error(name),
               "versions": [describe_entry(e) for e in repository.versions(name).values()]}
              for name in repository.names()]  # fmt: skip
    return RepositoryIndex.model_validate({"models": models})


@router.post("/run", summary="Run a model sent in the body", response_model=ModelRunResponse,
             openapi_extra=_RUN_BODY)  # fmt: skip
async def run_model() -> None:
    """The model travels base64 in a JSON body, or as the file part `model` of a
    multipart/form-data body whose field `request` holds the other fields as one JSON object.
    Nodes run on the service's kernels (or onnx.reference, with OPSERVE_REFERENCE_FALLBACK);
    every node that cannot run is refused, in one answer, before anything runs. With
    `"engine": "onnxruntime"` the model runs whole on onnxruntime instead (not with a trace)."""


@router.post("/{name}/run", summary="Run a repository model's newest version",
             response_model=ModelRunResponse, openapi_extra=_OPTIONS_BODY)  # fmt: skip
async def run_newest(name: ModelName) -> None:
    """The body of `POST /v1/models/run` without `model` (JSON only); an empty body runs the
    model on its initializer defaults."""


@router.post("/{name}/versions/{version}/run", summary="Run one version of a repository model",
             response_model=ModelRunResponse, openapi_extra=_OPTIONS_BODY)  # fmt: skip
async def run_version(name: ModelName, version: Version) -> None:
    """The body of `POST /v1/models/run` without `model` (JSON only)."""
