"""Checks of a completed model configuration on its own, before it meets the graph: what
Triton's core validates (ValidateModelConfig, ValidateModelIOConfig, the sequence control
properties), with its texts, plus what opserve does not serve (decoupled models, batch inputs
and outputs, GPU instances). An ensemble's configuration is config/ensemble.py's."""

from typing import Any

from service.errors import InvalidInput
from service.runtime.config.messages import DataType, InstanceGroup, ModelInput, shown
from service.runtime.sequence_plan import sequence_plan

WILDCARD = -1
INT64_MAX = 2**63 - 1


DELAY = 1  # ModelQueuePolicy.TimeoutAction


def check_config(config: Any) -> None:
    """Refuse a config Triton's core would refuse, or one opserve cannot serve."""
    model = shown(config.name)
    _check_served(config, model)
    if config.max_batch_size < 0:
        raise InvalidInput(f"'max_batch_size' must be non-negative value for {model}")
    if config.HasField("dynamic_batching"):
        _check_preferred(config.dynamic_batching.preferred_batch_size, config, "dynamic batching "
                         "preferred size must be")  # fmt: skip
        _check_queues(config.dynamic_batching, model)
    if config.HasField("sequence_batching"):
        _check_sequence_batching(config, model)
    for group in config.instance_group:
        if group.kind == InstanceGroup.KIND_GPU:
            raise InvalidInput(f"instance group {shown(group.name)} of model {model} has kind "
                               "KIND_GPU but server does not support GPUs")  # fmt: skip
    check_tensors(config)


def check_tensors(config: Any) -> None:
    """Triton's ValidateModelIOConfig on the inputs and outputs (an ensemble's too)."""
    for io in config.input:
        _check_io(io, config, "model input ")
        if io.format in (ModelInput.FORMAT_NHWC, ModelInput.FORMAT_NCHW) and len(io.dims) != 3:
            raise InvalidInput(f"model input NHWC/NCHW require 3 dims for {shown(config.name)}")
    for io in config.output:
        _check_io(io, config, "model output ")


def _check_queues(dynamic: Any, model: str) -> None:
    """Priority levels and queue policies as Triton's ValidateModelConfig checks them (its
    texts): levels in range, and no DELAY or several levels with preserve_ordering."""
    levels = dynamic.priority_levels
    if levels:
        if not 1 <= dynamic.default_priority_level <= levels:
            raise InvalidInput(f"default priority level must be in range [1, {levels}] for "
                               f"{model}")  # fmt: skip
        if any(not 1 <= level <= levels for level in dynamic.priority_queue_policy):
            raise InvalidInput("priority queue policy must have priority level in range "
                               f"[1, {levels}] for {model}")  # fmt: skip
    if dynamic.preserve_ordering:
        if levels > 1:
            raise InvalidInput("Only one priority level is allowed when 'preserve_ordering' "
                               f"is true for {model}")  # fmt: skip
        policies = [dynamic.default_queue_policy, *dynamic.priority_queue_policy.values()]
        if any(p.default_timeout_microseconds and p.timeout_action == DELAY for p in policies):
            raise InvalidInput("Queue policy can not have DELAY as timeout action when "
                               f"'preserve_ordering' is true for {model}")  # fmt: skip


def _check_served(config: Any, model: str) -> None:
    if config.HasField("ensemble_scheduling"):
        raise InvalidInput(f"ensemble scheduling cannot be set for model '{model}' whose "
                           "platform is not ensemble")  # fmt: skip
    if config.model_transaction_policy.decoupled:
        raise InvalidInput(f"model '{model}' has a decoupled transaction policy; opserve "
                           "serves no decoupled models")  # fmt: skip
    for field in ("batch_input", "batch_output"):
        if len(getattr(config, field)):
            raise InvalidInput(f"model '{model}' specifies {field}, which opserve does not "
                               "support (it batches no requests together)")  # fmt: skip


def _check_preferred(sizes: Any, config: Any, what: str) -> None:
    for size in sizes:
        if size <= 0:
            raise InvalidInput(f"{what} positive for {shown(config.name)}")
        if size > config.max_batch_size:
            raise InvalidInput(f"{what} <= max batch size for {shown(config.name)}")


