"""Swagger UI and ReDoc served by the service itself: their assets come from the
fastapi-offline package, so /docs works behind a load balancer with no internet; and the
OpenAPI document they read, built off the event loop.

FastAPI's own /openapi.json builds the document on the event loop at its first call: 300-330
ms (every operator version's schemas), during which every other client's request waited, and
any client could bring it on after each start of each worker (the document needs no API key).
Here it is built on a thread, once, and its JSON text kept: the loop only sends it."""

import asyncio
import threading
from functools import cache
from pathlib import Path

import fastapi_offline
from fastapi import FastAPI, Request
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
from fastapi.staticfiles import StaticFiles
from starlette.responses import HTMLResponse, Response

from service.api.responses import dumps

ASSETS = Path(fastapi_offline.__file__).parent / "static"
STATIC_URL = "/static/docs"
OPENAPI_URL = "/openapi.json"
PAGES = ("/docs", "/redoc", OPENAPI_URL)
"""The documentation and the OpenAPI document (FastAPI's default openapi_url): they answer
without an API key, like their assets under STATIC_URL; they describe the API, nothing secret."""
REDOC_JS = f"{STATIC_URL}/redoc.offline.js"

# ReDoc's sidebar footer always loads this logo from Redocly's CDN; offline it is an empty image.
_REDOC_LOGO = b"https://cdn.redoc.ly/redoc/logo-mini.svg"
_BLANK_SVG = b"data:image/svg+xml,%3Csvg xmlns='http://www.w3.org/2000/svg'/%3E"

SWAGGER_UI_PARAMETERS = {
    "docExpansion": "none",  # tags only: 76 operations open at once bury Tile and V2
    "filter": True,  # a box that narrows the operations to the tags matching it
    "validatorUrl": None,  # no badge fetched from swagger.io
    "tryItOutEnabled": False,
    "displayRequestDuration": True,
}
"""Tags appear in the OpenAPI document's order (service/api/openapi.py)."""


@cache
def _redoc_bundle() -> bytes:
    return (ASSETS / "redoc.standalone.js").read_bytes().replace(_REDOC_LOGO, _BLANK_SVG)


_BUILDING = threading.Lock()  # one build at a time; later callers find its text


def _document_text(app: FastAPI) -> bytes:
    """(On a thread.) The OpenAPI document's JSON text, built at the first call."""
    with _BUILDING:
        text = getattr(app.state, "openapi_text", None)
        if text is None:
            text = app.state.openapi_text = dumps(app.openapi())
        return text


def install(app: FastAPI) -> None:
    """Mount the assets and add /docs, /redoc and the OpenAPI document (the app is built with
    docs_url, redoc_url and openapi_url None)."""
    app.openapi_url = OPENAPI_URL

    @app.get(OPENAPI_URL, include_in_schema=False)
    async def openapi_document(request: Request) -> Response:
        text = getattr(app.state, "openapi_text", None)
        if text is None:
            text = await asyncio.to_thread(_document_text, app)
        root = request.scope.get("root_path", "").rstrip("/")
        if root and app.root_path_in_servers:  # behind a prefix: as FastAPI's own route says
            document = app.openapi()
            servers = document.get("servers", [])
            if root not in {server.get("url") for server in servers}:
                text = dumps({**document, "servers": [{"url": root}, *servers]})
        return Response(text, media_type="application/json")

    @app.get(REDOC_JS, include_in_schema=False)
    async def redoc_bundle() -> Response:
        return Response(_redoc_bundle(), media_type="text/javascript",
                        headers={"cache-control": "public, max-age=86400"})  # fmt: skip

    app.mount(STATIC_URL, StaticFiles(directory=ASSETS), name="docs-assets")

    @app.get("/docs", include_in_schema=False)
    async def swagger_ui(request: Request) -> HTMLResponse:
        root = request.scope.get("root_path", "")
        return get_swagger_ui_html(
            openapi_url=f"{root}{app.openapi_url}",
            title=f"{app.title} - Swagger UI",
            swagger_js_url=f"{root}{STATIC_URL}/swagger-ui-bundle.js",
            swagger_css_url=f"{root}{STATIC_URL}/swagger-ui.css",
            swagger_favicon_url=f"{root}{STATIC_URL}/favicon.png",
            swagger_ui_parameters=SWAGGER_UI_PARAMETERS,
        )  # fmt: skip

    @app.get("/redoc", include_in_schema=False)
    async def redoc(request: Request) -> HTMLResponse:
        root = request.scope.get("root_path", "")
        return get_redoc_html(
            openapi_url=f"{root}{app.openapi_url}",
            title=f"{app.title} - ReDoc",
            redoc_js_url=f"{root}{REDOC_JS}",
            redoc_favicon_url=f"{root}{STATIC_URL}/favicon.png",
            with_google_fonts=False,
        )
