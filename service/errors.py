"""Domain errors. Each carries its HTTP status, so one handler renders them all."""


class ServiceError(Exception):
    """Base of every error the service answers with; `status_code` is the HTTP status."""

    status_code = 500

    def __init__(self, detail: str, *, loc: tuple[str | int, ...] = ()) -> None:
        super().__init__(detail)
        self.detail = detail
        self.loc = loc

    def __str__(self) -> str:
        where = ".".join(str(part) for part in self.loc)
        return f"{where}: {self.detail}" if where else self.detail


class NotFound(ServiceError):
    """Unknown operator, version or model."""

    status_code = 404


class PayloadTooLarge(ServiceError):
    """Request body, decoded tensor or operator output over a configured limit."""

    status_code = 413


class InvalidInput(ServiceError):
    """A well-formed request that breaks a schema, a type constraint or an operator's rules."""

    status_code = 422


class BadRequest(ServiceError):
    """A body that is not what the route takes at all: malformed JSON, form or header."""

    status_code = 400


def at(error: ServiceError, *loc: str | int) -> ServiceError:
    """Prefix the error's location with `loc` (the caller knows where it decoded)."""
    error.loc = (*loc, *error.loc)
    return error
