"""A model's configuration completed as Triton serves it, then checked against its graph.

`complete_config` does, for an ONNX model, what Triton's core (AutoCompleteBackendFields,
NormalizeModelConfig, NormalizeInstanceGroup) and the onnxruntime backend's auto-complete
(AutoCompleteMaxBatch, AutoCompleteIO) do, in that order, and then refuses any disagreement
with Triton's texts (config/checks.py on the config alone, config/against_graph.py against the graph).
"""

import logging
from collections.abc import Collection, Sequence
from pathlib import Path
from typing import Any

from service.codecs.dtypes import by_enum
from service.errors import InvalidInput
from service.runtime.config.against_graph import check_against_graph, graph_dims
from service.runtime.config.checks import check_config
from service.runtime.config.files import DEFAULT_MODEL_FILE, check_label_files, model_file
from service.runtime.config.messages import (
    TYPE_INVALID,
    InstanceGroup,
    ModelConfig,
    config_type_of,
    shown,
)
from service.runtime.graph import TensorSpec

log = logging.getLogger("opserve")
PLATFORM = "onnxruntime_onnx"
BACKEND = "onnxruntime"
DEFAULT_MAX_BATCH_SIZE = 4  # Triton's backend config default-max-batch-size
SEQUENCE_IDLE_DEFAULT_MICROSECONDS = 1_000_000
CPU_INSTANCE_COUNT = 2  # SetDefaultInstanceCount: 2 for KIND_CPU with onnxruntime


def complete_config(
    config: Any | None,
    name: str,
    inputs: Sequence[TensorSpec],
    outputs: Sequence[TensorSpec],
    model_dir: Path | None = None,
    *,
    initialized: Collection[str] = (),
    default_max_batch_size: int = DEFAULT_MAX_BATCH_SIZE,
) -> Any:
    """The completed, checked copy of `config` (None: no config.pbtxt) for the model `name`
    whose graph has `inputs` and `outputs`; `initialized` names the graph inputs backed by an
    initializer (onnxruntime's overridable initializers: not counted, may be optional).
    With `model_dir`, label files must resolve inside it. `default_max_batch_size` is what a
    graph that can batch gets when its config says no max_batch_size (0: it does not batch).
    InvalidInput on any disagreement."""
    done = ModelConfig()
    if config is not None:
        done.CopyFrom(config)
    _backend_fields(done, name)
    model_file(done)  # refuses a file name that leaves the version directory
    graph_inputs = [spec for spec in inputs if spec.name not in initialized]
    defaults = [spec for spec in inputs if spec.name in initialized]
    _auto_complete(done, graph_inputs, outputs, default_max_batch_size, defaults)
    _normalize(done)
    check_config(done)
    check_against_graph(done, inputs, outputs, initialized)
    if model_dir is not None:
        check_label_files(done, model_dir)
    return done


def _backend_fields(config: Any, name: str) -> None:
    """Name, platform, backend and model file name (AutoCompleteBackendFields). Only ONNX is
    served, so a config that names neither platform nor backend is taken to be ONNX."""
    if not config.name:
        config.name = name
    if config.name != name:
        raise InvalidInput(f"unexpected directory name '{shown(name)}' for model "
                           f"'{shown(config.name)}', directory name must equal model name")  # fmt: skip
    if config.platform not in ("", PLATFORM):
        raise InvalidInput(f"unsupported platform '{shown(config.platform)}' for model "
                           f"'{shown(name)}': only ONNX models are served (platform "
                           f"'{PLATFORM}', backend '{BACKEND}')")  # fmt: skip
    if config.backend not in ("", BACKEND):
        raise InvalidInput(f"unsupported backend '{shown(config.backend)}' for model "
                           f"'{shown(name)}': only ONNX models are served (platform "
                           f"'{PLATFORM}', backend '{BACKEND}')")  # fmt: skip
    config.platform, config.backend = PLATFORM, BACKEND
    if not config.default_model_filename:
        config.default_model_filename = DEFAULT_MODEL_FILE


