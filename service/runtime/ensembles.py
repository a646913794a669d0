"""Ensembles in the repository: a loaded ensemble version (`Ensemble`, which holds its plan
where other versions hold a graph), and what linking it to its step models finds, in Triton's
words (its model repository manager's dependency checks, then ValidateEnsembleConfig). An
ensemble loads after its step models, which must be ready; the repository links it again
whenever one of them changes, and takes it out of service when that breaks it."""

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from service.errors import InvalidInput, ServiceError
from service.runtime.config.ensemble import LATEST, EnsemblePlan, Step
from service.runtime.config.ensemble_steps import check_steps
from service.runtime.config.messages import shown

UNLOADED = "unloaded"  # the reason of a version unloaded on purpose (runtime/repository.py)
Lookup = Callable[[str], Any]
"""A model's ModelVersions in the repository's table, or None (runtime/model_loader.py)."""


@dataclass(frozen=True)
class Ensemble:
    """What an ensemble version holds: its plan. It has a graph's fields (none), so the
    listings that show a version's graph show it; it runs over V2 only
    (core/ensemble_model.py)."""

    plan: EnsemblePlan
    inputs: tuple[Any, ...] = ()
    outputs: tuple[Any, ...] = ()
    initializers: Mapping[str, Any] = field(default_factory=dict)
    engine: str = "ensemble"
    engine_reason: str = ""
    inline: bool = False

    def run(self, *args: Any, **kwargs: Any) -> Any:
        raise InvalidInput("an ensemble runs over the V2 protocol only "
                           "(POST /v2/models/{name}/infer)")  # fmt: skip


def ensemble_of(entry: Any) -> Ensemble | None:
    """The ensemble a repository version holds (None: a graph, or nothing)."""
    model = entry.model if entry is not None else None
    return model if isinstance(model, Ensemble) else None


def step_entry(step: Step, lookup: Lookup) -> Any:
    """The ready version a step runs now (its newest ready one for LATEST), or None."""
    found = lookup(step.model)
    versions = found.versions if found is not None else {}
    if step.version != LATEST:
        entry = versions.get(step.version)
        return entry if entry is not None and entry.ready else None
    ready = [number for number, entry in versions.items() if entry.ready]
    return versions[max(ready)] if ready else None


def link_problem(name: str, config: Any, plan: EnsemblePlan, lookup: Lookup) -> str | None:
    """Why the ensemble `name` cannot serve over the step models `lookup` finds now (None: it
    can): a model missing, with no ready version or not the version asked for, a circle of
    ensembles, or a step that disagrees with its model's configuration."""
    circle = _circle(name, plan, lookup)
    if circle is not None:
        return f"circular dependency between ensembles: {shown(name)} -> ... -> " + (
            f"{shown(circle)} -> {shown(name)}")  # fmt: skip
    missing = sorted({s.model for s in plan.steps if lookup(s.model) is None})
    if missing:
        return (f"ensemble {shown(name)} contains models that are not available or ambiguous: "
                f"{', '.join(shown(m) for m in missing)}")  # fmt: skip
    for model in plan.models():
        problem = _unloaded(name, model, plan, lookup)
        if problem is not None:
            return problem
    sequences = [s.model for s in plan.steps if step_entry(s, lookup).plan is not None]
    if sequences:
        return (f"ensemble '{shown(name)}' runs the sequence model '{shown(sequences[0])}' as a "
                "step, which opserve does not do (its steps take no sequence controls)")  # fmt: skip
    try:
        check_steps(config, plan.steps, lambda step: step_entry(step, lookup).config)
    except ServiceError as exc:
        return str(exc)
    return None


def _unloaded(name: str, model: str, plan: EnsemblePlan, lookup: Lookup) -> str | None:
    found = lookup(model)
    depends = f"ensemble '{shown(name)}' depends on '{shown(model)}'"
    if found.error is not None:
        return f"{depends} which is not valid. Model '{shown(model)}' failed with error: " + (
            found.error)  # fmt: skip
    ready = [n for n, entry in found.versions.items() if entry.ready]
    if not ready:
        failed = [entry.error for entry in found.versions.values()
                  if entry.error and entry.error != UNLOADED]  # fmt: skip
        why = f" Model '{shown(model)}' loading failed with error: {failed[-1]}" if failed else ""
        return f"{depends} which has no loaded version.{why}"
    for step in plan.steps:
        if step.model == model and step.version != LATEST and step.version not in ready:
            return f"{depends} whose required version {step.version} is not loaded."
    return None


def _circle(name: str, plan: EnsemblePlan, lookup: Lookup) -> str | None:
    """The ensemble whose step leads back to `name`, following ready ensembles' steps."""
    stack, seen = [(name, plan)], {name}
    while stack:
        here, at = stack.pop()
        for step in at.steps:
            if step.model == name:
                return here
            entry = step_entry(step, lookup)
            inner = ensemble_of(entry)
            if inner is not None and step.model not in seen:
                seen.add(step.model)
                stack.append((step.model, inner.plan))
    return None


def load_order(plans: Mapping[str, EnsemblePlan]) -> list[str]:
    """Ensembles loaded together (start-up, a poll), each after those of them its steps
    name; a circle among them keeps its order (each then finds the others missing)."""
    ordered: list[str] = []
    waiting = dict(sorted(plans.items()))
    while waiting:
        free = [n for n, p in waiting.items() if not set(p.models()) & (waiting.keys() - {n})]
        for name in free or list(waiting):
            ordered.append(name)
            del waiting[name]
    return ordered


def depending_on(names: Iterable[str], table: Mapping[str, Any]) -> list[str]:
    """The ensembles of the table whose steps name any of `names`, with the ensembles that
    depend on those in turn, dependencies first."""
    changed, found = set(names), []
    grew = True
    while grew:
        grew = False
        for name, models in sorted(table.items()):
            if name in found:
                continue
            for entry in models.versions.values():
                ensemble = ensemble_of(entry)
                if ensemble is not None and set(ensemble.plan.models()) & changed:
                    found.append(name)
                    changed.add(name)
                    grew = True
                    break
    return found
