"""The ASGI application: `create_app(settings)` builds it, `app` is the default one."""

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING

from fastapi import FastAPI
from starlette.types import ASGIApp, Receive, Scope, Send

from service import __version__
from service.api import docs, errors, health, metrics, models, observe, ops
from service.api.api_keys import require_api_keys
from service.api.body_limit import BodyLimitMiddleware
from service.api.lane import Guards
from service.api.metrics import models_loaded
from service.api.model_lane import ModelLane, model_shortcut
from service.api.openapi import openapi_builder
from service.api.operator_lane import OperatorLane, operator_shortcut
from service.api.v2_lane import V2Lane, v2_shortcut
from service.codecs.limits import Limits
from service.core.api_keys import parse_keys
from service.core.dataplane import DataPlane
from service.core.execution import Execution
from service.core.heap_trim import HeapTrim
from service.core.memory_budget import MemoryBudget
from service.core.model_lookup import ready_models
from service.core.offload import Offloader
from service.core.stuck_runs import exit_when_left_behind
from service.engines.workers.pool import FallbackPool
from service.grpc.server import GrpcServer
from service.kernels.allocator import configure_allocator
from service.kernels.collector import freeze_start_up
from service.runtime.config.warmup import WarmupRuns
from service.runtime.repository import ModelRepository
from service.settings import Settings, metric_buckets
from service.telemetry.access_log import AccessLog
from service.telemetry.engines import EngineInfo
from service.telemetry.metrics import Metrics
from service.telemetry.recorder import Telemetry
from service.telemetry.stuck_runs import StuckRuns
from service.telemetry.triton_metrics import TritonMetrics

if TYPE_CHECKING:  # imported in cluster mode only (create_app)
    from service.cluster.cluster import Cluster
    from service.cluster.repository import ClusterRepository

DESCRIPTION = """ONNX operators as a service: every schema version of Constant, ConstantOfShape,
RandomUniformLike, Tile and Shape, run on exact NumPy kernels.

Tensors travel as JSON (`{"dtype", "shape", "data"}`) or as base64 `onnx.TensorProto`.
Each operator version has its own route with its own attribute schema; `/v1/ops/{op}/{opset}`
runs the version in force at any opset."""


class OpserveApp(FastAPI):
    """FastAPI, entered through a short pipeline of our own: operator POSTs go straight to the
    operator lane (which bounds the body; the shortcut records telemetry), everything else
    through telemetry (request id, access log, metrics) and the body limit to FastAPI."""

    entry: ASGIApp

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self.entry(scope, receive, send)

    async def framework(self, scope: Scope, receive: Receive, send: Send) -> None:
        await super().__call__(scope, receive, send)


