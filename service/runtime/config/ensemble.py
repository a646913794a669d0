"""An ensemble's configuration on its own (platform "ensemble", `ensemble_scheduling`):
completed and checked as Triton's core does it (ValidateModelConfig,
ValidateEnsembleSchedulingConfig), with its texts, and compiled into an `EnsemblePlan`, its
steps in an order they can run in. The checks against the step models' configurations are
config/ensemble_steps.py's; finding the step models is runtime/ensembles.py's."""

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from service.errors import InvalidInput
from service.runtime.config.checks import check_tensors
from service.runtime.config.messages import ModelConfig, shown

PLATFORM = "ensemble"
LATEST = -1  # a step's model_version for the newest ready version


@dataclass(frozen=True)
class Step:
    """One step: a model version, fed ensemble tensors, feeding ensemble tensors."""

    index: int  # its place in the configuration
    model: str
    version: int  # LATEST, or a version number
    inputs: tuple[tuple[str, str], ...]  # (the model's input, the ensemble tensor fed to it)
    outputs: tuple[tuple[str, str], ...]  # (the model's output, the ensemble tensor it writes)


@dataclass(frozen=True)
class EnsemblePlan:
    """The steps in an order they can run in (each after the steps writing its inputs)."""

    steps: tuple[Step, ...]

    def needed(self, wanted: Sequence[str]) -> list[Step]:
        """The steps the ensemble tensors `wanted` need, in run order (Triton runs no step
        whose outputs nothing asked for reads)."""
        need, chosen = set(wanted), []
        for step in reversed(self.steps):
            if any(tensor in need for _, tensor in step.outputs):
                chosen.append(step)
                need.update(tensor for _, tensor in step.inputs)
        return chosen[::-1]

    def models(self) -> list[str]:
        """The step models' names, each once, in configuration order."""
        return list(dict.fromkeys(s.model for s in sorted(self.steps, key=lambda s: s.index)))


def is_ensemble(config: Any) -> bool:
    """Whether a configuration is an ensemble's (its platform says so)."""
    return config is not None and config.platform == PLATFORM


def complete_ensemble(config: Any, name: str) -> tuple[Any, EnsemblePlan]:
    """The completed, checked copy of an ensemble's configuration and its plan."""
    done = ModelConfig()
    done.CopyFrom(config)
    done.name = done.name or name
    model = shown(done.name)
    if done.name != name:
        raise InvalidInput(f"unexpected directory name '{shown(name)}' for model '{model}', "
                           "directory name must equal model name")  # fmt: skip
    if done.backend:
        raise InvalidInput(f"Ensemble model '{model}' must have platform type 'ensemble' and "
                           "empty backend type")  # fmt: skip
    if not done.HasField("ensemble_scheduling"):
        raise InvalidInput(f"ensemble '{model}' must specify 'ensemble_scheduling' (its steps)")
    if done.max_batch_size < 0:
        raise InvalidInput(f"'max_batch_size' must be non-negative value for {model}")
    if not done.HasField("version_policy"):
        done.version_policy.latest.num_versions = 1
    _check_scheduling(done, model)
    check_tensors(done)
    return done, EnsemblePlan(_ordered(done))


def _check_scheduling(config: Any, model: str) -> None:
    """ValidateEnsembleSchedulingConfig's field checks, then its data flow."""
    for field, text in (("instance_group", f"instance group should not be specified for "
                                           f"ensemble '{model}'"),
                        ("model_warmup", f"model_warmup can not be specified for ensemble "
                                         f"'{model}'")):  # fmt: skip
        if len(getattr(config, field)):
            raise InvalidInput(text)
    if config.HasField("optimization"):
        raise InvalidInput(f"optimization should not be specified for ensemble '{model}'")
    if config.model_transaction_policy.decoupled:
        raise InvalidInput(f"model '{model}' has a decoupled transaction policy; opserve "
                           "serves no decoupled models")  # fmt: skip
    if not len(config.ensemble_scheduling.step):
        raise InvalidInput(f"must specify 'step' for ensemble '{model}'")
    _check_flow(config, model, _graph(config, model))


