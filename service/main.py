"""The ASGI application: `create_app(settings)` builds it, `app` is the default one."""

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI

from service import __version__
from service.api import docs, errors, health, ops
from service.api.body_limit import BodyLimitMiddleware
from service.api.offload import Offloader
from service.api.openapi import openapi_builder
from service.codecs.limits import Limits
from service.kernels.allocator import configure_allocator
from service.settings import Settings

DESCRIPTION = """ONNX operators as a service: every schema version of Constant, ConstantOfShape,
RandomUniformLike, Tile and Shape, run on exact NumPy kernels.

Tensors travel as JSON (`{"dtype", "shape", "data"}`) or as base64 `onnx.TensorProto`.
Each operator version has its own route with its own attribute schema; `/v1/ops/{op}/{opset}`
runs the version in force at any opset."""


def create_app(settings: Settings | None = None) -> FastAPI:
    """Build the application for `settings` (read from OPSERVE_* variables by default)."""
    settings = settings or Settings()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        app.state.ready = True
        yield
        app.state.ready = False
        app.state.offloader.close()

    app = FastAPI(title="opserve", version=__version__, description=DESCRIPTION,
                  docs_url=None, redoc_url=None, lifespan=lifespan)  # fmt: skip
    app.state.settings = settings
    app.state.limits = Limits(settings.max_elements, settings.max_string_bytes,
                              settings.max_json_depth)  # fmt: skip
    # Before the kernel threads exist: large outputs then reuse warm heap pages (allocator.py).
    configure_allocator(settings.max_output_bytes)
    app.state.offloader = Offloader(settings.kernel_threads)
    app.state.ready = False
    ops.install(app)
    app.include_router(health.router)
    errors.install(app)
    docs.install(app)
    app.openapi = openapi_builder(app)  # type: ignore[method-assign]
    app.add_middleware(BodyLimitMiddleware, max_bytes=settings.max_request_bytes)
    return app


app = create_app()
