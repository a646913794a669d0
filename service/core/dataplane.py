"""The data plane: the one object every front door calls. It owns model lookup, readiness,
metadata and inference (decoding the inputs once, running, answering through the door's
encoder), whatever the wire format; the doors only convert their bytes or messages to the
neutral call (calls.py) and the result back, and map domain errors to their statuses."""

from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager
from functools import partial
from time import perf_counter_ns
from typing import Any, Protocol, TypeVar

from service import __version__
from service.codecs.limits import Limits
from service.core.batch_policy import batch_policy
from service.core.batcher import DynamicBatcher
from service.core.execution import Disconnected, Execution
from service.core.inference import Encode, InferWork, Parse, Preparing
from service.core.log_settings import LogSettings
from service.core.memory_budget import MemoryBudget, Reservation
from service.core.model import V2Model
from service.core.model_lookup import (
    UNKNOWN,
    find_model,
    model_versions,
    operator_named,
    ready_models,
)
from service.core.operator_model import OperatorModel
from service.core.repository_model import RepositoryModel
from service.core.response_cache import LocalStore, ResponseCache
from service.core.sequence_claims import BudgetClaims
from service.core.sequence_keeper import SequenceKeeper
from service.core.sequence_request import sequence_request
from service.core.sequence_resend import Resend
from service.core.sequence_sweeper import IdleSweeper
from service.core.sequences import Sequences
from service.core.shared_memory import CudaSharedMemory, SharedMemoryRegions
from service.core.statistics import ModelStatistics, SharedStatistics, Statistics
from service.core.trace_context import TraceContext
from service.core.tracing import Tracing
from service.errors import (
    InvalidInput,
    NotFound,
    ServiceError,
    Unavailable,
    Unsupported,
)
from service.runtime.load_request import FileData, LoadRequest, load_request
from service.settings import Settings

T = TypeVar("T")
EXTENSIONS = ("classification", "model_repository", "model_configuration", "binary_tensor_data",
              "parameters", "statistics", "logging", "trace")  # fmt: skip
"""Triton's protocol extensions served, named as Triton names them (docs/v2.md)."""


class SharedControl(Protocol):
    """Repository control shared by the replicas of a cluster: the data plane hands loads and
    unloads (checked) to it, and the index; it applies them here through load_here and
    unload_here. The core knows it by this shape only (it never imports service.cluster)."""

    async def load(self, request: LoadRequest, held: Reservation | None) -> None: ...

    async def unload(self, name: str) -> None: ...

    def index(self, ready_only: bool) -> list[dict[str, Any]]: ...

    def reason(self, name: str) -> str | None: ...


