"""Swagger UI and ReDoc served by the service itself: their assets come from the
fastapi-offline package, so /docs works behind a load balancer with no internet."""

from pathlib import Path

import fastapi_offline
from fastapi import FastAPI, Request
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
from fastapi.staticfiles import StaticFiles
from starlette.responses import HTMLResponse

ASSETS = Path(fastapi_offline.__file__).parent / "static"
STATIC_URL = "/static/docs"


def install(app: FastAPI) -> None:
    """Mount the assets and add /docs and /redoc (the app is built with docs_url=None)."""
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
            # validatorUrl None: no badge fetched from swagger.io
            swagger_ui_parameters={"validatorUrl": None, "tryItOutEnabled": False,
                                   "displayRequestDuration": True},
        )  # fmt: skip

    @app.get("/redoc", include_in_schema=False)
    async def redoc(request: Request) -> HTMLResponse:
        root = request.scope.get("root_path", "")
        return get_redoc_html(
            openapi_url=f"{root}{app.openapi_url}",
            title=f"{app.title} - ReDoc",
            redoc_js_url=f"{root}{STATIC_URL}/redoc.standalone.js",
            redoc_favicon_url=f"{root}{STATIC_URL}/favicon.png",
            with_google_fonts=False,
        )
