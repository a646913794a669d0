"""Every KServe V2 route but infer, as Triton serves it: which path, which method, and a small
handler over the data plane. The V2 lane (v2_lane.py) matches a request here, checks the
method and runs the handler; infer is the lane's own.

Paths are matched as Triton's http_server.cc does (its regular expressions, in its order);
anything else under /v2 is 404 `{"error": "Not Found"}`.
"""

import asyncio
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, TypeVar

import orjson
from starlette.types import Receive, Scope

from service.api.body_limit import content_length, read_body
from service.api.responses import dumps
from service.api.send_answer import Answer
from service.codecs.json_tensor import ITEM_BYTES
from service.core import peer_uid
from service.core.dataplane import DataPlane
from service.core.memory_budget import Reservation
from service.core.offload import INLINE_BODY_BYTES
from service.core.readiness import readiness_of
from service.core.settings_requests import (
    SETTINGS_BODY_BYTES,
    check_settings_size,
    settings_too_large,
)
from service.errors import BadRequest, PayloadTooLarge
from service.runtime.load_request import FILE_PREFIX, Base64, FileData

T = TypeVar("T")
LOAD_CONFIG_ITEMS = 65_536
"""The JSON members and elements a load's body may hold beyond a few per file: its config's
(a model configuration with thousands of inputs fits). 65,536 numbers parse in about 2 ms."""
Headers = list[tuple[bytes, bytes]]
Reply = tuple[int, Headers, Answer]


@dataclass(frozen=True)
class V2Request:
    """One request to a V2 route: what its handler may use."""

    plane: DataPlane
    scope: Scope
    receive: Receive
    held: Reservation
    groups: tuple[str | None, ...]  # the matched path's parts
    max_body_bytes: int
    body_timeout: float

    async def settings_body(self) -> dict[str, Any]:
        """The body of a settings or repository request as a JSON object ({} when empty):
        small (core/settings_requests.py), so it is parsed here, on the event loop."""
        declared = content_length(self.scope)
        if declared is not None:
            check_settings_size(declared)
        try:
            body = await read_body(self.receive, SETTINGS_BODY_BYTES, self.body_timeout,
                                   None, declared)  # fmt: skip
        except PayloadTooLarge:  # streamed in chunks, and it went past the limit
            raise settings_too_large("streamed in chunks went") from None
        return _object(body)

    async def json_body(self, take: Callable[[dict[str, Any]], T], most_items: int) -> T:
        """`take(body)` of the body as a JSON object ({} when empty), read within the request
        limits: a load's (tens of MiB of base64), of at most `most_items` members and
        elements (its colons and commas, counted before it is parsed). What the parsed object
        holds is claimed from the memory budget before parsing. A body over
        INLINE_BODY_BYTES is counted, parsed and given to `take` on a kernel thread, where
        what `take` leaves of it is freed too: only what it returns comes back to the loop.

        The thread spares the loop the Python work, not orjson's: it holds the GIL while it
        parses, and so the loop, about 100 ms for a 60 MiB body of base64 here. `most_items`
        bounds what a body of numbers would add: 2.6 million of them in 60 MiB held the loop
        200-290 ms from the thread."""
        # the declared length gathers a large body in a memory map (body_limit.py)
        body = await read_body(self.receive, self.max_body_bytes, self.body_timeout, self.held,
                               content_length(self.scope))  # fmt: skip
        try:
            inline = len(body) <= INLINE_BODY_BYTES
            on_thread = self.plane.execution.offloader.on_thread
            items = _items(body) if inline else await on_thread(_items, body)
            if items > most_items:
                raise PayloadTooLarge(f"the request body holds {items} JSON members and elements "
                                      f"(its colons and commas), over the limit of {most_items} "
                                      "for this request")  # fmt: skip
            await self.held.grow(len(body) + ITEM_BYTES * items)  # what orjson makes of it
            return take(_object(body)) if inline else await on_thread(_taken, take, body)
        finally:
            self.held.shrink(len(body))  # freed as this returns


def _taken(take: Callable[[dict[str, Any]], T], body: bytes) -> T:
    return take(_object(body))


def _object(body: bytes) -> dict[str, Any]:
    """A body parsed as a JSON object ({} when empty)."""
    if not body.strip():
        return {}
    try:
        content = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise BadRequest(f"failed to parse the request JSON buffer: {exc}") from None
    if not isinstance(content, dict):
        raise BadRequest("the request body must be a JSON object")
    return content


def _items(body: bytes) -> int:
    """A JSON body's members and elements at most (its colons and commas, inside strings too):
    what orjson makes of it is its strings (no more bytes than the body) and an object for
    each of these."""
    return body.count(b":") + body.count(b",")


Handler = Callable[[V2Request], Awaitable[Reply]]
GET_OR_POST = "GET, POST"
"""The method of a route that takes both (its Allow header when refused)."""


Groups = tuple[str | None, ...]
_FORWARDED = frozenset({b"x-forwarded-for", b"forwarded", b"x-real-ip"})


