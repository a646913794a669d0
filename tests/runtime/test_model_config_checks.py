"""Every disagreement complete_config refuses, with its exact text: Triton core's config checks,
the onnxruntime backend's checks against the graph, and what opserve does not serve."""

from typing import Any

import numpy as np
import pytest
from onnx import ModelProto, TensorProto, helper

from service.errors import InvalidInput
from service.runtime.config.complete import complete_config
from service.runtime.graph import TensorSpec

from .config_models import (
    DENSENET_PBTXT,
    SIMPLE_DYNA_SEQUENCE_PBTXT,
    SIMPLE_PBTXT,
    SIMPLE_SEQUENCE_PBTXT,
    densenet,
    loaded,
    pbtxt,
    simple,
    simple_sequence,
)
from .models import model, value

I32, F = TensorProto.INT32, TensorProto.FLOAT


def _edit(text: str, *changes: tuple[str, str]) -> str:
    for old, new in changes:
        assert old in text, old
        text = text.replace(old, new, 1)
    return text


def _identity(shape: list[Any], out_shape: list[Any] | None = None) -> ModelProto:
    """INPUT0 -> OUTPUT0 (and INPUT1 -> OUTPUT1), int32, of the given graph shapes."""
    nodes = [helper.make_node("Identity", [f"INPUT{i}"], [f"OUTPUT{i}"]) for i in (0, 1)]
    ins = [value(f"INPUT{i}", I32, shape) for i in (0, 1)]
    outs = [value(f"OUTPUT{i}", I32, out_shape or shape) for i in (0, 1)]
    return model(nodes, ins, outs)


def _sequence_with(start_shape: list[Any], start_type: int = I32) -> ModelProto:
    nodes = [helper.make_node("Identity", ["INPUT"], ["OUTPUT"])]
    ins = [value("INPUT", I32, [None, 1]), value("START", start_type, start_shape),
           value("READY", I32, [None, 1])]  # fmt: skip
    return model(nodes, ins, [value("OUTPUT", I32, [None, 1])])


SIMPLE_NOTE = ("an initial batch dimension because max_batch_size > 0 followed by the explicit "
               "tensor shape, making complete shape")  # fmt: skip
