"""Triton's example models rebuilt with onnx.helper (server docs/examples/model_repository), their
config.pbtxt texts, and a small densenet stand-in, for the model configuration tests."""

from typing import Any

import numpy as np
from google.protobuf import text_format
from onnx import ModelProto, TensorProto, helper

from service.runtime.config.messages import ModelConfig
from service.runtime.graph import LoadedModel
from service.runtime.plan import load_model
from service.settings import Settings

from .models import model, value

I32, U64, F, S = TensorProto.INT32, TensorProto.UINT64, TensorProto.FLOAT, TensorProto.STRING

SIMPLE_PBTXT = """
name: "simple"
platform: "onnxruntime_onnx"
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_INT32 dims: [ 16 ] },
        { name: "INPUT1" data_type: TYPE_INT32 dims: [ 16 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 16 ] },
         { name: "OUTPUT1" data_type: TYPE_INT32 dims: [ 16 ] } ]
"""
SIMPLE_STRING_PBTXT = SIMPLE_PBTXT.replace('"simple"', '"simple_string"').replace(
    "TYPE_INT32", "TYPE_STRING"
)
_CONTROLS = {
    "START": "kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ]",
    "END": "kind: CONTROL_SEQUENCE_END int32_false_true: [ 0, 1 ]",
    "READY": "kind: CONTROL_SEQUENCE_READY int32_false_true: [ 0, 1 ]",
    "CORRID": "kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_UINT64",
}
_SEQUENCE_IO = """
input [ { name: "INPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUTPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
"""
SIMPLE_SEQUENCE_PBTXT = f"""
name: "simple_sequence"
platform: "onnxruntime_onnx"
max_batch_size: 8
sequence_batching {{ control_input [
  {{ name: "START" control [ {{ {_CONTROLS["START"]} }} ] }},
  {{ name: "READY" control [ {{ {_CONTROLS["READY"]} }} ] }} ] }}
{_SEQUENCE_IO}
instance_group [ {{ kind: KIND_CPU }} ]
"""
SIMPLE_DYNA_SEQUENCE_PBTXT = f"""
name: "simple_dyna_sequence"
platform: "onnxruntime_onnx"
max_batch_size: 8
sequence_batching {{
  max_sequence_idle_microseconds: 10000000
  oldest {{ max_candidate_sequences: 1024 max_queue_delay_microseconds: 10000 }}
  control_input [
{",".join(f'    {{ name: "{n}" control [ {{ {c} }} ] }}' for n, c in _CONTROLS.items())}
  ]
}}
{_SEQUENCE_IO}
parameters [ {{ key: "execute_delay_ms" value: {{ string_value: "3" }} }} ]
instance_group [ {{ count: 2 kind: KIND_CPU }} ]
"""


def densenet_pbtxt(side: int = 4, classes: int = 10) -> str:
    """densenet_onnx's config; Triton's has side 224 and 1000 classes."""
    return f"""
name: "densenet_onnx"
platform: "onnxruntime_onnx"
max_batch_size : 0
input [ {{ name: "data_0" data_type: TYPE_FP32 format: FORMAT_NCHW dims: [ 3, {side}, {side} ]
          reshape {{ shape: [ 1, 3, {side}, {side} ] }} }} ]
output [ {{ name: "fc6_1" data_type: TYPE_FP32 dims: [ {classes} ]
           reshape {{ shape: [ 1, {classes}, 1, 1 ] }} label_filename: "densenet_labels.txt" }} ]
"""


DENSENET_PBTXT = densenet_pbtxt()


def pbtxt(text: str) -> Any:
    """A ModelConfig from text format."""
    return text_format.Parse(text, ModelConfig())


def simple(elem: int = I32) -> ModelProto:
    """OUTPUT0 = INPUT0 + INPUT1, OUTPUT1 = INPUT0 - INPUT1, all [batch, 16]."""
    nodes = [helper.make_node("Add", ["INPUT0", "INPUT1"], ["OUTPUT0"]),
             helper.make_node("Sub", ["INPUT0", "INPUT1"], ["OUTPUT1"])]  # fmt: skip
    ins = [value("INPUT0", elem, [None, 16]), value("INPUT1", elem, [None, 16])]
    outs = [value("OUTPUT0", elem, [None, 16]), value("OUTPUT1", elem, [None, 16])]
    return model(nodes, ins, outs)


def simple_string() -> ModelProto:
    """The strings parsed as int32, added and subtracted, and printed back."""
    nodes = [
        helper.make_node("Cast", ["INPUT0"], ["a"], to=I32),
        helper.make_node("Cast", ["INPUT1"], ["b"], to=I32),
        helper.make_node("Add", ["a", "b"], ["sum"]),
        helper.make_node("Sub", ["a", "b"], ["difference"]),
        helper.make_node("Cast", ["sum"], ["OUTPUT0"], to=S),
        helper.make_node("Cast", ["difference"], ["OUTPUT1"], to=S),
    ]
    ins = [value("INPUT0", S, [None, 16]), value("INPUT1", S, [None, 16])]
    outs = [value("OUTPUT0", S, [None, 16]), value("OUTPUT1", S, [None, 16])]
    return model(nodes, ins, outs)


def simple_sequence(dyna: bool = False) -> ModelProto:
    """OUTPUT = READY * (INPUT + START [+ END * int32(CORRID)]), all [batch, 1]."""
    names = ["INPUT", "START", *(["END"] if dyna else []), "READY"]
    ins = [value(name, I32, [None, 1]) for name in names]
    nodes = [helper.make_node("Add", ["INPUT", "START"], ["acc"])]
    if dyna:
        ins.append(value("CORRID", U64, [None, 1]))
        nodes += [helper.make_node("Cast", ["CORRID"], ["corrid"], to=I32),
                  helper.make_node("Mul", ["END", "corrid"], ["ended"]),
                  helper.make_node("Add", ["acc", "ended"], ["acc2"])]  # fmt: skip
    nodes.append(helper.make_node("Mul", ["READY", "acc2" if dyna else "acc"], ["OUTPUT"]))
    return model(nodes, ins, [value("OUTPUT", I32, [None, 1])])


def densenet() -> ModelProto:
    """data_0 [1,3,4,4] -> mean over H, W -> 1x1 conv to 10 classes -> fc6_1 [1,10,1,1]."""
    weights = np.arange(30, dtype=np.float32).reshape(10, 3, 1, 1) / 10
    nodes = [helper.make_node("ReduceMean", ["data_0", "axes"], ["pooled"], keepdims=1),
             helper.make_node("Conv", ["pooled", "w"], ["fc6_1"])]  # fmt: skip
    return model(nodes, [value("data_0", F, [1, 3, 4, 4])], [value("fc6_1", F, [1, 10, 1, 1])],
                 {"axes": np.array([2, 3], np.int64), "w": weights})  # fmt: skip


def loaded(proto: ModelProto) -> LoadedModel:
    """The model as the repository loads it (the onnx reference runs what has no kernel)."""
    return load_model(proto.SerializeToString(), Settings(reference_fallback=True))
