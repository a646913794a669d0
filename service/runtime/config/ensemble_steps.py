"""An ensemble's configuration against its step models' completed configurations, as Triton's
ValidateEnsembleConfig checks it once the step models are loaded, with its texts: each step's
maps name the model's real inputs and outputs, every required input is fed once, and an
ensemble tensor has one data type and shape wherever it is used (a batching model's tensors
count their batch dim, so a non-batching model may see [-1, 16] where another sees [16])."""

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from service.errors import InvalidInput
from service.runtime.config.ensemble import Step
from service.runtime.config.messages import dims_text, shown, type_name


@dataclass(frozen=True)
class _Seen:
    """An ensemble tensor as one model declares it."""

    model: str
    data_type: int
    dims: tuple[int, ...]
    full: tuple[int, ...]  # with -1 first when the model batches


def check_steps(config: Any, steps: tuple[Step, ...], config_of: Callable[[Step], Any]) -> None:
    """Refuse (InvalidInput) an ensemble whose steps disagree with their models' configs
    (`config_of(step)`: the completed config of the version the step runs)."""
    name = shown(config.name)
    tensors: dict[str, _Seen] = {}
    for role in (config.input, config.output):
        for io in role:
            dims = io.reshape.shape if io.HasField("reshape") else io.dims
            tensors[io.name] = _seen(name, config.max_batch_size, io.data_type, dims)
    for step in sorted(steps, key=lambda s: s.index):
        model = config_of(step)
        if 0 < model.max_batch_size < config.max_batch_size:
            raise InvalidInput(f"ensemble {name} allows maximum batch size "
                               f"{config.max_batch_size}, but it contains model "
                               f"{shown(step.model)} which only allows maximum batch size to "
                               f"be {model.max_batch_size}")  # fmt: skip
        _check_inputs(name, step, model, tensors)
        _check_outputs(name, step, model, tensors)


def _seen(model: str, max_batch_size: int, data_type: int, dims: Any) -> _Seen:
    dims = tuple(int(d) for d in dims)
    return _Seen(model, data_type, dims, (-1, *dims) if max_batch_size > 0 else dims)


def _check_inputs(name: str, step: Step, model: Any, tensors: dict[str, _Seen]) -> None:
    step_model = shown(step.model)
    declared = {io.name: io for io in model.input}
    for model_input, tensor in step.inputs:
        if model_input not in declared:
            raise InvalidInput(f"in ensemble {name}, ensemble tensor {shown(tensor)} is "
                               f"mapping to non-existing input {shown(model_input)} in model "
                               f"{step_model}")  # fmt: skip
    fed = dict(step.inputs)
    for io in model.input:
        mapped = fed.get(io.name)
        if mapped is None:
            if io.optional:
                continue
            raise InvalidInput(f"in ensemble {name}, input {shown(io.name)} in model "
                               f"{step_model} is not mapped to any ensemble tensors")  # fmt: skip
        _agree(name, mapped, _seen(step.model, model.max_batch_size, io.data_type, io.dims),
               tensors)  # fmt: skip


def _check_outputs(name: str, step: Step, model: Any, tensors: dict[str, _Seen]) -> None:
    declared = {io.name: io for io in model.output}
    for model_output, tensor in step.outputs:
        io = declared.get(model_output)
        if io is None:
            raise InvalidInput(f"in ensemble {name}, ensemble tensor {shown(tensor)} is mapped "
                               f"from non-existing output {shown(model_output)} in model "
                               f"{shown(step.model)}")  # fmt: skip
        _agree(name, tensor, _seen(step.model, model.max_batch_size, io.data_type, io.dims),
               tensors)  # fmt: skip


def _agree(name: str, tensor: str, seen: _Seen, tensors: dict[str, _Seen]) -> None:
    """ValidateTensorConsistency: the first model to declare a tensor sets its type and shape;
    shapes agree when equal but for -1 dims, with or without the batch dim."""
    first = tensors.setdefault(tensor, seen)
    prefix = f"in ensemble {name}, ensemble tensor {shown(tensor)}: "
    if first.data_type != seen.data_type:
        raise InvalidInput(f"{prefix}inconsistent data type: {type_name(first.data_type)} is "
                           f"inferred from model {shown(first.model)} while "
                           f"{type_name(seen.data_type)} is inferred from model "
                           f"{shown(seen.model)}")  # fmt: skip
    if not (_match(first.dims, seen.dims) or _match(first.full, seen.full)):
        raise InvalidInput(f"{prefix}inconsistent shape: {dims_text(first.full)} is inferred "
                           f"from model {shown(first.model)} while {dims_text(seen.full)} is "
                           f"inferred from model {shown(seen.model)}")  # fmt: skip


def _match(a: tuple[int, ...], b: tuple[int, ...]) -> bool:
    """CompareDimsWithWildcard."""
    return len(a) == len(b) and all(x == y or -1 in (x, y) for x, y in zip(a, b, strict=True))