CASES: list[tuple[str, str, Any, str]] = [
    # (id, config text, graph, exact refusal)
    ("input datatype", _edit(SIMPLE_PBTXT, ("TYPE_INT32", "TYPE_FP32")), simple(),
     "unable to load model 'simple', configuration expects datatype TYPE_FP32 for input "
     "'INPUT0', model provides TYPE_INT32"),
    ("string graph", SIMPLE_PBTXT, simple(TensorProto.STRING),
     "unable to load model 'simple', configuration expects datatype TYPE_INT32 for input "
     "'INPUT0', model provides TYPE_BYTES"),
    ("output datatype", _edit(SIMPLE_PBTXT, ('"OUTPUT1" data_type: TYPE_INT32',
                                             '"OUTPUT1" data_type: TYPE_INT64')), simple(),
     "unable to load model 'simple', configuration expects datatype TYPE_INT64 for output "
     "'OUTPUT1', model provides TYPE_INT32"),
    ("input dims", _edit(SIMPLE_PBTXT, ("[ 16 ]", "[ 8 ]")), simple(),
     f"model 'simple', tensor 'INPUT0': the model expects 2 dimensions (shape [-1,16]) but the "
     f"model configuration specifies 2 dimensions ({SIMPLE_NOTE} [-1,8])"),
    ("input rank", _edit(SIMPLE_PBTXT, ("[ 16 ]", "[ 4, 4 ]")), simple(),
     f"model 'simple', tensor 'INPUT0': the model expects 2 dimensions (shape [-1,16]) but the "
     f"model configuration specifies 3 dimensions ({SIMPLE_NOTE} [-1,4,4])"),
    ("a config -1 is no wildcard", _edit(SIMPLE_PBTXT, ("[ 16 ]", "[ -1 ]")), simple(),
     f"model 'simple', tensor 'INPUT0': the model expects 2 dimensions (shape [-1,16]) but the "
     f"model configuration specifies 2 dimensions ({SIMPLE_NOTE} [-1,-1])"),
    ("outputs compare exactly", SIMPLE_PBTXT, _identity([None, None]),
     f"model 'simple', tensor 'OUTPUT0': the model expects 2 dimensions (shape [-1,-1]) but "
     f"the model configuration specifies 2 dimensions ({SIMPLE_NOTE} [-1,16])"),
    ("no batching dims", _edit(SIMPLE_PBTXT, ("max_batch_size: 8", "")), simple(),
     "model 'simple', tensor 'INPUT0': the model expects 2 dimensions (shape [-1,16]) but the "
     "model configuration specifies 1 dimensions (shape [16])"),
    ("batching support", SIMPLE_PBTXT, _identity([2, 16]),
     "model 'simple', tensor 'INPUT0': for the model to support batching the shape should have "
     "at least 1 dimension and the first dimension must be -1; but shape expected by the model "
     "is [2,16]"),
    ("reshape count", _edit(DENSENET_PBTXT, ("[ 1, 3, 4, 4 ]", "[ 1, 3, 4, 5 ]")), densenet(),
     "model input 'data_0' has different size for dims and reshape for densenet_onnx"),
    ("reshape wildcards", _edit(DENSENET_PBTXT, ("[ 3, 4, 4 ]", "[ 3, -1, 4 ]")), densenet(),
     "model input 'data_0' has different size for dims and reshape for densenet_onnx"),
    ("reshape used for dims", _edit(DENSENET_PBTXT, ("[ 1, 3, 4, 4 ]", "[ 3, 4, 4 ]"),
                                    ("[ 3, 4, 4 ]", "[ 3, 4, 4 ]")), densenet(),
     "model 'densenet_onnx', tensor 'data_0': the model expects 4 dimensions (shape [1,3,4,4]) "
     "but the model configuration specifies 3 dimensions (shape [3,4,4])"),
    ("element count", 'name: "m" input [ { name: "x" data_type: TYPE_FP32 dims: [ 4294967296, '
                      '4294967296 ] reshape { shape: [ 1 ] } } ]', [TensorSpec("x", F, (1,))],
     "element count for tensor 'x dims' exceeds maximum size of 9223372036854775807 for m"),
    ("a data_type the enum does not name", _edit(SIMPLE_PBTXT, ("TYPE_INT32", "99")), simple(),
     "unable to load model 'simple', configuration expects datatype 99 for input 'INPUT0', "
     "model provides TYPE_INT32"),
    ("NCHW needs 3 dims", _edit(DENSENET_PBTXT, ("dims: [ 3, 4, 4 ]", "dims: [ 48 ]")),
     densenet(), "model input NHWC/NCHW require 3 dims for densenet_onnx"),
    ("input count", _edit(SIMPLE_PBTXT, (',\n        { name: "INPUT1" data_type: TYPE_INT32 '
                                         'dims: [ 16 ] }', "")), simple(),
     "unable to load model 'simple', configuration expects 1 inputs, model provides 2"),
    ("control not in the graph", _edit(SIMPLE_SEQUENCE_PBTXT, ('"READY"', '"GO"')),
     simple_sequence(),
     "configuration specified sequence control 'GO', but model does not provide that input"),
    ("count with a control left out", _edit(SIMPLE_SEQUENCE_PBTXT, (
        ',\n  { name: "READY" control [ { kind: CONTROL_SEQUENCE_READY int32_false_true: [ 0, 1 '
        '] } ] }', "")), simple_sequence(),
     "unable to load model 'simple_sequence', configuration expects 2 inputs, model provides 3"),
    ("state counts", _edit(SIMPLE_SEQUENCE_PBTXT, ("] }\n", '] state [ { input_name: "S" '
                                                   'output_name: "T" data_type: TYPE_INT32 '
                                                   'dims: [ 1 ] } ] }\n')),
     simple_sequence(),
     "unable to load model 'simple_sequence', configuration expects 4 inputs, model provides 3"),
    ("unexpected input", _edit(SIMPLE_PBTXT, ('"INPUT1"', '"INPUTX"')), simple(),
     "unexpected inference input 'INPUTX', allowed inputs are: INPUT0, INPUT1"),
    ("unexpected output", _edit(SIMPLE_PBTXT, ('"OUTPUT1"', '"SUM"')), simple(),
     "unexpected inference output 'SUM', allowed outputs are: OUTPUT0, OUTPUT1"),
    ("control dims", SIMPLE_SEQUENCE_PBTXT, _sequence_with([None, 2]),
     "unable to load model 'simple_sequence', sequence control 'START' in model has dims [2] "
     "but dims [1] is expected"),
    ("control rank", SIMPLE_SEQUENCE_PBTXT, _sequence_with([None]),
     "unable to load model 'simple_sequence', sequence control 'START' in model has dims [] "
     "but dims [1] is expected"),
    ("control datatype", _edit(SIMPLE_SEQUENCE_PBTXT, ("int32_false_true", "fp32_false_true")),
     simple_sequence(),
     "unable to load model 'simple_sequence', sequence control 'START', the model expects "
     "data-type INT32 but the model configuration specifies data-type TYPE_FP32"),
    ("bool control", _edit(SIMPLE_SEQUENCE_PBTXT, ("int32_false_true: [ 0, 1 ]",
                                                   "bool_false_true: [ false, true ]")),
     _sequence_with([None, 1], TensorProto.FLOAT),
     "unable to load model 'simple_sequence', sequence control 'START', the model expects "
     "data-type FLOAT but the model configuration specifies data-type TYPE_BOOL"),
    ("corrid datatype", _edit(SIMPLE_DYNA_SEQUENCE_PBTXT, ("TYPE_UINT64", "TYPE_UINT32")),
     simple_sequence(dyna=True),
     "unable to load model 'simple_dyna_sequence', sequence control 'CORRID', the model expects "
     "data-type UINT64 but the model configuration specifies data-type TYPE_UINT32"),
    ("corrid type allowed", _edit(SIMPLE_DYNA_SEQUENCE_PBTXT, ("TYPE_UINT64", "TYPE_FP32")),
     simple_sequence(dyna=True),
     "unexpected data type for control CONTROL_SEQUENCE_CORRID for simple_dyna_sequence. "
     "Allowed data types are TYPE_UINT64, TYPE_INT64, TYPE_UINT32, TYPE_INT32 and TYPE_STRING"),
    ("corrid values", _edit(SIMPLE_DYNA_SEQUENCE_PBTXT, ("data_type: TYPE_UINT64",
                                                         "int32_false_true: [ 0, 1 ]")),
     simple_sequence(dyna=True),
     "sequence batching must not specify either 'int32_false_true', 'fp32_false_true' or "
     "'bool_false_true' for CONTROL_SEQUENCE_CORRID for simple_dyna_sequence"),
    ("control values missing", _edit(SIMPLE_SEQUENCE_PBTXT, (" int32_false_true: [ 0, 1 ]", "")),
     simple_sequence(),
     "sequence batching must specify either 'int32_false_true', 'fp32_false_true' or "
     "'bool_false_true' for CONTROL_SEQUENCE_START for simple_sequence"),
    ("control values twice", _edit(SIMPLE_SEQUENCE_PBTXT, ("int32_false_true: [ 0, 1 ]",
                                   "int32_false_true: [ 0, 1 ] fp32_false_true: [ 0, 1 ]")),
     simple_sequence(),
     "sequence batching specifies more than one from 'int32_false_true', 'fp32_false_true' and "
     "'bool_false_true' for CONTROL_SEQUENCE_START for simple_sequence"),
    ("control values count", _edit(SIMPLE_SEQUENCE_PBTXT, ("[ 0, 1 ]", "[ 0, 1, 2 ]")),
     simple_sequence(),
     "sequence batching control 'int32_false_true' must have exactly 2 entries for "
     "CONTROL_SEQUENCE_START for simple_sequence"),
    ("control kind twice", _edit(SIMPLE_SEQUENCE_PBTXT, ("CONTROL_SEQUENCE_READY",
                                                         "CONTROL_SEQUENCE_START")),
     simple_sequence(),
     "sequence batching specifies multiple CONTROL_SEQUENCE_START tensors for simple_sequence"),
    ("control tensor twice", _edit(SIMPLE_SEQUENCE_PBTXT, ('"READY"', '"START"')),
     simple_sequence(),
     "sequence batching control tensor 'START' is specified for multiple control kinds for "
     "simple_sequence"),
    ("state input", _edit(SIMPLE_SEQUENCE_PBTXT, ('"READY"', '"GO"'), ("] }\n", '] state [ { '
                          'input_name: "READY" output_name: "T" data_type: TYPE_INT32 dims: [ 1 '
                          '] } ] }\n')), _sequence_with([None, 1]),
     "configuration specified sequence control 'GO', but model does not provide that input"),
    ("state output", _edit(SIMPLE_SEQUENCE_PBTXT, (
        ',\n  { name: "READY" control [ { kind: CONTROL_SEQUENCE_READY int32_false_true: [ 0, 1 '
        '] } ] }', ""), ("] }\n", '] state [ { input_name: "READY" output_name: "T" data_type: '
                         'TYPE_INT32 dims: [ 1 ] } ] }\n')), _sequence_with([None, 1]),
     "unable to load model 'simple_sequence', sequence state output 'T' is not an output of "
     "the model"),
    ("optional, no initializer", _edit(SIMPLE_PBTXT, ("dims: [ 16 ] }", "dims: [ 16 ] optional: "
                                                    "true }")), simple(),
     "unable to load model 'simple', configuration expects 1 inputs, model provides 2"),
    ("scalar", 'name: "m" input [ { name: "x" data_type: TYPE_FP32 dims: [ 2 ] } ] '
               'output [ { name: "y" data_type: TYPE_FP32 dims: [ 1 ] } ]',
     [TensorSpec("x", F, ()), TensorSpec("y", F, ())],
     "unable to load model 'm', scalar tensor 'x', should only provide 1 in the model "
     "configuration when the model doesn't support batching. Model configuration provided: "
     "[2]."),
    ("negative max_batch_size", "max_batch_size: -1", simple(),
     "'max_batch_size' must be non-negative value for simple"),
    ("zero dim", _edit(SIMPLE_PBTXT, ("[ 16 ]", "[ 0 ]")), simple(),
     "model input 'INPUT0' dimension must be integer >= 1, or -1 to indicate a variable-size "
     "dimension for simple"),
    ("no data_type", _edit(SIMPLE_PBTXT, ('"OUTPUT0" data_type: TYPE_INT32', '"OUTPUT0"')),
     simple(), "model output 'OUTPUT0' must specify 'data_type' for simple"),
    ("no dims", _edit(SIMPLE_PBTXT, ("dims: [ 16 ]", "")), simple(),
     "model input 'INPUT0' must specify 'dims' for simple"),
    ("no name", _edit(SIMPLE_PBTXT, ('name: "INPUT0"', "")), simple(),
     "model input must specify 'name' for simple"),
    ("empty reshape", _edit(DENSENET_PBTXT, ("[ 1, 3, 4, 4 ]", "[ ]")), densenet(),
     "model input 'data_0' cannot have empty reshape for non-batching model as scalar tensors "
     "are not supported for densenet_onnx"),
    ("reshape zero", _edit(DENSENET_PBTXT, ("[ 1, 3, 4, 4 ]", "[ 0, 3, 4, 4 ]")), densenet(),
     "model input 'data_0' reshape dimensions must be integer >= 1, or -1 to indicate a "
     "variable-size dimension for densenet_onnx"),
    ("shape tensor", _edit(SIMPLE_PBTXT, ("dims: [ 16 ] }", "dims: [ 16 ] is_shape_tensor: "
                                          "true }")), simple(),
     "shape tensors are only supported for TensorRT platform for simple"),
    ("non-linear format", _edit(SIMPLE_PBTXT, ("dims: [ 16 ] }", "dims: [ 16 ] "
                                               "is_non_linear_format_io: true }")), simple(),
     "Non-linear IO format is only supported for the TensorRT platform for simple"),
    ("preferred batch size", SIMPLE_PBTXT + "dynamic_batching { preferred_batch_size: 16 }",
     simple(), "dynamic batching preferred size must be <= max batch size for simple"),
    ("default priority level", SIMPLE_PBTXT + "dynamic_batching { priority_levels: 2 }",
     simple(), "default priority level must be in range [1, 2] for simple"),
    ("queue policy level", SIMPLE_PBTXT + "dynamic_batching { priority_levels: 2 "
     "default_priority_level: 1 priority_queue_policy { key: 3 value { max_queue_size: 1 } } }",
     simple(), "priority queue policy must have priority level in range [1, 2] for simple"),
    ("ordering with levels", SIMPLE_PBTXT + "dynamic_batching { priority_levels: 2 "
     "default_priority_level: 1 preserve_ordering: true }", simple(),
     "Only one priority level is allowed when 'preserve_ordering' is true for simple"),
    ("ordering with delay", SIMPLE_PBTXT + "dynamic_batching { preserve_ordering: true "
     "default_queue_policy { timeout_action: DELAY default_timeout_microseconds: 5 } }",
     simple(), "Queue policy can not have DELAY as timeout action when 'preserve_ordering' is "
     "true for simple"),
    ("oldest batch size", _edit(SIMPLE_DYNA_SEQUENCE_PBTXT, ("max_candidate_sequences: 1024",
                                "preferred_batch_size: 0")), simple_sequence(dyna=True),
     "sequence batching preferred batch size must be positive for simple_dyna_sequence"),
    ("model file name", SIMPLE_PBTXT + 'default_model_filename: "../other/model.onnx"', simple(),
     "default_model_filename '../other/model.onnx' for model 'simple' must be a relative path "
     "inside the version directory (not absolute, no '..' part, no NUL)"),
    ("directory name", _edit(SIMPLE_PBTXT, ('"simple"', '"other"')), simple(),
     "unexpected directory name 'simple' for model 'other', directory name must equal model "
     "name"),
    ("platform", _edit(SIMPLE_PBTXT, ("onnxruntime_onnx", "tensorflow_savedmodel")), simple(),
     "unsupported platform 'tensorflow_savedmodel' for model 'simple': only ONNX models are "
     "served (platform 'onnxruntime_onnx', backend 'onnxruntime')"),
    ("backend", SIMPLE_PBTXT + 'backend: "python"', simple(),
     "unsupported backend 'python' for model 'simple': only ONNX models are served (platform "
     "'onnxruntime_onnx', backend 'onnxruntime')"),
    ("ensemble", 'platform: "ensemble"', simple(),
     "unsupported platform 'ensemble' for model 'simple': only ONNX models are served (platform "
     "'onnxruntime_onnx', backend 'onnxruntime')"),
    ("ensemble scheduling", SIMPLE_PBTXT + "ensemble_scheduling { step [ { model_name: \"a\" } "
                                           "] }", simple(),
     "ensemble scheduling cannot be set for model 'simple' whose platform is not ensemble"),
    ("decoupled", SIMPLE_PBTXT + "model_transaction_policy { decoupled: true }", simple(),
     "model 'simple' has a decoupled transaction policy; opserve serves no decoupled models"),
    ("batch input", SIMPLE_PBTXT + 'batch_input [ { kind: BATCH_ELEMENT_COUNT target_name: '
                                   '"N" data_type: TYPE_INT32 } ]', simple(),
     "model 'simple' specifies batch_input, which opserve does not support (it batches no "
     "requests together)"),
    ("GPU instances", SIMPLE_PBTXT + "instance_group [ { kind: KIND_GPU } ]", simple(),
     "instance group simple_0 of model simple has kind KIND_GPU but server does not support "
     "GPUs"),
    ("response cache", SIMPLE_SEQUENCE_PBTXT + "response_cache { enable: true }",
     simple_sequence(),
     "Response Cache does not currently support model simple_sequence with sequence batching "
     "scheduler. Please disable the response cache."),
]  # fmt: skip


