"""Optional API keys (OPSERVE_API_KEYS): with keys set, every route but health, metrics and the
documentation answers 401 without `Authorization: Bearer <key>`.

An ASGI wrapper at the front of the entry pipeline (service/main.py), so it covers every route,
the raw operator lane and any other lane included, with one check per request."""

from starlette.types import ASGIApp, Receive, Scope, Send

from service.api import docs
from service.api.observe import observe
from service.api.responses import dumps
from service.core.api_keys import REFUSED, UNAUTHORIZED, authorized
from service.telemetry.recorder import Telemetry

OPEN_PREFIXES = ("/v2/health/", "/metrics")
"""Paths that answer without a key: probes and scrapes carry no credentials."""
OPEN_DOCS = (frozenset(docs.PAGES), f"{docs.STATIC_URL}/")
"""The documentation's pages (exact paths) and assets (a prefix) answer without a key too: a
browser cannot send one to load them, and Swagger UI's Authorize then adds it to each call."""


def require_api_keys(app: ASGIApp, keys: tuple[bytes, ...], telemetry: Telemetry) -> ASGIApp:
    """`app` behind the key check, or `app` itself when there are no keys (the default). A
    refusal is observed like any request: request id, log line and metrics."""
    if not keys:
        return app

    async def gate(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or _is_open(scope["path"]) or _has_key(scope, keys):
            await app(scope, receive, send)
        else:
            await observe(telemetry, _refuse, scope, receive, send, UNAUTHORIZED)

    return gate


def _is_open(path: str) -> bool:
    pages, assets = OPEN_DOCS
    return path.startswith(OPEN_PREFIXES) or path in pages or path.startswith(assets)


def _has_key(scope: Scope, keys: tuple[bytes, ...]) -> bool:
    for name, value in scope["headers"]:
        if name == b"authorization":
            return authorized(value, keys)
    return False


async def _refuse(scope: Scope, receive: Receive, send: Send) -> None:
    body = dumps({"detail": REFUSED, "errors": None})
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
               (b"www-authenticate", b'Bearer realm="opserve"')]  # fmt: skip
    await send({"type": "http.response.start", "status": 401, "headers": headers})
    await send({"type": "http.response.body", "body": body})
