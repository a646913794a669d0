"""Domain errors. Each carries its HTTP status, so one handler renders them all."""


class ServiceError(Exception):
    """Base of every error the service answers with; `status_code` is the HTTP status."""

    status_code = 500

    def __init__(self, detail: str, *, loc: tuple[str | int, ...] = ()) -> None:
        super().__init__(detail)
        self.detail = detail
        self.loc = loc
        self.operator: str | None = None  # the version that refused, e.g. "Tile-13"

    def __str__(self) -> str:
        """`Tile-13: inputs.repeats: <what>`, leaving out the parts that are not known."""
        where = ".".join(str(part) for part in self.loc)
        parts = [part for part in (self.operator, where, self.detail) if part]
        return ": ".join(parts)


class NotFound(ServiceError):
    """Unknown operator, version or model."""

    status_code = 404


class PayloadTooLarge(ServiceError):
    """Request body, decoded tensor or operator output over a configured limit."""

    status_code = 413


class InvalidInput(ServiceError):
    """A well-formed request that breaks a schema, a type constraint or an operator's rules."""

    status_code = 422


class ModelNotReady(ServiceError):
    """A known model that does not take requests (it failed to load, or is unloading)."""

    status_code = 422


class AlreadyExists(ServiceError):
    """A name taken already (a shared memory region registered twice)."""

    status_code = 409


class Unsupported(ServiceError):
    """A feature this server does not offer, or not as configured (client shared memory while
    OPSERVE_ALLOW_CLIENT_SHM is off, CUDA shared memory): Triton's UNSUPPORTED."""

    status_code = 501


class Unavailable(ServiceError):
    """A request the server cannot take in its present state (model control in another mode,
    shutting down): Triton's UNAVAILABLE."""

    status_code = 503


class BadRequest(ServiceError):
    """A body that is not what the route takes at all: malformed JSON, form or header."""

    status_code = 400


class PollFailed(BadRequest):
    """What Triton answers "failed to poll from model repository" with INTERNAL because its
    file system refused it (a `file:` path component over NAME_MAX): gRPC keeps Triton's
    INTERNAL, which its example client checks; HTTP answers 400, a client's mistake."""


class located:
    """Prefix `loc` to the location of any ServiceError raised in the block.

    A plain class rather than @contextmanager: it is entered several times per request."""

    __slots__ = ("loc",)

    def __init__(self, *loc: str | int) -> None:
        self.loc = loc

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: type | None, error: BaseException | None, tb: object) -> None:
        if isinstance(error, ServiceError):
            error.loc = (*self.loc, *error.loc)


def shown_int(value: int) -> str:
    """An integer for a message: str() of one over 4300 digits raises, and clients send them."""
    return str(value) if abs(value) < 10**30 else f"<a {value.bit_length()}-bit number>"


def shown_shape(shape: tuple[int, ...] | list[int]) -> str:
    """A shape for a message, every dimension through `shown_int`."""
    return f"[{', '.join(shown_int(int(dim)) for dim in shape)}]"


class RequestTimeout(ServiceError):
    """The client did not send its whole body within the deadline (OPSERVE_BODY_TIMEOUT_SECONDS)."""

    status_code = 408


class UnsupportedMediaType(ServiceError):
    """A body whose Content-Type the route does not take."""

    status_code = 415


class Unauthorized(ServiceError):
    """No valid API key (OPSERVE_API_KEYS) in `Authorization: Bearer <key>`."""

    status_code = 401


class Overloaded(ServiceError):
    """The memory budget could not spare a large request its share in time, or the kernel
    threads' queue is full: try again soon."""

    status_code = 503
    retry_after = 1  # seconds, sent as Retry-After


class RunTimeout(ServiceError):
    """A model run still going after OPSERVE_MAX_RUN_SECONDS: stopped, what it held freed; the
    text names the node that was running (gRPC: DEADLINE_EXCEEDED)."""

    status_code = 504


class WorkerDied(ServiceError):
    """A run ended its isolated worker process (native code of a client's model crashed, or
    the worker was killed from outside): that run fails, nothing else is touched."""

    status_code = 500


class WorkerOutOfMemory(ServiceError):
    """A run's isolated worker process was killed for memory (the system's out-of-memory
    killer): HTTP's 507, as a store that has no room for the answer."""

    status_code = 507


class RunCancelled(ServiceError):
    """A run stopped because no one waits for its answer any more: its client left, or the
    server is shutting down. Logged as 499 (nginx's "client closed request"); never a 5xx
    (gRPC: CANCELLED)."""

    status_code = 499


def listed(names: "list[str] | tuple[str, ...]", shown: int = 10, width: int = 100,
           sep: str = ", ") -> str:  # fmt: skip
    """Names for an error text: the first `shown`, each cut to `width` characters, and how
    many more there are (a client may send 100,000 unknown names)."""
    head = sep.join(name[:width] for name in names[:shown])
    more = len(names) - shown
    return f"{head} and {more} more" if more > 0 else head
