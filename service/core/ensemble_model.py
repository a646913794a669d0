"""Ensembles (platform "ensemble") as V2 models: a request runs the steps its outputs need, in
order, on its own thread (or inline when every step model may), each step calling its model's
own `infer` with the arrays the earlier steps made (nothing is encoded between steps), under
the request's KernelContext: one deadline, one client-left stop and one memory reservation for
the whole. An intermediate no later step reads is let go, and its claim given back.

The step models' versions are found when the request starts to be served (`serving`, on the
event loop), and held as the request holds its own (an unloaded step model drains first). Each
step counts in its own model's statistics, as Triton counts it: the counts are kept on the
run's thread and added on the event loop when the request ends (statistics.py has no lock),
with the times they took.
"""

from collections.abc import Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from time import perf_counter_ns
from typing import Any

import numpy as np

from api_schemas.v2 import Parameter
from service.core.repository_model import RepositoryModel
from service.core.statistics import ModelStatistics, Timings
from service.errors import ServiceError, Unavailable
from service.kernels.context import KernelContext
from service.runtime import engine_time
from service.runtime.config.ensemble import LATEST, Step
from service.runtime.ensembles import ensemble_of, step_entry

PLATFORM = "ensemble"
# (its model's counts or None, when it began, its timings or the error it failed with, when
# it ended)
_Record = tuple[ModelStatistics | None, int, Timings | ServiceError, int]


def repository_model(entry: Any, versions: Sequence[int], pinned: bool,
                     repository: Any) -> RepositoryModel:  # fmt: skip
    """The V2 model of one repository version: an ensemble's, or a graph's."""
    if ensemble_of(entry) is not None:
        return EnsembleModel(entry, versions, pinned, repository)
    return RepositoryModel(entry, versions, pinned)