@pytest.mark.parametrize(("text", "graph", "message"), [c[1:] for c in CASES],
                         ids=[c[0] for c in CASES])  # fmt: skip
def test_a_disagreement_is_refused_with_its_text(text: str, graph: Any, message: str) -> None:
    directory = pbtxt(text).name or "simple"
    directory = "simple" if directory == "other" else directory
    if isinstance(graph, ModelProto):
        loaded_graph = loaded(graph)
        inputs, outputs = loaded_graph.inputs, loaded_graph.outputs
    else:
        inputs, outputs = graph[:1], graph[1:]
    with pytest.raises(InvalidInput) as caught:
        complete_config(pbtxt(text), directory, inputs, outputs)
    assert str(caught.value) == message


@pytest.mark.parametrize(
    ("dims", "reshape"),
    [("[ 2, 4, -1, 6 ]", "[ 8, -1, 1, 6 ]"), ("[ -1 ]", "[ -1, 1 ]"), ("[ 1 ]", "[ ]")],
)
def test_reshapes_triton_accepts(dims: str, reshape: str) -> None:
    rank = reshape.count(",") + (0 if reshape == "[ ]" else 1)
    graph_shape = tuple([None] * (rank + 1))
    text = (f'max_batch_size: 2 input [ {{ name: "x" data_type: TYPE_FP32 dims: {dims} reshape '
            f'{{ shape: {reshape} }} }} ] output [ {{ name: "y" data_type: TYPE_FP32 dims: [ -1 ] '
            "} ]")  # fmt: skip
    specs = [TensorSpec("x", F, graph_shape)], [TensorSpec("y", F, (None, None))]
    complete_config(pbtxt(text), "m", *specs)