def _auto_complete(config: Any, inputs: Sequence[TensorSpec], outputs: Sequence[TensorSpec],
                   default_max_batch_size: int, defaults: Sequence[TensorSpec] = ()) -> None:  # fmt: skip
    """The onnxruntime backend's auto-complete: only when the config lacks inputs or outputs.
    Graph inputs with an initializer (`defaults`) become optional inputs, as on v1, when the
    model does not batch (Triton refuses optional inputs on batching models: there they stay
    out of the configuration, and the initializer is always used)."""
    if len(config.input) and len(config.output):
        log.debug("skipping model configuration auto-complete for '%s': inputs and outputs "
                  "already specified", config.name)  # fmt: skip
        return
    _auto_max_batch(config, [*inputs, *outputs], default_max_batch_size)
    # Control and state inputs are the server's to fill; Triton would list them as client
    # inputs too and then refuse its own result (the input count), so they are left out.
    served = _server_inputs(config)
    if not len(config.input):
        _auto_io(config.input, [s for s in inputs if s.name not in served], config, "input")
        optional = [s for s in defaults if s.name not in served]
        if config.max_batch_size == 0 and optional:
            _auto_io(config.input, optional, config, "input")
            for io in config.input[len(config.input) - len(optional) :]:
                io.optional = True
    if not len(config.output):
        _auto_io(config.output, outputs, config, "output")


def _auto_max_batch(config: Any, tensors: Sequence[TensorSpec], default: int) -> None:
    """Batching is possible when every graph input and output has a dynamic first dim."""
    can_batch = all(graph_dims(spec)[:1] == (-1,) for spec in tensors)
    if not can_batch:
        if config.max_batch_size != 0:
            raise InvalidInput(f"autofill failed for model '{shown(config.name)}': model does "
                               "not support batching while non-zero max_batch_size is "
                               "specified")  # fmt: skip
        return
    if config.max_batch_size == 0 and default > 0:
        config.max_batch_size = default
        log.warning("autofilled max_batch_size to %d for model '%s' since batching is "
                    "supported but no max_batch_size is specified in model configuration. "
                    "Must specify max_batch_size to utilize autofill with a larger max batch "
                    "size", default, config.name)  # fmt: skip
    scheduled = config.WhichOneof("scheduling_choice") is not None
    if config.max_batch_size > 1 and not scheduled:
        config.dynamic_batching.SetInParent()


def _server_inputs(config: Any) -> set[str]:
    if not config.HasField("sequence_batching"):
        return set()
    batcher = config.sequence_batching
    return {c.name for c in batcher.control_input} | {s.input_name for s in batcher.state}


def _auto_io(target: Any, specs: Sequence[TensorSpec], config: Any, role: str) -> None:
    """One config entry per graph tensor: dims without the batch dim; a scalar gets dims [1]
    (and an empty reshape when batching)."""
    for spec in specs:
        data_type = config_type_of(spec.elem_type)
        if data_type == TYPE_INVALID:
            raise InvalidInput(f"unable to auto-complete model '{shown(config.name)}': graph "
                               f"{role} '{shown(spec.name)}' has element type "
                               f"{_elem_name(spec.elem_type)}, which a model configuration "
                               "cannot name (Triton's DataType has no TYPE_ for it)")  # fmt: skip
        entry = target.add(name=spec.name, data_type=data_type)
        dims = graph_dims(spec)[1 if config.max_batch_size > 0 else 0 :]
        entry.dims.extend(dims or [1])
        if not dims and config.max_batch_size > 0:
            entry.reshape.SetInParent()


def _elem_name(elem_type: int) -> str:
    try:
        return by_enum(elem_type).name
    except InvalidInput:  # 0: the graph leaves it unset
        return "undefined" if elem_type == 0 else str(elem_type)


def _normalize(config: Any) -> None:
    """NormalizeModelConfig and NormalizeInstanceGroup on a server without GPUs."""
    if not config.HasField("version_policy"):
        config.version_policy.latest.num_versions = 1
    batch = [config.max_batch_size] if config.max_batch_size > 0 else []
    dynamic = config.dynamic_batching
    if config.HasField("dynamic_batching") and not len(dynamic.preferred_batch_size):
        dynamic.preferred_batch_size.extend(batch)
    if config.HasField("sequence_batching"):
        batcher = config.sequence_batching
        if batcher.max_sequence_idle_microseconds == 0:
            batcher.max_sequence_idle_microseconds = SEQUENCE_IDLE_DEFAULT_MICROSECONDS
        if batcher.HasField("oldest") and not len(batcher.oldest.preferred_batch_size):
            batcher.oldest.preferred_batch_size.extend(batch)
    for pinned in ("input_pinned_memory", "output_pinned_memory"):
        if not config.optimization.HasField(pinned):
            getattr(config.optimization, pinned).enable = True
    if not len(config.instance_group):
        config.instance_group.add(name=config.name)
    for i, group in enumerate(config.instance_group):
        group.name = group.name or f"{config.name}_{i}"
        if group.kind == InstanceGroup.KIND_AUTO:
            group.kind = InstanceGroup.KIND_CPU
        if group.count < 1:
            cpu = group.kind == InstanceGroup.KIND_CPU
            group.count = CPU_INSTANCE_COUNT if cpu else 1