def _check_sequence_batching(config: Any, model: str) -> None:
    batcher = config.sequence_batching
    if config.response_cache.enable:
        raise InvalidInput(f"Response Cache does not currently support model {model} with "
                           "sequence batching scheduler. Please disable the response cache.")  # fmt: skip
    # the control inputs and states, with Triton's texts (one validation: the plan's)
    sequence_plan(batcher, config.name, config.max_batch_size)
    if batcher.HasField("oldest"):
        _check_preferred(batcher.oldest.preferred_batch_size, config, "sequence batching "
                         "preferred batch size must be")  # fmt: skip
    utilization = batcher.direct.minimum_slot_utilization
    if batcher.HasField("direct") and not 0.0 <= utilization <= 1.0:
        raise InvalidInput("sequence batching minimum slot utilization must be in range "
                           f"(0.0, 1.0] for {model}")  # fmt: skip


def _check_io(io: Any, config: Any, prefix: str) -> None:
    """Triton's ValidateIOShape and the shape-tensor and non-linear-format rules; each text
    ends "for <model>", as ValidateModelIOConfig appends it."""
    problem = _shape_problem(io, config.max_batch_size, prefix)
    if problem is None and io.is_shape_tensor:
        problem = "shape tensors are only supported for TensorRT platform"
    if problem is None and io.is_non_linear_format_io:
        problem = "Non-linear IO format is only supported for the TensorRT platform"
    if problem is not None:
        raise InvalidInput(f"{problem} for {shown(config.name)}")


def _shape_problem(io: Any, max_batch_size: int, prefix: str) -> str | None:
    if not io.name:
        return f"{prefix}must specify 'name'"
    named = f"{prefix}'{shown(io.name)}' "
    if io.data_type == DataType.Value("TYPE_INVALID"):
        return f"{named}must specify 'data_type'"
    if not len(io.dims):
        return f"{named}must specify 'dims'"
    has_reshape = io.HasField("reshape")
    if has_reshape and not len(io.reshape.shape) and max_batch_size == 0:
        return (f"{named}cannot have empty reshape for non-batching model as scalar tensors "
                "are not supported")  # fmt: skip
    if any(d < 1 and d != WILDCARD for d in io.dims):
        return (f"{named}dimension must be integer >= 1, or -1 to indicate a variable-size "
                "dimension")  # fmt: skip
    if not has_reshape:
        return None
    if any(d < 1 and d != WILDCARD for d in io.reshape.shape):
        return (f"{named}reshape dimensions must be integer >= 1, or -1 to indicate a "
                "variable-size dimension")  # fmt: skip
    return _reshape_problem(io, named)


def _reshape_problem(io: Any, named: str) -> str | None:
    """dims and reshape must hold as many elements; with variable-size dims, each stretch
    between them must (Triton: [2,4,-1,6] may become [8,-1,1,6])."""
    dims, reshape = list(io.dims), list(io.reshape.shape)
    trunks, reshape_trunks = _trunks(dims), _trunks(reshape)
    if trunks is None or reshape_trunks is None:
        which = "dims" if trunks is None else "reshape"
        return (f"element count for tensor '{shown(io.name)} {which}' exceeds maximum size of "
                f"{INT64_MAX}")  # fmt: skip
    different = f"{named}has different size for dims and reshape"
    if WILDCARD not in dims:  # an empty reshape is a scalar: dims must hold one element
        fixed = reshape_trunks[0] if WILDCARD not in reshape else -1
        return None if fixed == trunks[0] else different
    if WILDCARD not in reshape:
        return different
    if len(trunks) != len(reshape_trunks):
        return f"{named}has different number of variable-size dimensions for dims and reshape"
    return None if trunks == reshape_trunks else different


def _trunks(dims: list[int]) -> list[int] | None:
    """Element counts of the stretches between variable-size dims; None past int64 (the
    products would otherwise grow without bound)."""
    counts, count = [], 1
    for dim in dims:
        if dim == WILDCARD:
            counts.append(count)
            count = 1
        else:
            count *= dim
            if count > INT64_MAX:
                return None
    return [*counts, count]
