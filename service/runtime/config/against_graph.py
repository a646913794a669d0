"""A completed model configuration against its ONNX graph: what the onnxruntime backend checks
when it creates an instance (ValidateBooleanSequenceControl, ValidateTypedSequenceControl,
ValidateInputs, ValidateOutputs, CompareDimsSupported), with its texts, plus implicit state.

Graph shapes are taken as onnxruntime reports them: -1 for a dynamic dim, and no dims for a
tensor of unknown rank (onnxruntime's view, which Triton's checks see as a scalar).
"""

from collections.abc import Collection, Sequence
from typing import Any

from onnx import TensorProto

from service.errors import InvalidInput, listed
from service.runtime.config.messages import (
    config_type_named,
    config_type_of,
    dims_text,
    protocol_name,
    shown,
    type_name,
)
from service.runtime.graph import TensorSpec
from service.runtime.sequence_plan import sequence_plan


def graph_dims(spec: TensorSpec) -> tuple[int, ...]:
    """A graph tensor's dims as onnxruntime gives them: -1 per dynamic dim."""
    return tuple(-1 if d is None else d for d in spec.shape or ())


def check_against_graph(config: Any, inputs: Sequence[TensorSpec],
                        outputs: Sequence[TensorSpec], initialized: Collection[str]) -> None:  # fmt: skip
    """Refuse a config the graph does not fit. `inputs` are every graph input; those named in
    `initialized` have an initializer (they are not counted, and may be optional)."""
    model = shown(config.name)
    graph_in = {spec.name: spec for spec in inputs if spec.name not in initialized}
    batcher = config.sequence_batching
    controls = sequence_plan(batcher, config.name, config.max_batch_size).controls if (
        config.HasField("sequence_batching")) else ()  # fmt: skip
    for control in controls:
        _check_control(control.name, config_type_named(control.datatype), graph_in, config)
    required = sum(not io.optional for io in config.input)
    expected = required + len(controls) + len(batcher.state)
    if len(graph_in) != expected:
        raise InvalidInput(f"unable to load model '{model}', configuration expects {expected} "
                           f"inputs, model provides {len(graph_in)}")  # fmt: skip
    every_input = {spec.name: spec for spec in inputs}
    for io in config.input:
        if io.optional and config.max_batch_size != 0:
            raise InvalidInput(f"unable to load model '{model}', optional input "
                               f"'{shown(io.name)}' is not supported for models that support "
                               "batching")  # fmt: skip
        _check_io(io, every_input, config, "input", exact=False)
    every_output = {spec.name: spec for spec in outputs}
    for io in config.output:
        _check_io(io, every_output, config, "output", exact=True)
    for state in batcher.state:
        _check_state(state, every_input, every_output, config)


def _check_control(name: str, data_type: int, graph_in: dict[str, TensorSpec],
                   config: Any) -> None:  # fmt: skip
    spec = graph_in.get(name)
    if spec is None:
        raise InvalidInput(f"configuration specified sequence control '{shown(name)}', but "
                           "model does not provide that input")  # fmt: skip
    model = shown(config.name)
    debatched = graph_dims(spec)[1 if config.max_batch_size > 0 else 0 :]
    if debatched != (1,):
        raise InvalidInput(f"unable to load model '{model}', sequence control '{shown(name)}' "
                           f"in model has dims {dims_text(debatched)} but dims [1] is "
                           "expected")  # fmt: skip
    if config_type_of(spec.elem_type) != data_type:
        raise InvalidInput(f"unable to load model '{model}', sequence control '{shown(name)}', "
                           f"the model expects data-type {_onnx_name(spec.elem_type)} but the "
                           f"model configuration specifies data-type {type_name(data_type)}")  # fmt: skip


