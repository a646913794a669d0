"""One error model: every refusal is `{"detail": "<where>: <what>", "errors": [...]}`."""

import logging
import re
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from pydantic import ValidationError
from starlette.exceptions import HTTPException
from starlette.responses import Response

from service.api.responses import OrjsonResponse
from service.errors import ServiceError

log = logging.getLogger("opserve")

_TAGS = {"json", "proto"}  # discriminator tags pydantic writes into error locations


def install(app: FastAPI) -> None:
    """Register the handlers that map every error class to its status and body."""
    app.add_exception_handler(ServiceError, _service_error)  # type: ignore[arg-type]
    app.add_exception_handler(ValidationError, _validation_error)  # type: ignore[arg-type]
    app.add_exception_handler(RequestValidationError, _validation_error)  # type: ignore[arg-type]
    app.add_exception_handler(HTTPException, _http_error)  # type: ignore[arg-type]
    app.add_exception_handler(Exception, _unexpected)


async def _service_error(request: Request, exc: ServiceError) -> Response:
    errors = [{"loc": list(exc.loc), "msg": exc.detail}] if exc.loc else None
    return OrjsonResponse({"detail": _naming_operator(request, str(exc)), "errors": errors},
                          status_code=exc.status_code)  # fmt: skip


async def _validation_error(
    request: Request, exc: ValidationError | RequestValidationError
) -> Response:
    errors: list[dict[str, Any]] = [
        {"loc": [part for part in e["loc"] if part not in _TAGS], "msg": _message(dict(e))}
        for e in exc.errors()
    ]
    detail = "; ".join(
        f"{'.'.join(map(str, e['loc']))}: {e['msg']}" if e["loc"] else str(e["msg"]) for e in errors
    )
    return OrjsonResponse({"detail": _naming_operator(request, detail), "errors": errors},
                          status_code=422)  # fmt: skip


def _message(error: dict[str, Any]) -> str:
    if error["type"] == "json_invalid":
        return f"the body is not valid JSON: {error.get('ctx', {}).get('error', error['msg'])}"
    if error["type"] == "extra_forbidden":  # pydantic says "Extra inputs", even for attributes
        loc = error["loc"]
        kind = {"inputs": "input", "attributes": "attribute"}.get(loc[0]) if len(loc) == 2 else None
        return f"unknown {kind or 'field'} {loc[-1]!r}"
    if error["type"] == "value_error" and "error" in error.get("ctx", {}):
        return str(error["ctx"]["error"])  # our validator's words, without "Value error, "
    return str(error["msg"])


def _naming_operator(request: Request, detail: str) -> str:
    """Prefix the operator version that ran (`request.state.operator`, set by the ops routes),
    unless the message already names it."""
    operator = getattr(request.state, "operator", None)
    if operator is None or re.search(rf"(?<![\w-]){re.escape(operator)}(?!\d)", detail):
        return detail  # kernels and type checks name it already ("Tile-1", never "Tile-13")
    return f"{operator}: {detail}"


async def _http_error(request: Request, exc: HTTPException) -> Response:
    return OrjsonResponse({"detail": str(exc.detail)}, status_code=exc.status_code,
                          headers=getattr(exc, "headers", None))  # fmt: skip


async def _unexpected(request: Request, exc: Exception) -> Response:
    log.exception("unexpected error on %s %s", request.method, request.url.path)
    return OrjsonResponse({"detail": "internal error; the request was logged"}, status_code=500)
