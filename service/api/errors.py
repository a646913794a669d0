"""One error model: every refusal is `{"detail": "<where>: <what>", "errors": [...]}`."""

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from pydantic import ValidationError
from starlette.exceptions import HTTPException
from starlette.responses import Response

from service.api.responses import OrjsonResponse
from service.errors import ServiceError

log = logging.getLogger("opserve")

SHOWN_ERRORS = 10
_TAGS = {"json", "proto"}  # discriminator tags pydantic writes into error locations


def install(app: FastAPI) -> None:
    """Register the handlers that map every error class to its status and body."""
    app.add_exception_handler(ServiceError, _service_error)  # type: ignore[arg-type]
    app.add_exception_handler(ValidationError, _validation_error)  # type: ignore[arg-type]
    app.add_exception_handler(RequestValidationError, _validation_error)  # type: ignore[arg-type]
    app.add_exception_handler(HTTPException, _http_error)  # type: ignore[arg-type]
    app.add_exception_handler(Exception, _unexpected)


def service_error_content(exc: ServiceError, operator: str | None = None) -> dict[str, Any]:
    """The body of a domain error; `operator` is the version that ran, if one did."""
    errors = [{"loc": list(exc.loc), "msg": exc.detail}] if exc.loc else None
    exc.operator = exc.operator or operator
    return {"detail": str(exc), "errors": errors}


def validation_error_content(
    exc: ValidationError | RequestValidationError, operator: str | None = None
) -> dict[str, Any]:
    """The 422 body of a schema violation: each error with its field path, joined in `detail`."""
    every = exc.errors()
    errors: list[dict[str, Any]] = [  # a client can make 100,000 errors: the first few
        {"loc": [str(part)[:100] for part in e["loc"] if part not in _TAGS],
         "msg": _message(dict(e))[:1000]}
        for e in every[:SHOWN_ERRORS]
    ]  # fmt: skip
    detail = "; ".join(
        f"{'.'.join(map(str, e['loc']))}: {e['msg']}" if e["loc"] else str(e["msg"]) for e in errors
    )
    if len(every) > SHOWN_ERRORS:
        detail += f"; and {len(every) - SHOWN_ERRORS} more errors"
    return {"detail": f"{operator}: {detail}" if operator else detail, "errors": errors}


def unexpected_content(method: str, path: str) -> dict[str, Any]:
    """Log the exception being handled; the client learns nothing of its insides."""
    log.exception("unexpected error on %s %s", method, path)
    return {"detail": "internal error; the request was logged"}


async def _service_error(request: Request, exc: ServiceError) -> Response:
    operator = getattr(request.state, "operator", None)
    return OrjsonResponse(service_error_content(exc, operator), status_code=exc.status_code)


async def _validation_error(
    request: Request, exc: ValidationError | RequestValidationError
) -> Response:
    operator = getattr(request.state, "operator", None)
    return OrjsonResponse(validation_error_content(exc, operator), status_code=422)


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


async def _http_error(request: Request, exc: HTTPException) -> Response:
    return OrjsonResponse({"detail": str(exc.detail)}, status_code=exc.status_code,
                          headers=getattr(exc, "headers", None))  # fmt: skip


async def _unexpected(request: Request, exc: Exception) -> Response:
    return OrjsonResponse(unexpected_content(request.method, request.url.path), status_code=500)