@dataclass(frozen=True)
class Route:
    """A path pattern, and what a match of it is: its label (a bounded template for logs and
    metrics), the method it takes and its handler (None: the lane's infer)."""

    pattern: re.Pattern[str]
    resolve: Callable[[Groups], tuple[str, str, Handler | None]]


def json_reply(content: Any, status: int = 200) -> Reply:
    return status, [(b"content-type", b"application/json")], dumps(content)


def empty_reply() -> Reply:
    """Triton's answer to a load, unload, register or unregister that worked."""
    return 200, [], b""


async def server_metadata(request: V2Request) -> Reply:
    return json_reply(request.plane.server_metadata())


async def health(request: V2Request) -> Reply:
    """200 or 400 as Triton, with KServe's body (its SDK reads `live` and `ready`)."""
    if request.groups[0] == "live":
        dead = request.plane.server_live()
        return json_reply({"live": True}) if dead is None else (
            json_reply({"live": False, "error": dead}, 400))  # fmt: skip
    if request.plane.server_ready():
        return json_reply({"ready": True})
    reason = readiness_of(request.plane).server_reason()
    return json_reply({"ready": False, "error": f"Server not ready: {reason}"}, 400)


async def model_metadata(request: V2Request) -> Reply:
    name, version = request.groups[:2]
    return json_reply(request.plane.model_metadata(str(name), version))


async def model_ready(request: V2Request) -> Reply:
    """200 when ready, 400 when not (Triton's status and error), with KServe's body."""
    name, version = str(request.groups[0]), request.groups[1]
    if request.plane.model_ready(name, version):
        return json_reply({"name": name, "ready": True})
    reason = readiness_of(request.plane).model_reason(name, version)
    return json_reply({"name": name, "ready": False,
                       "error": f"Model version not ready: {reason}"}, 400)  # fmt: skip


async def model_config(request: V2Request) -> Reply:
    name, version = request.groups[:2]
    return json_reply(request.plane.model_config(str(name), version))


async def model_stats(request: V2Request) -> Reply:
    """A model's statistics, or (/v2/models/stats: no groups) every ready model's."""
    name, version = (*request.groups, None, None)[:2]
    return json_reply({"model_stats": await request.plane.statistics(name, version)})


async def repository_index(request: V2Request) -> Reply:
    body = await request.settings_body()
    ready = body.get("ready", False)
    if not isinstance(ready, bool):
        raise BadRequest("Invalid value for 'ready': expected a boolean")
    return json_reply(request.plane.repository_index(ready))


async def repository_control(request: V2Request) -> Reply:
    """Load (with Triton's `config` and `file:<version>/<name>` parameters: a JSON config and
    base64 files) or unload (`unload_dependents`: there are no ensembles, so no dependents)."""
    repository, _index, name, action = request.groups
    if action == "unload":
        dependents = _parameters(await request.settings_body()).get("unload_dependents", False)
        if not isinstance(dependents, bool):
            raise BadRequest("Unable to parse 'unload_dependents': expected a boolean")
        await request.plane.unload(str(name), repository)
        return empty_reply()
    # the files' texts live on in `files` only, and go with them. A load's items: its config
    # (a JSON text, whose own colons and commas count) and a few per file
    most = LOAD_CONFIG_ITEMS + 4 * request.plane.settings.max_load_files
    config, files = await request.json_body(_load_parameters, most)
    await request.plane.load(str(name), config, files, repository, request.held)
    return empty_reply()


def _parameters(body: dict[str, Any]) -> dict[str, Any]:
    parameters = body.get("parameters") or {}
    if not isinstance(parameters, dict):
        raise BadRequest("'parameters' must be a JSON object")
    return parameters


def _load_parameters(body: dict[str, Any]) -> tuple[str | None, dict[str, FileData]]:
    """A load body's `config` and its `file:<path>` parameters, left base64 (the data plane
    checks them and claims their memory before they are decoded)."""
    parameters = _parameters(body)
    config: str | None = None
    files: dict[str, FileData] = {}
    for key, value in parameters.items():
        if not isinstance(value, str):
            raise BadRequest(f"load parameter '{key[:100]}' must be a string")
        if key == "config":
            config = value
        elif key.startswith(FILE_PREFIX):
            files[key.removeprefix(FILE_PREFIX)] = Base64(key, value)
        else:
            raise BadRequest(f"Unrecognized load parameter '{key[:100]}'")
    return config, files


async def shared_memory(request: V2Request) -> Reply:
    """Triton's system and CUDA shared memory routes: status, register, unregister."""
    kind, region, action = request.groups
    plane = request.plane
    regions = plane.shm if kind == "system" else plane.cuda_shm
    if action == "status":
        return json_reply(regions.status(region))
    plane.shm.require_enabled()  # Triton's gate comes before the body is read
    if action == "unregister":
        regions.unregister(region)
        return empty_reply()
    body = await request.settings_body()
    if not region:
        raise BadRequest(f"'region name' is necessary to register {kind} shared memory region")
    if kind == "cuda":
        plane.cuda_shm.register(region)
    for field in ("key", "byte_size"):
        if field not in body:
            raise BadRequest(f"Shared memory register request has no '{field}' field")
    key, offset = body["key"], body.get("offset", 0)
    if not isinstance(key, str):
        raise BadRequest("Shared memory register request's 'key' must be a string")
    client, server = _ends(request.scope)
    uid = await asyncio.to_thread(peer_uid.uid_of, client, server)  # reads /proc: off the loop
    plane.shm.register(region, key, offset, body["byte_size"], client_uid=uid)
    return empty_reply()


