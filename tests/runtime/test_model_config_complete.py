"""What complete_config fills in, with and without config.pbtxt, as Triton's core and the
onnxruntime backend auto-complete (notes/triton-http.md §2.3, §1.4)."""

import logging
from pathlib import Path
from typing import Any

import pytest
from onnx import TensorProto

from service.errors import InvalidInput
from service.runtime.config.complete import complete_config
from service.runtime.config.json_form import config_json
from service.runtime.config.messages import ModelConfig
from service.runtime.graph import TensorSpec

from .config_models import (
    DENSENET_PBTXT,
    SIMPLE_PBTXT,
    SIMPLE_SEQUENCE_PBTXT,
    densenet,
    loaded,
    pbtxt,
    simple,
    simple_sequence,
    simple_string,
)

F, I32, BF16 = TensorProto.FLOAT, TensorProto.INT32, TensorProto.BFLOAT16


def _complete(config: Any, proto: Any, name: str) -> dict[str, Any]:
    graph = loaded(proto)
    done = complete_config(config, name, graph.inputs, graph.outputs,
                           initialized=graph.initializers.keys())  # fmt: skip
    return config_json(done)


def _io(rendered: dict[str, Any], role: str) -> list[tuple[str, str, list[int], Any]]:
    return [(io["name"], io["data_type"], io["dims"], io.get("reshape"))
            for io in rendered[role]]  # fmt: skip


def test_simple_without_a_config(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, "opserve"):
        rendered = _complete(None, simple(), "simple")
    assert caplog.messages == [
        "autofilled max_batch_size to 4 for model 'simple' since batching is supported but no "
        "max_batch_size is specified in model configuration. Must specify max_batch_size to "
        "utilize autofill with a larger max batch size"
    ]
    assert rendered["max_batch_size"] == 4
    assert rendered["dynamic_batching"]["preferred_batch_size"] == [4]
    assert _io(rendered, "input") == [("INPUT0", "TYPE_INT32", [16], None),
                                      ("INPUT1", "TYPE_INT32", [16], None)]  # fmt: skip
    assert _io(rendered, "output") == [("OUTPUT0", "TYPE_INT32", [16], None),
                                       ("OUTPUT1", "TYPE_INT32", [16], None)]  # fmt: skip
    assert (rendered["name"], rendered["platform"], rendered["backend"]) == (
        "simple", "onnxruntime_onnx", "onnxruntime")  # fmt: skip
    assert rendered["instance_group"][0]["name"] == "simple"


def test_strings_and_bf16_get_their_type_names() -> None:
    rendered = _complete(None, simple_string(), "simple_string")
    assert {io["data_type"] for io in rendered["input"] + rendered["output"]} == {"TYPE_STRING"}
    rendered = _complete(None, simple(BF16), "b")
    assert {io["data_type"] for io in rendered["input"] + rendered["output"]} == {"TYPE_BF16"}


def test_a_graph_that_cannot_batch() -> None:
    rendered = _complete(None, densenet(), "densenet_onnx")
    assert rendered["max_batch_size"] == 0 and "dynamic_batching" not in rendered
    assert _io(rendered, "input") == [("data_0", "TYPE_FP32", [1, 3, 4, 4], None)]
    assert _io(rendered, "output") == [("fc6_1", "TYPE_FP32", [1, 10, 1, 1], None)]
    with pytest.raises(InvalidInput) as caught:
        _complete(pbtxt("max_batch_size: 2"), densenet(), "densenet_onnx")
    assert str(caught.value) == (
        "autofill failed for model 'densenet_onnx': model does not support batching while "
        "non-zero max_batch_size is specified"
    )


def _specs(*shapes: tuple[int | None, ...] | None) -> list[TensorSpec]:
    return [TensorSpec(f"t{i}", F, shape) for i, shape in enumerate(shapes)]


@pytest.mark.parametrize(
    ("shape", "max_batch_size", "dims", "reshape"),
    [
        ((None,), 4, [1], {"shape": []}),  # batching away the only dim leaves a scalar
        ((), 0, [1], None),  # a scalar: no batching, dims [1]
        (None, 0, [1], None),  # unknown rank: onnxruntime reports no dims
        ((None, None, 3), 4, [-1, 3], None),
        ((2, None), 0, [2, -1], None),
    ],
)  # fmt: skip
def test_dims_from_the_graph(shape: Any, max_batch_size: int, dims: list[int],
                             reshape: Any) -> None:  # fmt: skip
    inputs, outputs = _specs(shape), [TensorSpec("out", F, shape)]
    rendered = config_json(complete_config(None, "m", inputs, outputs))
    assert rendered["max_batch_size"] == max_batch_size
    for io in rendered["input"] + rendered["output"]:
        assert (io["dims"], io.get("reshape")) == (dims, reshape)


@pytest.mark.parametrize(
    ("text", "scheduler"),
    [("max_batch_size: 1", None),  # dynamic batching only past a batch of 1
     ("max_batch_size: 8", {"preferred_batch_size": [8]}),
     ("max_batch_size: 8 dynamic_batching { preferred_batch_size: [ 2, 4 ] }",
      {"preferred_batch_size": [2, 4]})],
)  # fmt: skip
def test_dynamic_batching(text: str, scheduler: Any) -> None:
    rendered = _complete(pbtxt(text), simple(), "simple")
    found = rendered.get("dynamic_batching")
    assert (found and {"preferred_batch_size": found["preferred_batch_size"]}) == scheduler


