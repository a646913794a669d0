"""The one table from the service's domain errors to gRPC status codes (Triton's mapping,
grpc_utils.cc CodeToStatus), and what a refusal carries: the same text HTTP gives, and for an
overloaded server a retry hint in the trailing metadata (HTTP's Retry-After)."""

import logging
from typing import TypeAlias

import grpc
from pydantic import ValidationError

from service.errors import (
    AlreadyExists,
    BadRequest,
    InvalidInput,
    ModelNotReady,
    NotFound,
    Overloaded,
    PayloadTooLarge,
    PollFailed,
    RequestTimeout,
    RunCancelled,
    RunTimeout,
    ServiceError,
    Unauthorized,
    Unavailable,
    Unsupported,
    UnsupportedMediaType,
    WorkerOutOfMemory,
)

log = logging.getLogger("opserve")
Code: TypeAlias = grpc.StatusCode
RETRY_AFTER = "retry-after"
"""Trailing metadata key of the seconds to wait before trying again (as HTTP's header)."""

GRPC_STATUS: dict[type[ServiceError], Code] = {
    NotFound: Code.NOT_FOUND,
    InvalidInput: Code.INVALID_ARGUMENT,
    BadRequest: Code.INVALID_ARGUMENT,
    PollFailed: Code.INTERNAL,  # Triton's, which its example client checks (errors.py)
    ModelNotReady: Code.INVALID_ARGUMENT,  # HTTP V2's 400 (Triton's INVALID_ARG)
    UnsupportedMediaType: Code.INVALID_ARGUMENT,
    AlreadyExists: Code.ALREADY_EXISTS,
    Unsupported: Code.UNIMPLEMENTED,
    Unavailable: Code.UNAVAILABLE,
    Overloaded: Code.RESOURCE_EXHAUSTED,
    PayloadTooLarge: Code.RESOURCE_EXHAUSTED,
    RequestTimeout: Code.DEADLINE_EXCEEDED,
    RunTimeout: Code.DEADLINE_EXCEEDED,  # HTTP's 504
    RunCancelled: Code.CANCELLED,  # the client left or the server stops (HTTP logs 499)
    Unauthorized: Code.UNAUTHENTICATED,
    WorkerOutOfMemory: Code.RESOURCE_EXHAUSTED,  # HTTP's 507
}
"""Every domain error's gRPC status; an error of no kind here (a bug) is INTERNAL."""

Metadata = tuple[tuple[str, str], ...]


def grpc_status(exc: ServiceError) -> Code:
    """The status of a refusal: its class's, or its nearest base class's."""
    for kind in type(exc).__mro__:
        found = GRPC_STATUS.get(kind)
        if found is not None:
            return found
    return Code.DEADLINE_EXCEEDED if exc.status_code == 504 else Code.INTERNAL


def refusal(exc: Exception) -> tuple[Code, str, Metadata]:
    """The status, details and extra trailing metadata of a call that raised `exc`."""
    if isinstance(exc, ServiceError):
        retry = getattr(exc, "retry_after", None)
        hint: Metadata = ((RETRY_AFTER, str(retry)),) if retry is not None else ()
        return grpc_status(exc), str(exc), hint
    if isinstance(exc, ValidationError):  # as the HTTP V2 door: the first error's words
        return Code.INVALID_ARGUMENT, str(exc.errors()[0]["msg"]), ()
    log.exception("unexpected error in a gRPC call", exc_info=exc)
    return Code.INTERNAL, "internal error; the request was logged", ()
