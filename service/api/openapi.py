"""The OpenAPI document: FastAPI's, plus the request models that routes validate themselves."""

from collections.abc import Callable
from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic.json_schema import models_json_schema

from api_schemas.models import ModelRunOptions, ModelRunRequest
from service.api import v2
from service.api.api_keys import OPEN_PREFIXES
from service.api.ops import documented_routes, request_models
from service.operators import registry
from service.operators.catalog import summary

MODEL_REQUESTS = [ModelRunRequest, ModelRunOptions]  # bodies the model routes read themselves
FIRST_OPERATOR = "Tile"
"""Swagger UI and ReDoc show the tags in the document's order: what a newcomer runs first (Tile,
the README's first call), the other operators, then the rest, from running to operating."""
GENERAL_TAGS = {
    "run by opset": "Run an operator at any opset number, or its newest version.",
    "models": "Run whole models: posted in the body, or from the model repository.",
    v2.TAG: "The KServe V2 / Open Inference Protocol, with Triton's binary tensor data "
    "extension: every operator version and repository model is a V2 model (docs/v2.md).",
    "health": "KServe V2 liveness and readiness probes.",
    "catalog": "The served operators, their versions and their signatures.",
    "operations": "Prometheus metrics, summed over the server's workers.",
}
SCHEME = "apiKey"
"""The security scheme of the document when OPSERVE_API_KEYS is set: Swagger UI's Authorize."""


def openapi_builder(app: FastAPI) -> Callable[[], dict[str, Any]]:
    """A cached `app.openapi` that also lists every operator version's request schema."""

    def build() -> dict[str, Any]:
        if app.openapi_schema is None:
            settings = app.state.settings
            document = get_openapi(title=app.title, version=app.version,
                                   description=app.description, tags=_tags(),
                                   routes=[*documented_routes(settings),
                                           *app.routes, *v2.documented_routes()])  # fmt: skip
            _, schemas = models_json_schema(
                [(model, "validation") for model in [*request_models(), *MODEL_REQUESTS]],
                ref_template="#/components/schemas/{model}",
            )
            components = document.setdefault("components", {}).setdefault("schemas", {})
            for name, schema in schemas.get("$defs", {}).items():
                components.setdefault(name, schema)
            if settings.api_keys.get_secret_value():
                _require_keys(document)
            app.openapi_schema = document
        return app.openapi_schema

    return build


def _tags() -> list[dict[str, str]]:
    """One tag per operator (Swagger UI and ReDoc group its versions under it), then the rest."""
    operators = sorted(registry.operators(), key=lambda op: op[1] != FIRST_OPERATOR)
    return [*({"name": op_type, "description": summary(versions[-1])}
              for _domain, op_type, versions in operators),
            *({"name": n, "description": d} for n, d in GENERAL_TAGS.items())]  # fmt: skip


def _require_keys(document: dict[str, Any]) -> None:
    """Declare the bearer key every route needs but the open ones (probes, metrics), so Swagger
    UI shows an Authorize button and sends the key with "Try it out"."""
    document["components"]["securitySchemes"] = {SCHEME: {
        "type": "http", "scheme": "bearer",
        "description": "One of the keys of OPSERVE_API_KEYS, sent as `Authorization: Bearer <key>`.",
    }}  # fmt: skip
    document["security"] = [{SCHEME: []}]
    for path, operations in document["paths"].items():
        if path.startswith(OPEN_PREFIXES):
            for operation in operations.values():
                operation["security"] = []  # answers without a key
