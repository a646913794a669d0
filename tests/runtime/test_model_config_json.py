"""GET .../config's JSON against what Triton renders (notes/triton-http.md §1.4), and load
overrides' JSON parsed as Triton's JsonToModelConfig would."""

import json
from typing import Any

import pytest
from google.protobuf.descriptor import Descriptor, FieldDescriptor

from service.errors import InvalidInput
from service.runtime.config.complete import complete_config
from service.runtime.config.json_form import (
    INT64_PATHS,
    LEFT_AS_STRINGS,
    config_from_json,
    config_json,
)
from service.runtime.config.messages import DataType, ModelConfig
from service.runtime.graph import TensorSpec

from .config_models import (
    SIMPLE_DYNA_SEQUENCE_PBTXT,
    SIMPLE_PBTXT,
    densenet_pbtxt,
    loaded,
    pbtxt,
    simple,
    simple_sequence,
)


def _input(name: str, **changed: Any) -> dict[str, Any]:
    return {"name": name, "data_type": "TYPE_INT32", "format": "FORMAT_NONE", "dims": [16],
            "is_shape_tensor": False, "allow_ragged_batch": False, "optional": False,
            "is_non_linear_format_io": False, **changed}  # fmt: skip


def _output(name: str, **changed: Any) -> dict[str, Any]:
    return {"name": name, "data_type": "TYPE_INT32", "dims": [16], "label_filename": "",
            "is_shape_tensor": False, "is_non_linear_format_io": False, **changed}  # fmt: skip


SIMPLE_JSON = {
    "name": "simple", "platform": "onnxruntime_onnx", "backend": "onnxruntime", "runtime": "",
    "version_policy": {"latest": {"num_versions": 1}}, "max_batch_size": 8,
    "input": [_input("INPUT0"), _input("INPUT1")],
    "output": [_output("OUTPUT0"), _output("OUTPUT1")],
    "batch_input": [], "batch_output": [],
    "optimization": {"priority": "PRIORITY_DEFAULT", "input_pinned_memory": {"enable": True},
                     "output_pinned_memory": {"enable": True},
                     "gather_kernel_buffer_threshold": 0, "eager_batching": False},
    "instance_group": [{"name": "simple", "kind": "KIND_CPU", "count": 2, "gpus": [],
                        "secondary_devices": [], "profile": [], "passive": False,
                        "host_policy": ""}],
    "default_model_filename": "model.onnx", "cc_model_filenames": {}, "metric_tags": {},
    "parameters": {}, "model_warmup": [],
}  # fmt: skip


def _simple(config: Any) -> Any:
    graph = loaded(simple())
    return complete_config(config, "simple", graph.inputs, graph.outputs)


def test_simple_renders_as_triton_does() -> None:
    rendered = config_json(_simple(pbtxt(SIMPLE_PBTXT)))
    assert rendered == SIMPLE_JSON
    # the same field set, order, and numbers where Triton has numbers
    assert json.dumps(rendered) == json.dumps(SIMPLE_JSON)


def test_densenet_fragments() -> None:
    inputs = [TensorSpec("data_0", 1, (1, 3, 224, 224))]
    outputs = [TensorSpec("fc6_1", 1, (1, 1000, 1, 1))]
    config = complete_config(pbtxt(densenet_pbtxt(224, 1000)), "densenet_onnx", inputs, outputs)
    rendered = config_json(config)
    assert json.dumps(rendered["input"][0]) == json.dumps(
        {"name": "data_0", "data_type": "TYPE_FP32", "format": "FORMAT_NCHW",
         "dims": [3, 224, 224], "reshape": {"shape": [1, 3, 224, 224]}, "is_shape_tensor": False,
         "allow_ragged_batch": False, "optional": False, "is_non_linear_format_io": False}
    )  # fmt: skip
    assert json.dumps(rendered["output"][0]) == json.dumps(
        {"name": "fc6_1", "data_type": "TYPE_FP32", "dims": [1000],
         "reshape": {"shape": [1, 1000, 1, 1]}, "label_filename": "densenet_labels.txt",
         "is_shape_tensor": False, "is_non_linear_format_io": False}
    )  # fmt: skip
    assert rendered["max_batch_size"] == 0 and "dynamic_batching" not in rendered