def test_an_optional_input_backed_by_an_initializer() -> None:
    """onnxruntime counts only inputs without initializers; an optional config input may name
    one (and only without batching)."""
    graph = model([helper.make_node("Add", ["x", "bias"], ["y"])],
                  [value("x", F, [2]), value("bias", F, [2])], [value("y", F, [2])],
                  {"bias": np.ones(2, np.float32)})  # fmt: skip
    specs = loaded(graph)
    text = ('input [ { name: "x" data_type: TYPE_FP32 dims: [ 2 ] }, { name: "bias" data_type: '
            'TYPE_FP32 dims: [ 2 ] optional: true } ] output [ { name: "y" data_type: TYPE_FP32 '
            "dims: [ 2 ] } ]")  # fmt: skip
    done = complete_config(pbtxt(text), "m", specs.inputs, specs.outputs,
                           initialized=specs.initializers.keys())  # fmt: skip
    assert [io.optional for io in done.input] == [False, True]
    auto = complete_config(None, "m", specs.inputs, specs.outputs,
                           initialized=specs.initializers.keys())  # fmt: skip
    # an initializer-backed input is an optional client input, as on v1 (issue 16)
    assert [(io.name, io.optional) for io in auto.input] == [("x", False), ("bias", True)]
    with pytest.raises(InvalidInput, match="configuration expects 2 inputs, model provides 1"):
        complete_config(pbtxt(text.replace(" optional: true", "")), "m", specs.inputs,
                        specs.outputs, initialized=specs.initializers.keys())  # fmt: skip