@dataclass
class _Tensor:
    """An ensemble tensor in the data flow: the tensors its step reads, the ones it feeds."""

    written: bool = False  # by a step (an output map names it)
    ready: bool = False
    before: list[str] | None = None
    after: list[str] | None = None


def _graph(config: Any, model: str) -> dict[str, _Tensor]:
    """BuildEnsembleGraph: each step's outputs depend on each of its inputs."""
    tensors: dict[str, _Tensor] = {}
    for index, step in enumerate(config.ensemble_scheduling.step):
        for field in ("model_name", "input_map", "output_map"):
            if not getattr(step, field):
                raise InvalidInput(f"must specify '{field}' in step {index} of ensemble "
                                   f"'{model}'")  # fmt: skip
        written = []
        for _, tensor in sorted(step.output_map.items()):  # maps have no order: by key
            node = tensors.setdefault(tensor, _Tensor(before=[], after=[]))
            if node.written:
                raise InvalidInput(f"ensemble tensor '{shown(tensor)}' can appear in an output "
                                   f"map only once for ensemble '{model}' step {index}")  # fmt: skip
            node.written = True
            written.append(tensor)
        for _, tensor in sorted(step.input_map.items()):  # a map: each model input once
            node = tensors.setdefault(tensor, _Tensor(before=[], after=[]))
            for out in written:
                tensors[out].before.append(tensor)  # type: ignore[union-attr]
                node.after.append(out)  # type: ignore[union-attr]
    return tensors


def _check_flow(config: Any, model: str, tensors: dict[str, _Tensor]) -> None:
    """Every ensemble output written from the inputs; every other tensor read (a cycle leaves
    its tensors unwritten: Triton's texts name them)."""
    queue = []
    for io in config.input:
        if io.name not in tensors:
            raise InvalidInput(f"ensemble input '{shown(io.name)}' for ensemble {model}' is "
                               "not used")  # Triton's quote marks  # fmt: skip
        tensors[io.name].ready = True
        queue.append(io.name)
    while queue:
        for name in tensors[queue.pop(0)].after or ():
            node = tensors[name]
            if not node.ready and all(tensors[t].ready for t in node.before or ()):
                node.ready = True
                queue.append(name)
    outputs = set()
    for io in config.output:
        written = tensors.get(io.name)
        if written is None:
            raise InvalidInput(f"ensemble output '{shown(io.name)}' for ensemble {model}' is "
                               "not used")  # fmt: skip
        if not written.ready:
            raise InvalidInput(f"output '{shown(io.name)}' for ensemble '{model}' is not "
                               f"written{_unconnected(io.name, tensors)}")  # fmt: skip
        outputs.add(io.name)
    for name, node in sorted(tensors.items()):
        if name not in outputs and (not node.ready or not node.after):
            raise InvalidInput(f"ensemble tensor '{shown(name)}' is unused in ensemble "
                               f"'{model}'")  # fmt: skip


def _unconnected(name: str, tensors: dict[str, _Tensor]) -> str:
    """Triton's hint: the first unwritten tensor found walking back from an output."""
    seen, last, before = set(), name, tensors[name].before
    while before:
        found = next((t for t in before if not tensors[t].ready and t not in seen), None)
        if found is None:
            break
        seen.add(found)
        last, before = found, tensors[found].before
    if last == name:
        return ""
    return f": at least one of its depending tensors, '{shown(last)}', is not connected"


def _ordered(config: Any) -> tuple[Step, ...]:
    """The steps in an order they can run in: the first whose inputs are all written, again
    (the data flow check made sure every step can run)."""
    waiting = [Step(i, s.model_name, s.model_version, tuple(sorted(s.input_map.items())),
                    tuple(sorted(s.output_map.items())))
               for i, s in enumerate(config.ensemble_scheduling.step)]  # fmt: skip
    available = {io.name for io in config.input}
    ordered: list[Step] = []
    while waiting:
        step = next((s for s in waiting if all(t in available for _, t in s.inputs)), None)
        if step is None:  # a step fed only by a cycle: its tensors are unused, refused above
            raise InvalidInput(f"step {waiting[0].index} of ensemble '{shown(config.name)}' "
                               "can never run: its inputs are not written")  # fmt: skip
        waiting.remove(step)
        ordered.append(step)
        available.update(t for _, t in step.outputs)
    return tuple(ordered)