def test_sequence_models_leave_controls_to_the_server() -> None:
    """With only the scheduler configured, control inputs are not listed as client inputs
    (Triton would list them and then refuse its own count)."""
    config = pbtxt(SIMPLE_SEQUENCE_PBTXT)
    del config.input[:]
    del config.output[:]
    rendered = _complete(config, simple_sequence(), "simple_sequence")
    assert _io(rendered, "input") == [("INPUT", "TYPE_INT32", [1], None)]
    assert _io(rendered, "output") == [("OUTPUT", "TYPE_INT32", [1], None)]
    assert rendered["sequence_batching"]["max_sequence_idle_microseconds"] == 1000000
    assert "dynamic_batching" not in rendered


def test_a_config_with_inputs_and_outputs_is_not_auto_completed() -> None:
    text = SIMPLE_PBTXT.replace("max_batch_size: 8", "").replace("[ 16 ]", "[ -1, 16 ]")
    rendered = _complete(pbtxt(text), simple(), "simple")
    assert rendered["max_batch_size"] == 0  # no autofill: the batch dim is in dims
    assert "dynamic_batching" not in rendered
    assert [io["dims"] for io in rendered["input"]] == [[-1, 16], [-1, 16]]


def test_only_outputs_are_completed_when_inputs_are_given() -> None:
    config = pbtxt(SIMPLE_PBTXT)
    del config.output[:]
    rendered = _complete(config, simple(), "simple")
    assert [io["name"] for io in rendered["output"]] == ["OUTPUT0", "OUTPUT1"]


@pytest.mark.parametrize(
    ("groups", "expected"),
    [
        ("", [("m", "KIND_CPU", 2)]),
        ("instance_group [ { kind: KIND_CPU } ]", [("m_0", "KIND_CPU", 2)]),
        ("instance_group [ { name: \"a\" count: 3 }, { kind: KIND_MODEL } ]",
         [("a", "KIND_CPU", 3), ("m_1", "KIND_MODEL", 1)]),
    ],
)  # fmt: skip
def test_instance_groups(groups: str, expected: list[tuple[str, str, int]]) -> None:
    rendered = config_json(complete_config(pbtxt(groups), "m", [], []))
    assert [(g["name"], g["kind"], g["count"]) for g in rendered["instance_group"]] == expected


@pytest.mark.parametrize(
    ("text", "filled"),
    [("", {"platform": "onnxruntime_onnx", "backend": "onnxruntime"}),
     ('backend: "onnxruntime"', {"platform": "onnxruntime_onnx"}),
     ('platform: "onnxruntime_onnx"', {"backend": "onnxruntime"}),
     ('default_model_filename: "resnet.onnx"', {"default_model_filename": "resnet.onnx"}),
     ('version_policy { all {} }', {"version_policy": {"all": {}}}),
     ("optimization { input_pinned_memory { enable: false } }",
      {"optimization": {"priority": "PRIORITY_DEFAULT", "input_pinned_memory": {"enable": False},
                        "output_pinned_memory": {"enable": True},
                        "gather_kernel_buffer_threshold": 0, "eager_batching": False}})],
)  # fmt: skip
def test_backend_fields_and_defaults(text: str, filled: dict[str, Any]) -> None:
    rendered = config_json(complete_config(pbtxt(text), "m", [], []))
    assert {key: rendered[key] for key in filled} == filled


def test_the_given_config_is_not_changed() -> None:
    config = pbtxt(SIMPLE_PBTXT)
    before = config.SerializeToString()
    _complete(config, simple(), "simple")
    assert config.SerializeToString() == before
    assert complete_config(None, "m", [], []).name == "m"
    assert isinstance(complete_config(ModelConfig(), "m", [], []), ModelConfig)


@pytest.mark.parametrize(
    ("elem", "name"),
    [(TensorProto.FLOAT8E4M3FN, "float8e4m3fn"), (TensorProto.INT4, "int4"),
     (TensorProto.COMPLEX64, "complex64"), (TensorProto.UNDEFINED, "undefined")],
)  # fmt: skip
def test_element_types_a_config_cannot_name(elem: int, name: str) -> None:
    specs = [TensorSpec("x", elem, (2,))]
    with pytest.raises(InvalidInput) as caught:
        complete_config(None, "m", specs, [TensorSpec("y", F, (2,))])
    assert str(caught.value) == (
        f"unable to auto-complete model 'm': graph input 'x' has element type {name}, which a "
        "model configuration cannot name (Triton's DataType has no TYPE_ for it)"
    )


def test_label_files_are_checked_when_the_model_directory_is_given(tmp_path: Path) -> None:
    graph = loaded(densenet())
    config = pbtxt(DENSENET_PBTXT)
    complete_config(config, "densenet_onnx", graph.inputs, graph.outputs, tmp_path)
    config.output[0].label_filename = "../labels.txt"
    complete_config(config, "densenet_onnx", graph.inputs, graph.outputs)  # no directory
    with pytest.raises(InvalidInput) as caught:
        complete_config(config, "densenet_onnx", graph.inputs, graph.outputs, tmp_path)
    assert str(caught.value) == (
        "label file path '../labels.txt' for output 'fc6_1' in model 'densenet_onnx' is "
        "outside model directory"
    )
