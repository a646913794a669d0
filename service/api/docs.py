"""Swagger UI and ReDoc served by the service itself: their assets come from the
fastapi-offline package, so /docs works behind a load balancer with no internet."""

from functools import cache
from pathlib import Path

import fastapi_offline
from fastapi import FastAPI, Request
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
from fastapi.staticfiles import StaticFiles
from starlette.responses import HTMLResponse, Response

ASSETS = Path(fastapi_offline.__file__).parent / "static"
STATIC_URL = "/static/docs"
PAGES = ("/docs", "/redoc", "/openapi.json")
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


def install(app: FastAPI) -> None:
    """Mount the assets and add /docs and /redoc (the app is built with docs_url=None)."""

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