def test_an_optional_input_in_a_batching_model() -> None:
    specs = [TensorSpec("x", F, (None, 2)), TensorSpec("b", F, (None, 2))]
    text = ('max_batch_size: 2 input [ { name: "x" data_type: TYPE_FP32 dims: [ 2 ] }, { name: '
            '"b" data_type: TYPE_FP32 dims: [ 2 ] optional: true } ] output [ { name: "y" '
            "data_type: TYPE_FP32 dims: [ 2 ] } ]")  # fmt: skip
    with pytest.raises(InvalidInput) as caught:
        complete_config(pbtxt(text), "m", specs, [TensorSpec("y", F, (None, 2))],
                        initialized={"b"})  # fmt: skip
    assert str(caught.value) == (
        "unable to load model 'm', optional input 'b' is not supported for models that support "
        "batching"
    )


def test_implicit_state_fits() -> None:
    """The accumulator of simple_string_dyna_sequence: ACC_IN and ACC_OUT are the state."""
    ins = [TensorSpec(n, I32, (None, 1)) for n in ("INPUT", "START", "READY", "ACC_IN")]
    outs = [TensorSpec(n, I32, (None, 1)) for n in ("OUTPUT", "ACC_OUT")]
    text = _edit(
        SIMPLE_SEQUENCE_PBTXT,
        (
            "] }\n",
            '] state [ { input_name: "ACC_IN" output_name: '
            '"ACC_OUT" data_type: TYPE_INT32 dims: [ 1 ] } ] }\n',
        ),
    )
    done = complete_config(pbtxt(text), "simple_sequence", ins, outs)
    assert [io.name for io in done.input] == ["INPUT"]
    with pytest.raises(InvalidInput) as caught:
        complete_config(pbtxt(text.replace("state [ { input_name: \"ACC_IN\" output_name: "
                                           '"ACC_OUT" data_type: TYPE_INT32',
                                           'state [ { input_name: "ACC_IN" output_name: '
                                           '"ACC_OUT" data_type: TYPE_INT64')),
                        "simple_sequence", ins, outs)  # fmt: skip
    assert str(caught.value) == (
        "unable to load model 'simple_sequence', sequence state input 'ACC_IN', the model "
        "expects data-type INT32 but the model configuration specifies data-type TYPE_INT64"
    )


def test_long_names_are_cut_in_texts() -> None:
    name = "N" * 500
    with pytest.raises(InvalidInput) as caught:
        complete_config(pbtxt(f'name: "{name}"'), "simple", [], [])
    assert str(caught.value) == (
        f"unexpected directory name 'simple' for model '{'N' * 100}...', directory name must "
        "equal model name"
    )
