"""v1 model routes: run a posted model (JSON or multipart), list and run repository models.

The routes only do HTTP: read the body in its form, then hand the work to service/runtime on
the kernel threads (the Offloader), off the event loop."""

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from functools import partial
from typing import Annotated, Any

from fastapi import APIRouter, Path, Request
from pydantic import ValidationError
from starlette.datastructures import UploadFile
from starlette.responses import Response

from api_schemas.models import (
    ModelRunOptions,
    ModelRunRequest,
    ModelRunResponse,
    RepositoryIndex,
)
from api_schemas.responses import ErrorResponse
from service.api.body_limit import body_timeout
from service.api.responses import OrjsonResponse
from service.errors import (
    BadRequest,
    InvalidInput,
    ServiceError,
    UnsupportedMediaType,
)
from service.runtime.repository import ModelRepository
from service.runtime.serve import describe_entry, run_entry, run_posted

MAX_FORM_FIELDS = 4  # `model` and `request`, with room to name the extra one in the error
_ERRORS = {
    400: "Malformed JSON or multipart body (too many parts, a part too large)",
    408: "The body did not arrive within OPSERVE_BODY_TIMEOUT_SECONDS",
    404: "Unknown model or version",
    413: "Request body, a tensor, an output or the graph's live intermediates over the limits",
    415: "A body neither application/json nor multipart/form-data",
    422: "A model or request the service refuses: every node it cannot run, a bad input, ...",
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
                    "one JSON object (inputs, outputs, output_format, trace); {} by default",
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
    models = [{"name": name, "versions": [describe_entry(e) for e in
                                          repository.versions(name).values()]}
              for name in repository.names()]  # fmt: skip
    return RepositoryIndex.model_validate({"models": models})


@router.post("/run", summary="Run a model sent in the body", response_model=ModelRunResponse,
             openapi_extra=_RUN_BODY)  # fmt: skip
async def run_model(request: Request) -> Response:
    """The model travels base64 in a JSON body, or as the file part `model` of a
    multipart/form-data body whose field `request` holds the other fields as one JSON object.
    Nodes run on the service's kernels (or onnx.reference, with OPSERVE_REFERENCE_FALLBACK);
    every node that cannot run is refused, in one answer, before anything runs."""
    state = request.app.state
    model: str | bytes
    if _media_type(request) == "multipart/form-data":
        model, options = await _multipart(request, state.settings.max_request_bytes)
    else:
        parsed = ModelRunRequest.model_validate_json(await _json_body(request))
        model, options = parsed.model, parsed  # a ModelRunRequest is a ModelRunOptions
    work = partial(run_posted, model, options, state.settings, state.limits)
    return await _offloaded(request, work)


@router.post("/{name}/run", summary="Run a repository model's newest version",
             response_model=ModelRunResponse, openapi_extra=_OPTIONS_BODY)  # fmt: skip
async def run_newest(request: Request, name: ModelName) -> Response:
    """The body of `POST /v1/models/run` without `model` (JSON only); an empty body runs the
    model on its initializer defaults."""
    return await _run_entry(request, name, None)


@router.post("/{name}/versions/{version}/run", summary="Run one version of a repository model",
             response_model=ModelRunResponse, openapi_extra=_OPTIONS_BODY)  # fmt: skip
async def run_version(request: Request, name: ModelName, version: Version) -> Response:
    """The body of `POST /v1/models/run` without `model` (JSON only)."""
    return await _run_entry(request, name, version)


async def _run_entry(request: Request, name: str, version: int | None) -> Response:
    state = request.app.state
    entry = state.repository.get(name, version)
    body = await _json_body(request, empty_ok=True)
    options = ModelRunOptions.model_validate_json(body) if body else ModelRunOptions()
    return await _offloaded(request, partial(run_entry, entry, options, state.limits))


async def _offloaded(request: Request, work: Callable[[], dict[str, Any]]) -> Response:
    return OrjsonResponse(await request.app.state.offloader.on_thread(work))


@asynccontextmanager
async def _deadline(request: Request) -> AsyncIterator[None]:
    """408 when the body has not all arrived within OPSERVE_BODY_TIMEOUT_SECONDS."""
    seconds = request.app.state.settings.body_timeout_seconds
    try:
        async with asyncio.timeout(seconds):
            yield
    except TimeoutError:
        raise body_timeout(seconds) from None


def _media_type(request: Request) -> str:
    return request.headers.get("content-type", "").partition(";")[0].strip().lower()


async def _json_body(request: Request, empty_ok: bool = False) -> bytes:
    media = _media_type(request)
    if media != "application/json" and not (empty_ok and media == ""):
        allowed = "application/json" if empty_ok else "application/json or multipart/form-data"
        raise UnsupportedMediaType(f"the body must be {allowed}, not {media[:100] or 'untyped'}")
    async with _deadline(request):
        return await request.body()


async def _multipart(request: Request, max_bytes: int) -> tuple[bytes, ModelRunOptions]:
    """The `model` file part and the `request` field, with the number and size of parts bound
    (Starlette answers 400 past them while it streams, before it buffers more)."""
    async with (
        _deadline(request),
        request.form(max_files=1, max_fields=MAX_FORM_FIELDS, max_part_size=max_bytes) as form,
    ):
        unknown = sorted(set(form) - {"model", "request"})
        if unknown:
            raise BadRequest(f"unknown form field {unknown[0][:100]!r}; the fields are model "
                             "(a file) and request (JSON)")  # fmt: skip
        model, fields = form.get("model"), form.get("request") or "{}"
        if not isinstance(model, UploadFile):
            raise BadRequest("the form needs the model as a file part named 'model'")
        if not isinstance(fields, str):
            raise BadRequest("the form field 'request' must be text (JSON), not a file")
        data = await model.read()
    try:
        return data, ModelRunOptions.model_validate_json(fields)
    except ValidationError as exc:
        raise _in_request_field(exc) from None


def _in_request_field(exc: ValidationError) -> ServiceError:
    error = exc.errors()[0]
    where = ".".join(str(p) for p in error["loc"] if p not in ("json", "proto"))
    return InvalidInput(f"{where}: {error['msg']}" if where else str(error["msg"]),
                        loc=("request",))  # fmt: skip