def create_app(settings: Settings | None = None) -> OpserveApp:
    """Build the application for `settings` (read from OPSERVE_* variables by default)."""
    settings = settings or Settings()
    # Before the kernel threads exist: large outputs then reuse warm heap pages (allocator.py).
    configure_allocator(settings.max_output_bytes)
    # threads beyond the cores for runs that wait on the isolated workers (all of them busy,
    # and as many waiting for one)
    offloader = Offloader(settings.kernel_threads, waiting=2 * settings.fallback_workers)
    repository = ModelRepository(settings.model_repository, settings)
    cluster: Cluster | None = None  # unless OPSERVE_CLUSTER_REDIS_URL is set (below)
    shared: ClusterRepository | None = None

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        execution.start()
        if cluster is not None:
            await cluster.start()
        await repository.start()  # a model that fails is listed not ready, never stops start-up
        if shared is not None:  # cluster mode: the cluster's models, before it says ready
            await shared.start()
        polling = None
        if settings.model_control_mode == "poll" and repository.root is not None:
            polling = asyncio.create_task(repository.poll())
        # The operator registry's scan of onnx's schemas (about 30 ms) is made here, before
        # anyone waits on it: made by the first index, config or statistics call, it held the
        # event loop, and every other request, 23-36 ms.
        ready_models(None)
        if grpc_server is not None:
            await grpc_server.start()  # fails the start-up when its port cannot be bound
        plane.sweeper.start()  # idle sequences released on time, whatever the traffic
        if settings.gc_freeze:  # full collections walk only what comes after start-up
            freeze_start_up()
        plane.serving = True
        health.unready_on_sigterm(plane, *([grpc_server.begin_stop] if grpc_server else []))
        yield
        plane.serving = False
        if grpc_server is not None:  # both doors drain at once: HTTP's is done by now
            await grpc_server.stop()
        if polling is not None:
            polling.cancel()
        if shared is not None:
            await shared.stop()
        await plane.sweeper.stop()
        execution.stop_all()  # runs still on kernel threads or in fallback workers stop now
        plane.tracing.close()  # traces kept for a group written
        repository.close()
        if cluster is not None:
            await cluster.stop()
        plane.shm.close()
        offloader.close()
        telemetry.flush()
        # Python's exit would wait forever for a thread in a native kernel that never stops
        exit_when_left_behind(execution.left_behind)

    app = OpserveApp(title="opserve", version=__version__, description=DESCRIPTION,
                     docs_url=None, redoc_url=None, openapi_url=None,  # docs.install's
                     lifespan=lifespan,
                     # FastAPI's OpenTelemetry hooks cost a few microseconds per request
                     telemetry={"tracing": False, "metrics": False, "logs": False})  # fmt: skip
    app.state.settings = settings
    limits = Limits.of(settings)
    app.state.limits, app.state.offloader, app.state.repository = limits, offloader, repository
    budget = MemoryBudget(settings.memory_budget_bytes, settings.memory_wait_seconds)
    app.state.memory_budget = budget  # one for the whole process: every lane shares it
    if settings.heap_trim_seconds:  # what large requests freed goes back once they stop
        budget.on_idle = HeapTrim(lambda: budget.busy, settings.heap_trim_seconds).idle
    # the isolated workers: clients' models, and onnx.reference; started on first use
    fallback = FallbackPool(settings)
    execution = Execution(offloader, settings.max_output_bytes, settings.max_answer_bytes,
                          settings.max_run_seconds, settings.max_queued_runs, fallback)  # fmt: skip
    repository.warmup = WarmupRuns(budget, fallback)  # model_warmup runs as requests run
    plane = DataPlane(settings, lambda: repository, execution, limits, budget)
    repository.statistics = plane.stats  # ensemble steps count in their models' statistics
    app.state.plane = plane
    if settings.cluster_redis_url.get_secret_value():
        # imported in cluster mode only (joined.py says why)
        from service.cluster.joined import join_cluster

        cluster, shared = join_cluster(settings, plane, repository, limits)
    plane.shared_control = shared
    app.state.cluster = cluster
    guards = Guards(settings.max_request_bytes, settings.body_timeout_seconds,
                    settings.send_timeout_seconds)  # fmt: skip
    lane = OperatorLane(execution, budget, guards, limits, plane.stats)
    ops.install(app, lane)
    app.include_router(models.router)
    app.include_router(metrics.router)
    errors.install(app)
    docs.install(app)
    app.openapi = openapi_builder(app)  # type: ignore[method-assign]
    app.state.metrics = Metrics(settings.metrics_dir or None, models_loaded(app.state))
    app.state.metrics.registry.register(EngineInfo(lambda: getattr(app.state, "repository", None)))
    app.state.metrics.registry.register(StuckRuns(execution.left_behind))
    plane.stats.use_buckets(metric_buckets(settings.metrics_buckets))  # before any request
    TritonMetrics(app.state.metrics, plane.stats, lambda: getattr(app.state, "repository", None))
    telemetry = Telemetry(AccessLog() if settings.access_log else None, app.state.metrics)
    framework = BodyLimitMiddleware(app.framework, settings.max_request_bytes)
    v2_lane = V2Lane(plane, budget, guards)
    observed = observe.observed(telemetry, framework, app.routes)
    model_lane = ModelLane(execution, budget, guards, limits, settings,
                           lambda: app.state.repository)  # fmt: skip
    observed = model_shortcut(model_lane, observed, telemetry)
    entry = operator_shortcut(lane, v2_shortcut(v2_lane, observed, telemetry), telemetry)
    # first in the pipeline: with OPSERVE_API_KEYS set, no route but health and metrics runs
    # for a request without a key
    app.entry = require_api_keys(entry, parse_keys(settings.api_keys.get_secret_value()), telemetry)
    # made here, bound and started by the lifespan on the server's own loop
    grpc_server = GrpcServer(settings, plane, budget, telemetry) if settings.grpc_port else None
    app.state.grpc = grpc_server
    return app


app = create_app()
