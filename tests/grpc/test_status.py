"""The one table from domain errors to gRPC status codes (Triton's mapping), and what a refusal
carries: HTTP's text, a retry hint where HTTP sends Retry-After, never INTERNAL for input."""

import grpc
import pytest
from pydantic import BaseModel, ValidationError

from service.core.memory_budget import MemoryBudget
from service.errors import (
    AlreadyExists,
    BadRequest,
    InvalidInput,
    ModelNotReady,
    NotFound,
    PayloadTooLarge,
    RequestTimeout,
    RunCancelled,
    RunTimeout,
    ServiceError,
    Unauthorized,
    Unavailable,
    Unsupported,
    UnsupportedMediaType,
)
from service.grpc.status import RETRY_AFTER, grpc_status, refusal

Code = grpc.StatusCode


@pytest.mark.parametrize(("error", "code"), [
    (NotFound, Code.NOT_FOUND), (InvalidInput, Code.INVALID_ARGUMENT),
    (BadRequest, Code.INVALID_ARGUMENT), (ModelNotReady, Code.INVALID_ARGUMENT),
    (UnsupportedMediaType, Code.INVALID_ARGUMENT), (AlreadyExists, Code.ALREADY_EXISTS),
    (Unsupported, Code.UNIMPLEMENTED), (Unavailable, Code.UNAVAILABLE),
    (PayloadTooLarge, Code.RESOURCE_EXHAUSTED), (RequestTimeout, Code.DEADLINE_EXCEEDED),
    (Unauthorized, Code.UNAUTHENTICATED), (RunTimeout, Code.DEADLINE_EXCEEDED),
    (RunCancelled, Code.CANCELLED),
])  # fmt: skip
def test_every_domain_error_has_its_status(error: type[ServiceError], code: Code) -> None:
    assert grpc_status(error("x")) == code
    assert refusal(error("x"))[:2] == (code, "x")


def test_no_domain_error_falls_to_internal() -> None:
    """Each error the service raises for a request has a status of its own (or its base's);
    INTERNAL only where Triton's example clients check for it (PollFailed: a load's path
    component over NAME_MAX), and that one is 400 over HTTP, and for a run that crashed its
    isolated worker (WorkerDied: HTTP's 500, as Triton answers a backend's crash)."""
    import service.errors

    kinds = [k for k in vars(service.errors).values()
             if isinstance(k, type) and issubclass(k, ServiceError) and k is not ServiceError]  # fmt: skip
    internal = [kind for kind in kinds if grpc_status(kind("x")) == Code.INTERNAL]
    assert kinds and internal == [service.errors.PollFailed, service.errors.WorkerDied]
    assert service.errors.WorkerDied("x").status_code == 500
    assert service.errors.PollFailed("x").status_code == 400


def test_overloaded_carries_a_retry_hint_and_http_text() -> None:
    exc = MemoryBudget(16, 0).overloaded(64)
    code, details, hint = refusal(exc)
    assert (code, hint) == (Code.RESOURCE_EXHAUSTED, ((RETRY_AFTER, "1"),))
    assert details == str(exc)  # the very text HTTP's 503 carries


def test_located_errors_keep_their_location() -> None:
    exc = InvalidInput("bad", loc=("inputs", "x"))
    exc.operator = "Tile-13"
    assert refusal(exc)[1] == "Tile-13: inputs.x: bad"


def test_validation_errors_are_invalid_argument_and_bugs_internal() -> None:
    class Model(BaseModel):
        n: int

    with pytest.raises(ValidationError) as caught:
        Model.model_validate({"n": "x"})
    assert refusal(caught.value)[0] == Code.INVALID_ARGUMENT
    code, details, _ = refusal(RuntimeError("secret insides"))
    assert (code, details) == (Code.INTERNAL, "internal error; the request was logged")