def _control(name: str, kind: str, **values: Any) -> dict[str, Any]:
    lists = {"int32_false_true": [], "fp32_false_true": [], "bool_false_true": [], **values}
    data_type = lists.pop("data_type", "TYPE_INVALID")
    return {"name": name, "control": [{"kind": f"CONTROL_SEQUENCE_{kind}", **lists,
                                       "data_type": data_type}]}  # fmt: skip


def test_simple_dyna_sequence_fragment() -> None:
    graph = loaded(simple_sequence(dyna=True))
    config = complete_config(pbtxt(SIMPLE_DYNA_SEQUENCE_PBTXT), "simple_dyna_sequence",
                             graph.inputs, graph.outputs)  # fmt: skip
    rendered = config_json(config)
    expected = {
        "oldest": {"max_candidate_sequences": 1024, "preferred_batch_size": [8],
                   "max_queue_delay_microseconds": 10000, "preserve_ordering": False},
        "max_sequence_idle_microseconds": 10000000,
        "control_input": [_control("START", "START", int32_false_true=[0, 1]),
                          _control("END", "END", int32_false_true=[0, 1]),
                          _control("READY", "READY", int32_false_true=[0, 1]),
                          _control("CORRID", "CORRID", data_type="TYPE_UINT64")],
        "state": [], "iterative_sequence": False,
    }  # fmt: skip
    assert json.dumps(rendered["sequence_batching"]) == json.dumps(expected)
    assert list(rendered).index("sequence_batching") == list(rendered).index("optimization") + 1
    assert rendered["parameters"] == {"execute_delay_ms": {"string_value": "3"}}
    assert rendered["instance_group"][0] | {"gpus": []} == {
        "name": "simple_dyna_sequence_0", "kind": "KIND_CPU", "count": 2, "gpus": [],
        "secondary_devices": [], "profile": [], "passive": False, "host_policy": ""}  # fmt: skip


def test_the_model_control_override_gets_dynamic_batching() -> None:
    """simple_http_model_control.py loads `simple` with {"max_batch_size":"16"} only."""
    rendered = config_json(_simple(config_from_json('{"max_batch_size":"16"}')))
    assert rendered["max_batch_size"] == 16
    assert json.dumps(rendered["dynamic_batching"]) == json.dumps(
        {"preferred_batch_size": [16], "max_queue_delay_microseconds": 0,
         "preserve_ordering": False, "priority_levels": 0, "default_priority_level": 0,
         "priority_queue_policy": {}}
    )  # fmt: skip
    assert [io["dims"] for io in rendered["input"]] == [[16], [16]]


NUMBERS_PBTXT = """
name: "n" version_policy { specific { versions: [ 1, 3 ] } }
input [ { name: "I" dims: [ -1, 2 ] reshape { shape: [ 2, -1 ] } } ]
dynamic_batching { max_queue_delay_microseconds: 100 priority_levels: 2
  default_priority_level: 1 default_queue_policy { default_timeout_microseconds: 7 }
  priority_queue_policy { key: 2 value { default_timeout_microseconds: 9 } } }
instance_group [ { secondary_devices [ { device_id: 5 } ] } ]
model_warmup [ { name: "w" inputs { key: "I" value { dims: [ 4 ] } } } ]
"""


def test_64_bit_fields_are_numbers_exactly_where_triton_fixes_them() -> None:
    rendered = config_json(pbtxt(NUMBERS_PBTXT))
    assert rendered["version_policy"] == {"specific": {"versions": [1, 3]}}
    assert (rendered["input"][0]["dims"], rendered["input"][0]["reshape"]) == (
        [-1, 2], {"shape": [2, -1]})  # fmt: skip
    batching = rendered["dynamic_batching"]
    assert [batching[k] for k in ("max_queue_delay_microseconds", "priority_levels",
                                  "default_priority_level")] == [100, 2, 1]  # fmt: skip
    assert batching["default_queue_policy"]["default_timeout_microseconds"] == 7
    assert batching["priority_queue_policy"]["2"]["default_timeout_microseconds"] == 9
    assert rendered["model_warmup"][0]["inputs"]["I"]["dims"] == [4]
    assert rendered["instance_group"][0]["secondary_devices"][0]["device_id"] == "5"  # as Triton


