"""REST routes of the operators: the catalog, and one POST route per schema version."""

from functools import partial
from typing import Annotated, Any

from fastapi import APIRouter, FastAPI, Path, Request
from starlette.responses import Response

from api_schemas.catalog import Catalog, OperatorVersion
from api_schemas.requests import AnyOpRequest
from api_schemas.responses import ErrorResponse, OpResponse
from service.api.responses import dumps
from service.kernels.context import KernelContext
from service.operators import registry
from service.operators.catalog import catalog, describe, summary
from service.operators.invoke import invoke
from service.operators.registry import OpVersion

ERRORS: dict[int | str, dict[str, Any]] = {
    status: {"model": ErrorResponse, "description": text}
    for status, text in ((404, "Unknown operator or version"),
                         (413, "Request body or output over the limits"),
                         (422, "The request breaks a schema, type constraint or operator rule"))
}  # fmt: skip

router = APIRouter(prefix="/v1/ops", responses=ERRORS)


def _body_schema(model: str) -> dict[str, Any]:
    """Document a body the route reads itself (validated from bytes by a precompiled model)."""
    schema = {"$ref": f"#/components/schemas/{model}"}
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": schema}}}}


OpType = Annotated[str, Path(description="ONNX operator, e.g. Tile", examples=["Shape"])]
Opset = Annotated[int, Path(description="Any opset number; the schema version in force "
                            "at that opset runs", examples=[17], ge=1)]  # fmt: skip


@router.get("", tags=["catalog"], summary="List every operator and its versions")
async def list_operators() -> Catalog:
    return catalog()


@router.get("/{op_type}/{version}", tags=["catalog"], summary="Describe one operator version")
async def describe_version(op_type: OpType, version: Opset) -> OperatorVersion:
    return describe(registry.resolve(op_type, version))


async def execute(op: OpVersion, request: Request) -> Response:
    """Read the body, run the operator inline or on a worker thread, answer with orjson bytes."""
    state = request.app.state
    body = await request.body()
    work = partial(_work, op, body, state)
    return Response(await state.offloader.run(work, len(body)), media_type="application/json")


def _work(op: OpVersion, body: bytes, state: Any, inline_bytes: int | None) -> bytes:
    ctx = KernelContext(state.settings.max_output_bytes, inline_bytes)
    return dumps(invoke(op, body, state.limits, ctx))


@router.post("/{op_type}/{version}", tags=["run by opset"], response_model=OpResponse,
             summary="Run the version in force at an opset",
             openapi_extra=_body_schema("AnyOpRequest"))  # fmt: skip
async def run_at_opset(op_type: OpType, version: Opset, request: Request) -> Response:
    """`POST /v1/ops/Shape/17` runs Shape-15 and says so in `version`; the body is that of the
    resolved version (see its own route)."""
    return await execute(registry.resolve(op_type, version), request)


@router.post(
    "/{op_type}",
    tags=["run by opset"],
    response_model=OpResponse,
    summary="Run the newest version",
    openapi_extra=_body_schema("AnyOpRequest"),
)
async def run_newest(op_type: OpType, request: Request) -> Response:
    return await execute(registry.resolve(op_type), request)


def add_version_routes(app: FastAPI) -> None:
    """One POST route per served (operator, since_version), each with its own request model.

    They are added to the app before `router`, so the static paths win over the opset form.
    """
    for _domain, op_type, versions in registry.operators():
        for op in versions:
            app.add_api_route(
                f"/v1/ops/{op_type}/{op.since_version}",
                _version_endpoint(op),
                methods=["POST"],
                response_model=OpResponse,
                responses=ERRORS,
                tags=[op_type],
                summary=f"Run {op.name}",
                description=_version_description(op),
                operation_id=f"run_{op_type}_{op.since_version}",
                openapi_extra=_body_schema(op.request.__name__),
            )


def _version_endpoint(op: OpVersion) -> Any:
    async def run_version(request: Request) -> Response:
        return await execute(op, request)

    run_version.__name__ = f"run_{op.op_type}_{op.since_version}"
    return run_version


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