class EnsembleModel(RepositoryModel):
    """One version of an ensemble; made per request (it holds the request's step models)."""

    def __init__(self, entry: Any, versions: Sequence[int], pinned: bool,
                 repository: Any) -> None:  # fmt: skip
        super().__init__(entry, versions, pinned)
        self.repository = repository
        # the data plane's counts (the app hands them to the repository); None: not counted
        self.statistics = getattr(repository, "statistics", None)
        self.steps: dict[tuple[str, int], tuple[RepositoryModel, ModelStatistics | None]] = {}
        self.records: list[_Record] = []

    @property
    def inline(self) -> bool:
        """Inline when every step model may run inline (found by `serving`) and at most one
        runs in the isolated workers: an inline attempt awaits one worker's run
        (workers/on_loop.py), and a second would start the request again on a thread."""
        if not self.steps or not all(model.inline for model, _ in self.steps.values()):
            return False
        ensemble = ensemble_of(self.entry)
        assert ensemble is not None
        return sum(self.steps[(step.model, step.version)][0].isolated
                   for step in ensemble.plan.steps) <= 1  # fmt: skip

    def metadata(self) -> dict[str, Any]:
        return {**super().metadata(), "platform": PLATFORM}

    @contextmanager
    def serving(self) -> Iterator[None]:
        """The ensemble's version and each step's held while the request runs; the steps'
        counts added once it ends."""
        with ExitStack() as held:
            held.enter_context(super().serving())
            ensemble = ensemble_of(self.entry)
            assert ensemble is not None
            for step in ensemble.plan.steps:
                key = (step.model, step.version)
                if key not in self.steps:
                    model = self._step_model(step)
                    held.enter_context(model.serving())
                    stats = self.statistics
                    counts = stats.of(model.name, str(model.version)) if stats else None
                    self.steps[key] = (model, counts)
            try:
                yield
            finally:
                self._count()

    def _step_model(self, step: Step) -> RepositoryModel:
        lookup = self.repository.lookup
        entry = step_entry(step, lookup)
        if entry is None:
            depends = f"ensemble '{self.name[:100]}' depends on '{step.model[:100]}'"
            raise Unavailable(f"{depends} which has no loaded version" if step.version == LATEST
                              else f"{depends} whose required version {step.version} is not "
                              "loaded")  # fmt: skip
        found = lookup(step.model)
        ready = sorted(n for n, e in found.versions.items() if e.ready)
        return repository_model(entry, ready, step.version != LATEST, self.repository)

    def infer(
        self,
        inputs: Mapping[str, np.ndarray],
        parameters: Mapping[str, Parameter],
        outputs: Sequence[str] | None,
        ctx: KernelContext,
        turn: Any = None,
    ) -> dict[str, np.ndarray]:
        """The ensemble's own checks (its configuration, as Triton's on its request), then
        the steps the outputs asked for need; the outputs in config order when none is
        named."""
        entry, ensemble = self.entry, ensemble_of(self.entry)
        assert ensemble is not None and self.steps, "infer runs inside serving()"
        records: list[_Record] = []  # this attempt's (an attempt may start again on a thread)
        self.records = records
        tensors = entry.io.graph_inputs(inputs)
        wanted = entry.io.output_names(outputs)
        steps = ensemble.plan.needed(wanted)
        last = {tensor: i for i, step in enumerate(steps) for _, tensor in step.inputs}
        made: dict[str, int] = {}  # intermediates a step made, with the bytes they claimed
        inner = ctx.for_format(None)  # a step's outputs are intermediates: not answered
        for i, step in enumerate(steps):
            if ctx.control is not None:
                ctx.control.check(f"ensemble step {step.index} ({step.model[:100]})")
            model, counts = self.steps[(step.model, step.version)]
            fed = {name: tensors[tensor] for name, tensor in step.inputs}
            produced = _run_step(model, counts, fed, parameters,
                                 [name for name, _ in step.outputs], inner, records)  # fmt: skip
            for name, tensor in step.outputs:
                tensors[tensor] = produced[name]
                made[tensor] = produced[name].nbytes
            for tensor in [t for t in made if last.get(t, -1) <= i and t not in wanted]:
                del tensors[tensor]
                nbytes = made.pop(tensor)  # let go once, claimed or not (inline: unclaimed)
                if ctx.claims is not None:
                    ctx.claims.unclaim(nbytes)
        answer = entry.io.client_outputs({name: tensors[name] for name in wanted})
        ctx.check_answer(*answer.values())
        return answer

    def _count(self) -> None:
        """Add the steps' counts (on the event loop), each as long as its step took."""
        now = perf_counter_ns()
        for counts, began, timings, ended in self.records:
            if counts is None:
                continue
            shift = now - ended  # statistics.py times a request up to when it is counted
            if isinstance(timings, ServiceError):  # the step failed with it
                counts.failed(began + shift, timings)
                continue
            timings.started += shift
            counts.succeeded(began + shift, timings)
        self.records = []


def _run_step(model: RepositoryModel, counts: ModelStatistics | None,
              fed: dict[str, np.ndarray], parameters: Mapping[str, Parameter],
              asked: list[str], ctx: KernelContext, records: list[_Record]) -> dict[str, np.ndarray]:  # fmt: skip
    """One step on its model, timed as the data plane times a request (the engine's own run is
    compute_infer: runtime/engine_time.py)."""
    timings = Timings()
    began = timings.started = perf_counter_ns()
    engine_time.take()
    try:
        produced = model.infer(fed, parameters, asked, ctx)
    except ServiceError as exc:  # a failure of the step (not a move to a thread, nor a memory wait)
        records.append((counts, began, exc, perf_counter_ns()))
        raise
    ended = perf_counter_ns()
    started, stopped = engine_time.take() or (began, ended)
    timings.compute_input = started - began
    timings.compute_infer = stopped - started
    timings.compute_output = ended - stopped
    timings.batch = model.batch_size(fed)
    records.append((counts, began, timings, ended))
    return produced