class DataPlane:
    """Models, readiness, metadata, statistics and inference for every door. `repository()`
    gives the model repository (or None)."""

    def __init__(self, settings: Settings, repository: Callable[[], Any], execution: Execution,
                 limits: Limits, budget: MemoryBudget) -> None:  # fmt: skip
        self.settings = settings
        self.repository = repository
        self.execution = execution
        self.limits = limits
        self.budget = budget
        self.stats = Statistics()
        # cluster mode: the stats call answers the cluster's sums (set by the app, service/main.py)
        self.shared_stats: SharedStatistics | None = None
        claims = BudgetClaims(budget, settings.sequence_state_share)
        self.local_sequences = Sequences(settings.max_sequences, claims=claims)
        # cluster mode keeps them in the cluster store instead (set by the app, service/main.py)
        self.sequences: SequenceKeeper = self.local_sequences
        # started and stopped by the app's lifespan; with nothing to sweep in cluster mode
        self.sweeper = IdleSweeper(self.local_sequences)
        self.shm = SharedMemoryRegions(settings.allow_client_shm)
        self.cuda_shm = CudaSharedMemory(self.shm)
        self.serving = False  # start-up done and no shutdown begun (the lifespan sets it)
        # cluster mode's repository control (service/cluster/repository.py), set by the app
        self.shared_control: SharedControl | None = None
        self.logs = LogSettings(settings.log_level)  # the logging extension's, this process's
        self.tracing = Tracing(settings, self.model_ready)  # the trace extension's
        # OPSERVE_RESPONSE_CACHE_BYTES: a local LRU; cluster mode's is in Redis (set by the app)
        self.cache: ResponseCache | None = None
        if settings.response_cache_bytes:
            store = LocalStore(settings.response_cache_bytes, settings.response_cache_seconds,
                               budget)  # fmt: skip
            self.cache = ResponseCache(store, execution, settings.response_cache_entry_bytes)

    # --- the server ---

    def server_metadata(self) -> dict[str, Any]:
        """Name, version and the protocol extensions served (api_schemas.v2.ServerMetadata)."""
        extensions = [*EXTENSIONS, *(["system_shared_memory"] if self.shm.enabled else [])]
        return {"name": self.settings.server_name, "version": __version__,
                "extensions": extensions}  # fmt: skip

    def server_live(self) -> str | None:
        """Why the process should be restarted (stuck threads hold every kernel slot:
        core/stuck_runs.py), or None while it is live."""
        left = self.execution.left_behind
        return left.refusal() if left.every_slot else None

    def server_ready(self) -> bool:
        """Ready to serve: start-up done, no shutdown begun, live, and with strict readiness
        and a model repository, one repository model at least ready and none failed of those
        that should be serving (loaded at start-up or by a poll and not unloaded since: a
        client's failed load changes nothing, so it never makes the server unready)."""
        if not self.serving or self.server_live() is not None:
            return False
        repository = self.repository()
        if not self.settings.strict_readiness or repository is None or repository.root is None:
            return True
        return repository.ready() > 0 and not repository.failed()

    # --- models ---

    def model(self, name: str, version: str | None) -> V2Model:
        """The model `name` at `version` (its newest ready one when None): 404 when there is
        none."""
        return find_model(name, version, self.repository())

    def ready_model(self, name: str, version: str | None) -> V2Model:
        """The model, refused with Triton's words when it is not ready."""
        model = self.model(name, version)
        if not model.ready:
            reason = f" ({model.reason})" if model.reason else ""
            if version is None:
                raise NotFound(f"{UNKNOWN}'{name[:100]}' has no available versions{reason}")
            raise Unavailable(f"{UNKNOWN}'{name[:100]}' version {version} is not at ready "
                              f"state{reason}")  # fmt: skip
        return model

    def labels(self, name: str, version: str | None) -> tuple[str, str, str]:
        """(model, operator, version) of a model for logs and metrics: only a model that
        exists, so the labels stay a bounded set; ("", "", "") for any other name."""
        try:
            model = self.model(name, version)
        except NotFound:
            return ("", "", "")
        return self.model_labels(model)

    @staticmethod
    def model_labels(model: V2Model) -> tuple[str, str, str]:
        """(model, operator, version) of a model that was found."""
        operator = model.name if isinstance(model, OperatorModel) else ""
        return (model.name, operator, str(model.version))

    def model_metadata(self, name: str, version: str | None) -> dict[str, Any]:
        """What the model takes and answers (api_schemas.v2.ModelMetadata)."""
        return self.ready_model(name, version).metadata()

    def model_ready(self, name: str, version: str | None) -> bool:
        """Whether the model takes inference requests (404 when there is no such model); a
        sequence model does not while its sequences cannot be reached (cluster mode), nor one
        the cluster wants that this replica cannot serve (not ready, rather than unknown)."""
        try:
            model = self.model(name, version)
        except NotFound:
            if self.shared_control is not None and self.shared_control.reason(name):
                return False
            raise
        return model.ready and (model.plan is None or self.sequences.available)

    def model_config(self, name: str, version: str | None) -> dict[str, Any]:
        """The model's configuration as Triton answers it (GET .../config)."""
        return self.ready_model(name, version).config()

    async def statistics(self, name: str | None, version: str | None) -> list[dict[str, Any]]:
        """Triton's `model_stats`: of every ready model version, of every ready version of
        `name`, or of one version; in cluster mode summed over the live replicas."""
        if name is None:
            models = ready_models(self.repository())
        else:
            try:
                model = self.model(name, version)
            except NotFound:
                raise InvalidInput(f"requested model '{name[:100]}' is not available") from None
            models = [model] if version is not None else model_versions(model, self.repository())
            models = [m for m in models if m.ready]
            if not models:
                what = f"version is not available for model '{name[:100]}'" if version else (
                    f"'{name[:100]}' is not available")  # fmt: skip
                raise InvalidInput(f"requested model {what}")
        versions = [(m.name, str(m.version)) for m in models]
        if self.shared_stats is not None:
            return await self.shared_stats.reports(versions)
        return [self.stats.report(*v) for v in versions]

    # --- the model repository ---

    def repository_index(self, ready_only: bool) -> list[dict[str, Any]]:
        """Every repository model folder, each version tried with its state (Triton's index);
        in cluster mode with the models the cluster wants that are not loaded here yet."""
        repository = self.repository()
        if self.shared_control is not None:
            rows = self.shared_control.index(ready_only)
        else:
            rows = repository.index(ready_only) if repository is not None else []
        if self.sequences.available:
            return rows
        return [row for row in map(self._sequences_away, rows)
                if not ready_only or row.get("state") == "READY"]  # fmt: skip

    def _sequences_away(self, row: dict[str, Any]) -> dict[str, Any]:
        """An index row, UNAVAILABLE when it is a ready sequence model (cluster mode's store is
        away: its steps would be refused)."""
        if row.get("state") != "READY":
            return row
        model = self.model(row["name"], row["version"])
        if model.plan is None:
            return row
        return row | {"state": "UNAVAILABLE", "reason": "its sequences are kept in the cluster "
                      "store (Redis), which is unreachable now"}  # fmt: skip

    async def load(self, name: str, config: str | None, files: Mapping[str, FileData],
                   repository_name: str | None = None,
                   held: Reservation | None = None) -> None:  # fmt: skip
        """Load (or load again) a repository model, all or nothing: explicit model control
        only; `config` and `files` (`<version>/<file>`: bytes, or base64 text) override its
        folder's configuration and model files, or send a model that has no folder. Checked
        before any work (runtime/load_request.py); what the load holds (its decoded files
        and config, and loading them) is claimed from `held`, the door's reservation, or
        from one of its own, for the load's whole time (503 when it is not free in time).
        In cluster mode `shared_control` loads it here first, then on every replica."""
        self._controlled(repository_name)
        request = load_request(name, config, files, self.settings)
        if self.shared_control is not None:
            await self.shared_control.load(request, held)
        else:
            await self.load_here(request, held)

    async def load_here(self, request: LoadRequest, held: Reservation | None = None,
                        then: Callable[[], Awaitable[None]] | None = None) -> None:  # fmt: skip
        """Load a checked request on this process only; `then` runs while what the load
        holds is still claimed (cluster mode shares its files there)."""
        repository = self._controlled(None)
        async with self._claims(held) as claims:
            await claims.grow(request.memory)
            await repository.load(request.name, request.overrides)
            if then is not None:
                await then()

    async def unload(self, name: str, repository_name: str | None = None) -> None:
        """Unload a repository model (its requests in flight finish): explicit mode only; in
        cluster mode on every replica (`shared_control`)."""
        self._controlled(repository_name)
        if self.shared_control is not None:
            await self.shared_control.unload(name)
        else:
            await self.unload_here(name)

    async def unload_here(self, name: str) -> None:
        """Unload a model on this process only. What it held goes back to the system once the
        budget is idle (the heap trim)."""
        await self._controlled(None).unload(name)
        self.budget.freed()

    @asynccontextmanager
    async def _claims(self, held: Reservation | None) -> AsyncIterator[Reservation]:
        if held is not None:
            yield held  # the door's: released with the request
            return
        async with self.budget.reservation() as own:
            yield own

    def _controlled(self, repository_name: str | None) -> Any:
        if repository_name:
            raise Unsupported("'repository_name' specification is not supported")
        if self.settings.model_control_mode != "explicit":
            raise Unavailable("explicit model load / unload is not allowed if polling is "
                              "enabled")  # Triton's words, whatever the mode  # fmt: skip
        repository = self.repository()
        if repository is None or repository.root is None:
            raise Unavailable("there is no model repository (OPSERVE_MODEL_REPOSITORY)")
        return repository

    # --- inference ---

    def one_step_model(self, name: str, version: str | None) -> OperatorModel | None:
        """The model when a small call to it may be answered in one step (api/one_step.py,
        api/v2_operator_call.py): ready, with no sequences and never drained, that is an
        operator version; else None (the general path finds it again and answers, or refuses,
        as always). An operator version is always ready and never drained; a repository
        model, which wins over an operator of its name, never takes this step."""
        repository = self.repository()
        if (repository is not None and name in repository) or self.tracing.on:
            return None  # a traced call takes the general path, which traces it
        return operator_named(name, version)

    def _still_serving(self, model: V2Model) -> V2Model:
        """The model found when the request's headers came; or, when its version was freed
        while the request was read (a reload replaced it) and the request named no version,
        the newest ready one now. A version the request named that is gone stays refused
        (serving: 503), as does a model with none ready any more."""
        if not isinstance(model, RepositoryModel) or model.pinned or not model.unloaded:
            return model
        try:
            return self.ready_model(model.name, None)
        except ServiceError:
            return model

    async def infer(self, model: V2Model, parse: Parse, encode: Encode[T], held: Reservation,
                    body_bytes: int, small: bool,
                    disconnected: Disconnected | None = None,
                    trace: TraceContext | None = None) -> T:  # fmt: skip
        """One inference on a ready `model` (ready_model): run inline when `small` (and the
        model's work allows it), else on a kernel thread under the memory budget
        (execution.py); nothing is decoded before it runs. A sequence model's request waits
        for its sequence's turn once it is read (core/sequences.py). With `disconnected`, a
        run on a thread stops when the client leaves (and past OPSERVE_MAX_RUN_SECONDS).
        Traced as the trace settings say (core/tracing.py; `trace`: the door's context, made
        while tracing is on)."""
        model = self._still_serving(model)
        work = InferWork(model, parse, encode, self.limits, body_bytes, self.shm)
        if self.tracing.on:  # the one check an untraced request pays
            return await self.tracing.traced(model, work, trace, self._infer(
                model, work, held, small, disconnected))  # fmt: skip
        return await self._infer(model, work, held, small, disconnected)

    async def _infer(self, model: V2Model, work: InferWork[T], held: Reservation, small: bool,
                     disconnected: Disconnected | None) -> T:  # fmt: skip
        stats = self.stats.of(model.name, str(model.version))
        cache = self.cache  # a repeated request answered from the response cache
        if cache is not None and (tag := cache.tag(model)) is not None:
            return await cache.serve(work, tag, held, small, stats, partial(
                self._scheduled, model, work, held, small, stats, disconnected))  # fmt: skip
        return await self._scheduled(model, work, held, small, stats, disconnected)

    async def _scheduled(self, model: V2Model, work: InferWork[T], held: Reservation,
                         small: bool, stats: ModelStatistics,
                         disconnected: Disconnected | None) -> T:  # fmt: skip
        """The request through its model's scheduler: the direct run, the dynamic batcher,
        or a sequence's turn (and the oldest strategy's batches)."""
        batcher = self._batcher(model, stats)
        with model.serving():
            if model.plan is None:
                if batcher is None:
                    return await self.execution.run(work, held, small and model.inline, stats,
                                                    disconnected)  # fmt: skip
                if batcher.idle:  # nothing to batch with: at once, as without batching
                    with batcher.direct():
                        return await self.execution.run(work, held, small and model.inline,
                                                        stats, disconnected)  # fmt: skip
                return await self._batched(batcher, work, held, small, stats, disconnected)
            await self.execution.run(Preparing(work), held, small)
            if small:  # read inline: what it holds is reserved before the run's thread
                await held.grow(work.holding)
            assert work.call is not None and work.inputs is not None
            request = sequence_request(work.call.parameters)
            model.plan.check_batch(work.inputs)
            async with self.sequences.turn((model.name, model.version), model.plan, request,
                                           Resend(work.call, work.inputs)) as turn:  # fmt: skip
                work.turn = turn
                if batcher is None:
                    return await self.execution.run(work, held, False, stats, disconnected)
                # the oldest strategy: steps of different sequences run in batches
                if batcher.idle:
                    with batcher.direct():
                        return await self.execution.run(work, held, False, stats,
                                                        disconnected)  # fmt: skip
                return await self._batched(batcher, work, held, small, stats, disconnected,
                                           turn)  # fmt: skip

    async def _batched(self, batcher: DynamicBatcher, work: InferWork[T], held: Reservation,
                       small: bool, stats: ModelStatistics, disconnected: Disconnected | None,
                       turn: Any = None) -> T:  # fmt: skip
        """A request through its model's batcher: read and decoded (a sequence's step, with
        its `turn`, was already), queued, its rows of a batch's outputs (claimed), encoded in
        its own form."""
        arrived = perf_counter_ns()
        try:
            if turn is None:
                await self.execution.run(Preparing(work), held, small)
                if small:  # read inline: what it holds is reserved while it queues
                    await held.grow(work.holding)
            call, inputs = work.call, work.inputs
            assert call is not None and inputs is not None
            wanted = [o.name for o in call.outputs] if call.outputs else None
            produced = await batcher.submit(inputs, wanted, call.parameters, work.timings,
                                            disconnected, turn)  # fmt: skip
            await held.grow(sum(array.nbytes for array in produced.values()))
            work.produced = produced
            answer = await self.execution.run(work, held, small)
        except Exception as exc:
            stats.failed(arrived, exc)
            raise
        stats.succeeded(arrived, work.timings)
        return answer

    def _batcher(self, model: V2Model, stats: ModelStatistics) -> DynamicBatcher | None:
        """The batcher of a repository model version whose configuration asks for one
        (dynamic_batching, or sequence_batching's `oldest`), made at its first request and
        kept with the version."""
        if not isinstance(model, RepositoryModel):
            return None
        entry = model.entry
        batcher = entry.batcher
        if batcher is None:
            policy = batch_policy(entry.config)
            batcher = entry.batcher = False if policy is None else DynamicBatcher(
                entry, policy, self.execution, self.budget, stats,
                self.settings.max_queued_runs)  # fmt: skip
        return batcher or None
