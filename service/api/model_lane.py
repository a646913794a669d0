"""The v1 model runs as one raw ASGI app, held to every bound the operator lane keeps.

`ModelLane` answers `POST /v1/models/run` (a posted model, JSON or multipart/form-data) and
`POST /v1/models/{name}[/versions/{version}]/run` (a repository model). The body is read with
the shared bounded reader (deadline, size limit, reserved from the memory budget as it
arrives); parsing, loading, the run and the encoding happen on a kernel thread through
core.execution (claims, answer limit, run deadline, stopped when the client leaves). A small
JSON body (under INLINE_BODY_BYTES, as a V2 call's) is tried inline first, on a repository
model that may run inline or a posted model kept on onnxruntime (whose run the loop awaits in
a worker); anything else it meets (a load, a large output) sends it to a thread. The
answer goes out with send_answer (slices, send timeout; large tensors encoded as they are
sent). FastAPI only documents these routes (api/models.py).
"""

from time import perf_counter_ns
from typing import Any

from pydantic import ValidationError
from starlette.types import ASGIApp, Receive, Scope, Send

from api_schemas.models import ModelRunOptions, ModelRunRequest, PostedRunOptions
from service.api.body_limit import ClientGone, content_length, read_body, too_large, until_gone
from service.api.errors import service_error_content, unexpected_content, validation_error_content
from service.api.form_body import parse_form, part_bytes
from service.api.lane import Guards, Lane
from service.api.observe import observe
from service.api.responses import dumps
from service.api.send_answer import Answer, refusal_headers, send_answer
from service.codecs.json_tensor import json_body_memory
from service.codecs.limits import Limits
from service.codecs.wire import encode_answer
from service.core.execution import Execution
from service.core.memory_budget import MemoryBudget, Reservation
from service.core.offload import INLINE_BODY_BYTES
from service.core.statistics import Timings
from service.errors import (
    BadRequest,
    InvalidInput,
    NotFound,
    PayloadTooLarge,
    RunCancelled,
    ServiceError,
    UnsupportedMediaType,
)
from service.kernels.context import KernelContext, RunOffLoop
from service.runtime.model_loader import RepositoryEntry
from service.runtime.serve import run_entry, run_posted
from service.settings import Settings
from service.telemetry.access_log import CLIENT_GONE
from service.telemetry.recorder import MODEL_LABELS, Telemetry

PREFIX = "/v1/models/"
MAX_FORM_PARTS = 4  # `model` and `request`, with room to name the extra one in the error
_JSON = [(b"content-type", b"application/json")]


class ModelLane(Lane):
    """POST runs the posted model, or the repository model a `/v1/models/...` path names."""

    def __init__(self, execution: Execution, budget: MemoryBudget, guards: Guards,
                 limits: Limits, settings: Settings, repository: Any) -> None:  # fmt: skip
        super().__init__(execution, budget, guards)
        self.limits = limits
        self.settings = settings
        self.repository = repository  # () -> the model repository (made at start-up)

    async def _serve(self, scope: Scope, receive: Receive, send: Send, held: Reservation) -> int:
        headers = list(_JSON)
        try:
            content = await self._run(scope, receive, held)
            status = 200
        except (ClientGone, RunCancelled):
            return CLIENT_GONE
        except ServiceError as exc:
            status, content = exc.status_code, dumps(service_error_content(exc))
            headers += refusal_headers(exc)
        except ValidationError as exc:
            status, content = 422, dumps(validation_error_content(exc))
        except Exception:
            status, content = 500, dumps(unexpected_content(scope["method"], scope["path"]))
        return await send_answer(send, scope, status, headers, content, self.offloader,
                                 self.send_timeout)  # fmt: skip

    async def _run(self, scope: Scope, receive: Receive, held: Reservation) -> Answer:
        entry = None
        media = _media_type(scope)
        name, version = model_path(scope["path"])
        if name is None:
            allowed = ("application/json", "multipart/form-data")
            if media not in allowed:
                raise UnsupportedMediaType("the body must be application/json or "
                                           f"multipart/form-data, not {media[:100] or 'untyped'}")  # fmt: skip
        else:
            entry = self.repository().get(name, version)
            scope[MODEL_LABELS] = (entry.name, "", str(entry.version))
            if media not in ("application/json", ""):
                raise UnsupportedMediaType("the body must be application/json, not "
                                           f"{media[:100]}")  # fmt: skip
        declared = content_length(scope)
        if declared is not None and declared > self.max_request_bytes:
            raise PayloadTooLarge(too_large(f"of {declared} bytes (Content-Length) is",
                                            self.max_request_bytes))  # fmt: skip
        # small: read and run inline first, nothing reserved (as a V2 call: core/execution.py)
        small = declared is not None and declared <= INLINE_BODY_BYTES
        body = await read_body(receive, self.max_request_bytes, self.body_timeout,
                               None if small else held, declared)  # fmt: skip
        work = ModelWork(body, _content_type(scope), entry, self.settings, self.limits)
        inline = small and (entry is None or bool(getattr(entry.model, "inline", False)))
        return await self.execution.run(work, held, inline, disconnected=until_gone(receive))