def test_sequence_numbers_and_floats() -> None:
    config = pbtxt("""name: "s" sequence_batching { direct { max_queue_delay_microseconds: 5
      minimum_slot_utilization: 0.5 } control_input [ { name: "S" control [ {
      kind: CONTROL_SEQUENCE_START fp32_false_true: [ 0, 1 ] } ] } ]
      state [ { input_name: "i" output_name: "o" dims: [ -1 ]
                initial_state [ { dims: [ 2 ] zero_data: true } ] } ] }""")  # fmt: skip
    batcher = config_json(config)["sequence_batching"]
    assert batcher["direct"] == {"max_queue_delay_microseconds": 5,
                                 "minimum_slot_utilization": 0.5}  # fmt: skip
    assert batcher["control_input"][0]["control"][0]["fp32_false_true"] == [0, 1]
    assert batcher["max_sequence_idle_microseconds"] == 0
    assert batcher["state"][0]["dims"] == [-1]
    assert batcher["state"][0]["initial_state"][0]["dims"] == ["2"]  # Triton's fix-up misses it


def _int64_fields(descriptor: Descriptor, path: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    found = []
    for field in descriptor.fields:
        here = (*path, field.name)
        message = field.message_type
        if message is not None and message.GetOptions().map_entry:
            key, value = message.fields_by_name["key"], message.fields_by_name["value"]
            if key.cpp_type in (FieldDescriptor.CPPTYPE_INT64, FieldDescriptor.CPPTYPE_UINT64):
                found.append((*here, "<key>"))
            if value.message_type is not None:
                found += _int64_fields(value.message_type, (*here, "*"))
        elif message is not None:
            found += _int64_fields(message, (*here, "*") if field.is_repeated else here)
        elif field.cpp_type in (FieldDescriptor.CPPTYPE_INT64, FieldDescriptor.CPPTYPE_UINT64):
            found.append(here)
    return found


def test_every_64_bit_field_is_accounted_for() -> None:
    """Triton's ValidateModelConfigInt64 keeps its fix-up list complete; so does this."""
    assert sorted(_int64_fields(ModelConfig.DESCRIPTOR)) == sorted(INT64_PATHS + LEFT_AS_STRINGS)


def test_rendering_round_trips() -> None:
    config = _simple(pbtxt(SIMPLE_PBTXT))
    assert config_from_json(json.dumps(config_json(config))) == config
    dyna = pbtxt(SIMPLE_DYNA_SEQUENCE_PBTXT)
    assert config_from_json(json.dumps(config_json(dyna))) == dyna


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("{", "Invalid config override: Failed to load JSON: Expecting property name enclosed in "
              "double quotes: line 1 column 2 (char 1)."),
        ('{"foo": 1}', 'Invalid config override: Message type "inference.ModelConfig" has no '
                       'field named "foo" at "ModelConfig".'),
        ('{"max_batch_size": "x"}', "Invalid config override: Failed to parse max_batch_size "
                                    "field: invalid literal for int() with base 10: 'x'."),
        ("[" * 100000, "Invalid config override: Failed to load JSON: maximum recursion depth"),
        ('{"name": "' + "n" * 1000 + '", "x": 1}', "Invalid config override: Message type"),
    ],
)  # fmt: skip
def test_a_malformed_override_is_refused(text: str, message: str) -> None:
    with pytest.raises(InvalidInput) as caught:
        config_from_json(text)
    assert str(caught.value).startswith(message)
    assert len(str(caught.value)) < 400


def test_the_override_is_a_whole_config() -> None:
    config = config_from_json('{"max_batch_size": "16", "input": [{"name": "INPUT0", '
                              '"data_type": "TYPE_INT32", "dims": ["16"]}]}')  # fmt: skip
    assert config.max_batch_size == 16 and list(config.input[0].dims) == [16]
    assert config.input[0].data_type == DataType.Value("TYPE_INT32")
