"""Example answers for the OpenAPI document, made by running the service's own code.

Each route's example response is what that route answers to its own example request, and each
error example is an error the service really raises and renders, so Swagger UI shows the answer
a user will get (a Constant-1 route shows a Constant-1 answer, a 413 shows a 413) and no example
goes stale when messages change.
"""

from typing import Any

import orjson
from pydantic import BaseModel, ValidationError

from service.api.body_limit import too_large
from service.api.content_type import JSON, check_content_type
from service.api.errors import service_error_content, validation_error_content
from service.api.responses import dumps
from service.codecs.limits import Limits
from service.core.deadlines import body_timeout
from service.core.memory_budget import MemoryBudget
from service.errors import NotFound, PayloadTooLarge, ServiceError
from service.kernels.context import KernelContext
from service.operators import registry
from service.operators.invoke import invoke
from service.operators.registry import OpVersion

MiB = 1024 * 1024


def request_example(model: type[BaseModel]) -> dict[str, Any]:
    """The first example a request model documents."""
    extra = model.model_config.get("json_schema_extra")
    assert isinstance(extra, dict), f"{model.__name__} documents no example request"
    example: dict[str, Any] = extra["examples"][0]  # type: ignore[index,assignment]
    return example


def ok_example(op: OpVersion, request: dict[str, Any]) -> dict[str, Any]:
    """The answer of `op` to an example request (examples are small: generous budget)."""
    body = orjson.dumps(request)
    answer = invoke(op, body, Limits(), KernelContext(max_output_bytes=MiB))
    return orjson.loads(dumps(answer))  # as the client reads it: numpy arrays become lists


def unknown_input_example(op: OpVersion) -> dict[str, Any]:
    """The 422 the version answers for an input it does not have."""
    body = orjson.dumps({"inputs": {"nope": {"dtype": "float", "data": [1.0]}}})
    try:
        invoke(op, body, Limits(), KernelContext(max_output_bytes=MiB))
    except ValidationError as exc:
        return validation_error_content(exc, op.name)
    raise AssertionError(f"{op.name} accepted an unknown input")


def not_found_example(op_type: str) -> dict[str, Any]:
    """The 404 for a misspelt operator name (`tile` for `Tile`)."""
    try:
        registry.resolve(op_type.lower() if op_type != op_type.lower() else op_type.upper())
    except NotFound as exc:
        return service_error_content(exc)
    raise AssertionError(f"{op_type!r} resolved in both cases")


def too_large_example(
    max_request_bytes: int, operator: str | None = None, body_bytes: int | None = None
) -> dict[str, Any]:
    """The 413 for a Content-Length of `body_bytes` (twice the limit by default)."""
    what = f"of {body_bytes or 2 * max_request_bytes} bytes (Content-Length) is"
    error: ServiceError = PayloadTooLarge(too_large(what, max_request_bytes))
    return service_error_content(error, operator)


def unsupported_media_example(operator: str) -> dict[str, Any]:
    """The 415 for a body sent as text/plain (as a browser's cross-site form would)."""
    try:
        check_content_type({"headers": [(b"content-type", b"text/plain")]}, JSON)
    except ServiceError as exc:
        return service_error_content(exc, operator)
    raise AssertionError("text/plain was accepted")


def timeout_example(seconds: float, operator: str) -> dict[str, Any]:
    """The 408 for a body that did not arrive within the deadline."""
    return service_error_content(body_timeout(seconds), operator)


def overloaded_example(budget: MemoryBudget, operator: str) -> dict[str, Any]:
    """The 503 for a large request whose memory share was not free in time."""
    return service_error_content(budget.overloaded(64 * MiB), operator)


def json_content(example: dict[str, Any]) -> dict[str, Any]:
    """A response's `content` entry holding one example."""
    return {"application/json": {"example": example}}