class ModelWork:
    """One v1 model run as execution.py's Work: parse the body (JSON or form), load a posted
    model, run, encode; every step claims what it holds."""

    __slots__ = ("body", "content_type", "entry", "limits", "settings", "timings")

    def __init__(self, body: bytes, content_type: str, entry: RepositoryEntry | None,
                 settings: Settings, limits: Limits) -> None:  # fmt: skip
        self.body, self.content_type, self.entry = body, content_type, entry
        self.settings, self.limits = settings, limits
        self.timings = Timings()

    @property
    def holding(self) -> int:
        return len(self.body)

    def __call__(self, ctx: KernelContext) -> Answer:
        self.timings.started = start = perf_counter_ns()
        claims = ctx.claims
        if self.entry is not None:
            if claims is not None:
                claims.claim(json_body_memory(self.body, self.limits.max_json_items))
            options = ModelRunOptions.model_validate_json(self.body) if self.body else (
                ModelRunOptions())  # fmt: skip
            content = run_entry(self.entry, options, self.limits, ctx)
        elif self.content_type.lower().startswith("multipart/form-data"):
            if ctx.inline_bytes is not None:  # a form's parts are parsed on a thread
                raise RunOffLoop
            model, options = self._form(ctx)
            content = run_posted(model, options, self.settings, self.limits, ctx)
        else:
            if claims is not None:
                claims.claim(json_body_memory(self.body, self.limits.max_json_items))
            request = ModelRunRequest.model_validate_json(self.body)
            content = run_posted(request.model, request, self.settings, self.limits, ctx)
        answer = encode_answer(content, dumps)
        self.timings.compute_infer = perf_counter_ns() - start
        return answer

    def _form(self, ctx: KernelContext) -> tuple[bytes, PostedRunOptions]:
        """The `model` file part and the `request` field (JSON options)."""
        parts = parse_form(self.body, self.content_type, MAX_FORM_PARTS,
                           self.settings.max_request_bytes)  # fmt: skip
        if ctx.claims is not None:
            ctx.claims.claim(len(self.body))  # the parts' bytes, joined
        unknown = sorted(set(parts) - {"model", "request"})
        if unknown:
            raise BadRequest(f"unknown form field {unknown[0][:100]!r}; the fields are model "
                             "(a file) and request (JSON)")  # fmt: skip
        model, fields = parts.get("model"), parts.get("request")
        if model is None or not model.is_file:
            raise BadRequest("the form needs the model as a file part named 'model'")
        if fields is not None and fields.is_file:
            raise BadRequest("the form field 'request' must be text (JSON), not a file")
        try:
            text = part_bytes(fields) if fields is not None else b"{}"
            if ctx.claims is not None:  # the options' JSON: as a JSON body's
                ctx.claims.claim(json_body_memory(text, self.limits.max_json_items))
            return part_bytes(model), PostedRunOptions.model_validate_json(text or b"{}")
        except ValidationError as exc:
            raise _in_request_field(exc) from None


def model_path(path: str) -> tuple[str | None, int | None]:
    """(model name, version) a run path names: (None, None) for `/v1/models/run`; 404 for a
    path that is no model route, 422 for a version that is not a number from 1."""
    parts = path[len(PREFIX) :].split("/")
    if parts == ["run"]:
        return None, None
    if len(parts) == 2 and parts[1] == "run" and parts[0]:
        return parts[0], None
    if len(parts) == 4 and parts[1] == "versions" and parts[3] == "run" and parts[0]:
        version = parts[2]
        if not (version.isascii() and version.isdigit() and len(version) <= 9):
            raise InvalidInput("Input should be a valid integer, unable to parse string as an "
                               "integer", loc=("path", "version"))  # fmt: skip
        if int(version) < 1:
            raise InvalidInput("Input should be greater than or equal to 1",
                               loc=("path", "version"))  # fmt: skip
        return parts[0], int(version)
    raise NotFound("Not Found")


def is_model_run(path: str) -> bool:
    """Whether a POST to `path` is the model lane's (checked before any lookup)."""
    if not path.startswith(PREFIX) or not path.endswith("/run"):
        return False
    return path.count("/") in (3, 4, 6) and "//" not in path


def route_template(path: str) -> str:
    """The route a model run path names, as a bounded label for logs and metrics."""
    count = path.count("/")
    if count == 3:
        return "/v1/models/run"
    return "/v1/models/{name}/run" if count == 4 else "/v1/models/{name}/versions/{version}/run"


def model_shortcut(lane: ModelLane, app: ASGIApp, telemetry: Telemetry) -> ASGIApp:
    """An ASGI app that hands model run POSTs to `lane`, the rest to `app`."""

    async def entry(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST" and is_model_run(scope["path"]):
            await observe(telemetry, lane, scope, receive, send, route_template(scope["path"]))
            return
        await app(scope, receive, send)

    return entry


def _content_type(scope: Scope) -> str:
    for name, value in scope["headers"]:
        if name == b"content-type":
            return str(value.decode("latin-1"))
    return ""


def _media_type(scope: Scope) -> str:
    return _content_type(scope).partition(";")[0].strip().lower()


def _in_request_field(exc: ValidationError) -> ServiceError:
    error = exc.errors()[0]
    where = ".".join(str(p) for p in error["loc"] if p not in ("json", "proto"))
    return InvalidInput(f"{where}: {error['msg']}" if where else str(error["msg"]),
                        loc=("request",))  # fmt: skip