def _check_io(io: Any, graph: dict[str, TensorSpec], config: Any, role: str,
              exact: bool) -> None:  # fmt: skip
    spec = graph.get(io.name)
    if spec is None:
        allowed = listed([shown(name) for name in sorted(graph)])
        raise InvalidInput(f"unexpected inference {role} '{shown(io.name)}', allowed {role}s "
                           f"are: {allowed}")  # fmt: skip
    model = shown(config.name)
    if config_type_of(spec.elem_type) != io.data_type:
        provided = "TYPE_" + protocol_name(config_type_of(spec.elem_type))
        raise InvalidInput(f"unable to load model '{model}', configuration expects datatype "
                           f"{type_name(io.data_type)} for {role} '{shown(io.name)}', model "
                           f"provides {provided}")  # fmt: skip
    dims = tuple(io.reshape.shape if io.HasField("reshape") else io.dims)
    model_dims = graph_dims(spec)
    if model_dims:
        compare_dims(model, io.name, model_dims, dims, config.max_batch_size, exact)
    elif any(d != 1 for d in dims):
        raise InvalidInput(f"unable to load model '{model}', scalar tensor '{shown(io.name)}', "
                           "should only provide 1 in the model configuration when the model "
                           f"doesn't support batching. Model configuration provided: "
                           f"{dims_text(dims)}.")  # fmt: skip


def compare_dims(model: str, name: str, model_dims: tuple[int, ...], dims: tuple[int, ...],
                 max_batch_size: int, exact: bool) -> None:  # fmt: skip
    """onnxruntime's CompareDimsSupported: -1 in the model matches any config dim unless
    `exact` (outputs); with batching, the model's first dim must be -1."""
    where = f"model '{model}', tensor '{shown(name)}'"
    if max_batch_size > 0:
        if model_dims[:1] != (-1,):
            raise InvalidInput(f"{where}: for the model to support batching the shape should "
                               "have at least 1 dimension and the first dimension must be -1; "
                               f"but shape expected by the model is {dims_text(model_dims)}")  # fmt: skip
        full = (-1, *dims)
        if not _fits(model_dims, full, exact):
            raise InvalidInput(f"{where}: the model expects {len(model_dims)} dimensions (shape "
                               f"{dims_text(model_dims)}) but the model configuration specifies "
                               f"{len(full)} dimensions (an initial batch dimension because "
                               "max_batch_size > 0 followed by the explicit tensor shape, "
                               f"making complete shape {dims_text(full)})")  # fmt: skip
    elif not _fits(model_dims, dims, exact):
        raise InvalidInput(f"{where}: the model expects {len(model_dims)} dimensions (shape "
                           f"{dims_text(model_dims)}) but the model configuration specifies "
                           f"{len(dims)} dimensions (shape {dims_text(dims)})")  # fmt: skip


def _fits(model_dims: tuple[int, ...], dims: tuple[int, ...], exact: bool) -> bool:
    return len(model_dims) == len(dims) and all(
        m == d or (m == -1 and not exact) for m, d in zip(model_dims, dims, strict=True)
    )


def _check_state(state: Any, graph_in: dict[str, TensorSpec], graph_out: dict[str, TensorSpec],
                 config: Any) -> None:  # fmt: skip
    """Implicit state: the model reads `input_name` and writes `output_name`, both of the
    state's type and dims (the onnxruntime backend's own state check never runs)."""
    model = shown(config.name)
    for role, name, graph in (("input", state.input_name, graph_in),
                              ("output", state.output_name, graph_out)):  # fmt: skip
        spec = graph.get(name)
        if spec is None:
            raise InvalidInput(f"unable to load model '{model}', sequence state {role} "
                               f"'{shown(name)}' is not an {role} of the model")  # fmt: skip
        if config_type_of(spec.elem_type) != state.data_type:
            raise InvalidInput(f"unable to load model '{model}', sequence state {role} "
                               f"'{shown(name)}', the model expects data-type "
                               f"{_onnx_name(spec.elem_type)} but the model configuration "
                               f"specifies data-type {type_name(state.data_type)}")  # fmt: skip
        compare_dims(model, name, graph_dims(spec), tuple(state.dims), config.max_batch_size,
                     exact=False)  # fmt: skip


def _onnx_name(elem_type: int) -> str:
    """onnxruntime's OnnxDataTypeName: FLOAT, INT32, STRING."""
    try:
        return str(TensorProto.DataType.Name(elem_type))
    except ValueError:
        return "UNDEFINED"
