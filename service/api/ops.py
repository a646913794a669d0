"""REST routes of the operators: the catalog, and one POST route per schema version.

Serving and documenting are split for speed. `OperatorLane` (operator_lane.py) serves
`/v1/ops/{op_type}/{version}`, which resolves the opset (an exact since_version resolves to
itself), and `/v1/ops/{op_type}`, the newest version. Each version's own routes
(`GET` and `POST /v1/ops/Tile/13`, the POST with its own request model) are documented from
`documented_routes()`, so a request costs one path parse instead of a scan over 29 routes.
"""

from typing import Annotated, Any

from fastapi import APIRouter, FastAPI, Path
from fastapi.routing import APIRoute
from pydantic import BaseModel
from starlette.routing import BaseRoute, Route

from api_schemas.catalog import Catalog, OperatorVersion
from api_schemas.requests import AnyOpRequest
from api_schemas.responses import ErrorResponse, OpResponse
from service.api import examples
from service.api.operator_lane import OperatorLane
from service.core.memory_budget import MemoryBudget
from service.operators import registry
from service.operators.catalog import catalog, describe, summary
from service.operators.registry import OpVersion
from service.settings import Settings

_ERROR_TEXT = {
    404: "Unknown operator or version",
    408: "The body did not arrive within OPSERVE_BODY_TIMEOUT_SECONDS",
    413: "Request body, output, encoded answer or memory share over the limits",
    415: "A Content-Type other than application/json",
    422: "The request breaks a schema, type constraint or operator rule",
    503: "The memory budget had no room in time; retry after Retry-After",
}

OpType = Annotated[str, Path(description="ONNX operator, e.g. Tile", examples=["Shape"])]
Opset = Annotated[int, Path(description="Any opset number; the schema version in force "
                            "at that opset runs", examples=[17], ge=1)]  # fmt: skip

catalog_router = APIRouter(prefix="/v1/ops", tags=["catalog"])


@catalog_router.get("", summary="List every operator and its versions")
async def list_operators() -> Catalog:
    """Every served operator with its since_versions, oldest first, and its newest."""
    return catalog()


async def describe_version(op_type: OpType, version: Opset) -> OperatorVersion:
    """The version in force at opset `version`: its formal inputs and outputs with their
    element types, its attributes (type, default, required) and its type constraints."""
    return describe(registry.resolve(op_type, version))


def install(app: FastAPI, lane: OperatorLane) -> None:
    """Route the operator paths to `lane` (first in the table) and add the catalog."""
    serving = [
        # one route for both methods, so a 405 there lists every method the path takes
        Route("/v1/ops/{op_type}/{version}", lane, methods=["GET", "POST"]),
        Route("/v1/ops/{op_type}", lane, methods=["POST"]),
    ]
    app.router.routes[:0] = serving
    app.include_router(catalog_router)


def documented_routes(settings: Settings) -> list[BaseRoute]:
    """The routes served by `install`'s plain routes, as OpenAPI shows them: the describe
    GET, one POST per served version, then the opset and newest forms. Each shows its own
    example answers (examples.py runs the examples to make them)."""
    unknown = {404: examples.not_found_example("Shape")}
    routes: list[BaseRoute] = [
        APIRoute("/v1/ops/{op_type}/{version}", describe_version, methods=["GET"],
                 tags=["catalog"], summary="Describe one operator version",
                 responses=_errors(unknown))
    ]  # fmt: skip
    for _domain, op_type, versions in registry.operators():
        for op in versions:
            routes.append(_described(op))
            routes.append(_documented(
                f"/v1/ops/{op_type}/{op.since_version}", op, settings, known=True,
                model=op.request, tags=[op_type], summary=f"Run {op.name}",
                description=_version_description(op),
                operation_id=f"run_{op_type}_{op.since_version}",
            ))  # fmt: skip
    routes.append(_documented(  # the path examples: Shape at opset 17, which runs Shape-15
        "/v1/ops/{op_type}/{version}", registry.resolve("Shape", 17), settings,
        model=AnyOpRequest, tags=["run by opset"],
        summary="Run the version in force at an opset", operation_id="run_at_opset",
        description="`POST /v1/ops/Shape/17` runs Shape-15 and says so in `version`. The body "
        "is that of the resolved version (see its own route).",
    ))  # fmt: skip
    routes.append(_documented(
        "/v1/ops/{op_type}", registry.resolve("Shape"), settings,
        model=AnyOpRequest, tags=["run by opset"],
        summary="Run the newest version", operation_id="run_newest",
        description="The body is that of the operator's newest version (see its own route).",
    ))  # fmt: skip
    return routes