def _ends(scope: Scope) -> tuple[Any, Any]:
    """The client's and the server's ends of the connection, for telling the client's user;
    none when the request came through a proxy: uvicorn then takes `client` (host and port)
    from X-Forwarded-For, whatever a local client wrote there, if it connects from 127.0.0.1."""
    if any(name in _FORWARDED for name, _value in scope["headers"]):
        return None, None
    return scope.get("client"), scope.get("server")


async def logging_settings(request: V2Request) -> Reply:
    """Triton's logging extension: the log settings, after the body's changes (a POST)."""
    logs = request.plane.logs
    if request.scope["method"] == "GET":
        return json_reply(logs.report())
    return json_reply(logs.update(await request.settings_body()))


async def trace_settings(request: V2Request) -> Reply:
    """Triton's trace extension: the global settings, or (a group) a model's, after the
    body's changes (a POST)."""
    model, tracing = request.groups[0] if request.groups else None, request.plane.tracing
    if request.scope["method"] == "GET":
        return json_reply(tracing.report(model))
    return json_reply(tracing.update(model, await request.settings_body()))


def _shared_memory_route(groups: Groups) -> tuple[str, str, Handler]:
    kind, region, action = groups
    where = "/region/{region}" if region is not None else ""
    label = f"/v2/{kind}sharedmemory{where}/{action}"
    return label, "GET" if action == "status" else "POST", shared_memory


_MODEL_ACTIONS: dict[str | None, Handler | None] = {
    None: model_metadata, "ready": model_ready, "config": model_config, "stats": model_stats,
    "infer": None,
}  # fmt: skip


def _model_route(groups: Groups) -> tuple[str, str, Handler | None]:
    _name, version, action = groups
    versioned = "/versions/{version}" if version is not None else ""
    label = f"/v2/models/{{name}}{versioned}{f'/{action}' if action else ''}"
    return label, "POST" if action == "infer" else "GET", _MODEL_ACTIONS[action]


def _repository_route(groups: Groups) -> tuple[str, str, Handler]:
    if groups[1]:
        return "/v2/repository/index", "POST", repository_index
    return f"/v2/repository/models/{{name}}/{groups[3]}", "POST", repository_control


MODEL_ROUTE = Route(re.compile(r"/v2/models/([^/]+)(?:/versions/([^/]+))?"
                               r"(?:/(infer|ready|config|stats))?"), _model_route)  # fmt: skip
ROUTES: tuple[Route, ...] = (
    Route(re.compile(r"/v2/models/stats"), lambda g: ("/v2/models/stats", "GET", model_stats)),
    MODEL_ROUTE,
    Route(re.compile(r"/v2"), lambda g: ("/v2", "GET", server_metadata)),
    Route(re.compile(r"/v2/health/(live|ready)"), lambda g: (f"/v2/health/{g[0]}", "GET", health)),
    Route(re.compile(r"/v2/(system|cuda)sharedmemory(?:/region/([^/]+))?/"
                     r"(status|register|unregister)"), _shared_memory_route),
    Route(re.compile(r"/v2/repository(?:/([^/]+))?/(?:(index)|models/([^/]+)/(load|unload))"),
          _repository_route),
    Route(re.compile(r"/v2/logging"), lambda g: ("/v2/logging", GET_OR_POST, logging_settings)),
    Route(re.compile(r"/v2/trace/setting"),
          lambda g: ("/v2/trace/setting", GET_OR_POST, trace_settings)),
    Route(re.compile(r"/v2/models/([^/]+)/trace/setting"),
          lambda g: ("/v2/models/{name}/trace/setting", GET_OR_POST, trace_settings)),
)  # fmt: skip


Resolved = tuple[Route, Groups, tuple[str, str, Handler | None]]
CACHED_PATH = 256
"""Paths up to this length are resolved once (a few distinct model paths take most requests);
longer ones, never a model's usual path, each time, so the cache's memory stays bounded."""


def resolve(path: str) -> Resolved | None:
    """The route a path names, its parts, and what they resolve to (label, method, handler);
    None when no route does."""
    if len(path) <= CACHED_PATH:
        return _resolve_cached(path)
    return _resolve(path)


@lru_cache(maxsize=1024)  # bounded: a client sending new paths only evicts old entries
def _resolve_cached(path: str) -> Resolved | None:
    return _resolve(path)


def _resolve(path: str) -> Resolved | None:
    for route in ROUTES:
        found = route.pattern.fullmatch(path)
        if found is not None:
            groups = found.groups()
            return route, groups, route.resolve(groups)
    return None


def template(path: str) -> str | None:
    """The bounded label of the route a path names (None when no route does)."""
    resolved = resolve(path)
    return resolved[2][0] if resolved is not None else None