def _errors(answers: dict[int, dict[str, Any]]) -> dict[int | str, dict[str, Any]]:
    """OpenAPI `responses` for error answers, each with its own example."""
    return {status: {"model": ErrorResponse, "description": _ERROR_TEXT[status],
                     "content": examples.json_content(example)}
            for status, example in answers.items()}  # fmt: skip


def _documented(
    path: str,
    op: OpVersion,
    settings: Settings,
    *,
    model: type[BaseModel],
    known: bool = False,
    **doc: Any,
) -> APIRoute:
    """A POST route whose body is a `model`, shown answering its example as `op`. `known`: the
    path names a served version, so it cannot answer 404."""
    request = examples.request_example(model)
    budget = MemoryBudget(settings.memory_budget_bytes, settings.memory_wait_seconds)
    answers = {408: examples.timeout_example(settings.body_timeout_seconds, op.name),
               413: examples.too_large_example(settings.max_request_bytes, op.name),
               415: examples.unsupported_media_example(op.name),
               422: examples.unknown_input_example(op),
               503: examples.overloaded_example(budget, op.name)}  # fmt: skip
    if not known:
        answers[404] = examples.not_found_example(op.op_type)
    responses: dict[int | str, dict[str, Any]] = {
        200: {"content": examples.json_content(examples.ok_example(op, request))},
        **_errors(answers),
    }

    async def documented(op_type: OpType, version: Opset) -> None: ...

    async def documented_newest(op_type: OpType) -> None: ...

    async def documented_version() -> None: ...

    endpoint = (documented if "{version}" in path
                else documented_newest if "{op_type}" in path else documented_version)  # fmt: skip
    schema = {"$ref": f"#/components/schemas/{model.__name__}"}
    body = {"requestBody": {"required": True, "content": {"application/json": {"schema": schema}}}}
    return APIRoute(path, endpoint, methods=["POST"], response_model=OpResponse,
                    responses=responses, openapi_extra=body, **doc)  # fmt: skip


def _described(op: OpVersion) -> APIRoute:
    async def describe_this_version() -> OperatorVersion:
        return describe(op)

    return APIRoute(f"/v1/ops/{op.op_type}/{op.since_version}", describe_this_version,
                    methods=["GET"], tags=[op.op_type], summary=f"Describe {op.name}",
                    description=f"The formal signature of {op.name}, as onnx.defs states it.",
                    operation_id=f"describe_{op.op_type}_{op.since_version}")  # fmt: skip


def _version_description(op: OpVersion) -> str:
    info = describe(op)
    params = "\n".join(f"- `{p.name}` ({p.type_param}): {', '.join(p.types)}"
                       for p in info.inputs + info.outputs)  # fmt: skip
    return f"{summary(op)}\n\nInputs and outputs with their allowed element types:\n\n{params}"


def request_models() -> list[type]:
    """The request model of every served version, for the OpenAPI components."""
    seen: dict[str, type] = {"AnyOpRequest": AnyOpRequest}
    for _domain, _op_type, versions in registry.operators():
        for op in versions:
            seen[op.request.__name__] = op.request
    return list(seen.values())
