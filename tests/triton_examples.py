"""Triton's example model repository (server docs/examples/model_repository, plus the two QA
models its example clients use), rebuilt here with onnx.helper and written with config.pbtxt
files in Triton's layout, for the tests that run Triton's example clients' calls against
opserve (HTTP and gRPC).

What each model computes is Triton's: simple adds and subtracts two INT32 [16] tensors;
simple_int8 the same in INT8 (wrapping); simple_string the same on numbers written as strings;
simple_identity echoes strings; simple_sequence answers READY * (INPUT + START) and
simple_dyna_sequence adds END * CORRID; simple_string_dyna_sequence accumulates per sequence
through implicit state (Triton's QA model, a C++ backend there); custom_identity_int32 echoes;
densenet_onnx is a small stand-in with Triton's configuration (FORMAT_NCHW, reshapes, a label
file) whose class 23 is VULTURE, as in Triton's labels. Their configurations name onnxruntime,
which runs them (no OPSERVE_REFERENCE_FALLBACK needed); on the exact engine most nodes would
need the reference fallback: only five operators have opserve kernels.
"""

from pathlib import Path

import numpy as np
import onnx
from onnx import ModelProto, NodeProto, TensorProto, ValueInfoProto, helper, numpy_helper

I8, I32, U64, F, S = (TensorProto.INT8, TensorProto.INT32, TensorProto.UINT64,
                      TensorProto.FLOAT, TensorProto.STRING)  # fmt: skip
CLASSES = 32  # the densenet stand-in's; Triton's has 1000
VULTURE = 23  # densenet_labels.txt's line 24, 0-based 23


def _value(name: str, elem: int, shape: list) -> ValueInfoProto:
    return helper.make_tensor_value_info(name, elem, shape)


def _model(nodes: list[NodeProto], inputs: list[ValueInfoProto], outputs: list[ValueInfoProto],
           initializers: dict[str, np.ndarray] | None = None) -> ModelProto:  # fmt: skip
    graph = helper.make_graph(nodes, "g", inputs, outputs, [
        numpy_helper.from_array(array, name) for name, array in (initializers or {}).items()])  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)


def _pair(elem: int, name: str) -> tuple[ModelProto, str]:
    """OUTPUT0 = INPUT0 + INPUT1, OUTPUT1 = INPUT0 - INPUT1, [batch, 16] of `elem`."""
    nodes = [helper.make_node("Add", ["INPUT0", "INPUT1"], ["OUTPUT0"]),
             helper.make_node("Sub", ["INPUT0", "INPUT1"], ["OUTPUT1"])]  # fmt: skip
    if elem == S:  # strings that hold numbers: parsed, added, printed back
        nodes = [helper.make_node("Cast", ["INPUT0"], ["a"], to=I32),
                 helper.make_node("Cast", ["INPUT1"], ["b"], to=I32),
                 helper.make_node("Add", ["a", "b"], ["sum"]),
                 helper.make_node("Sub", ["a", "b"], ["difference"]),
                 helper.make_node("Cast", ["sum"], ["OUTPUT0"], to=S),
                 helper.make_node("Cast", ["difference"], ["OUTPUT1"], to=S)]  # fmt: skip
    tensors = {io: _value(io, elem, [None, 16]) for io in ("INPUT0", "INPUT1", "OUTPUT0",
                                                           "OUTPUT1")}  # fmt: skip
    type_name = {I32: "TYPE_INT32", I8: "TYPE_INT8", S: "TYPE_STRING"}[elem]
    config = f"""name: "{name}"
platform: "onnxruntime_onnx"
max_batch_size: 8
input [ {{ name: "INPUT0" data_type: {type_name} dims: [ 16 ] }},
        {{ name: "INPUT1" data_type: {type_name} dims: [ 16 ] }} ]
output [ {{ name: "OUTPUT0" data_type: {type_name} dims: [ 16 ] }},
         {{ name: "OUTPUT1" data_type: {type_name} dims: [ 16 ] }} ]
"""
    return _model(nodes, [tensors["INPUT0"], tensors["INPUT1"]],
                  [tensors["OUTPUT0"], tensors["OUTPUT1"]]), config  # fmt: skip


def _identity(name: str, elem: int, max_batch_size: int, type_name: str) -> tuple[ModelProto, str]:
    model = _model([helper.make_node("Identity", ["INPUT0"], ["OUTPUT0"])],
                   [_value("INPUT0", elem, [None, None])], [_value("OUTPUT0", elem, [None, None])])  # fmt: skip
    config = f"""name: "{name}"
max_batch_size: {max_batch_size}
input [ {{ name: "INPUT0" data_type: {type_name} dims: [ -1 ] }} ]
output [ {{ name: "OUTPUT0" data_type: {type_name} dims: [ -1 ] }} ]
"""
    return model, config


_CONTROL = {
    "START": "CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ]",
    "END": "CONTROL_SEQUENCE_END int32_false_true: [ 0, 1 ]",
    "READY": "CONTROL_SEQUENCE_READY int32_false_true: [ 0, 1 ]",
    "CORRID": "CONTROL_SEQUENCE_CORRID data_type: {corrid}",
}
_SEQUENCE_IO = """input [ { name: "INPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUTPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
"""


def _sequence_config(name: str, controls: list[str], corrid: str = "TYPE_UINT64",
                     extra: str = "") -> str:  # fmt: skip
    inputs = ",\n    ".join(
        f'{{ name: "{c}" control [ {{ kind: {_CONTROL[c].format(corrid=corrid)} }} ] }}'
        for c in controls
    )  # fmt: skip
    return f"""name: "{name}"
platform: "onnxruntime_onnx"
max_batch_size: 8
sequence_batching {{
  max_sequence_idle_microseconds: 10000000
  control_input [
    {inputs}
  ]
  {extra}
}}
{_SEQUENCE_IO}"""


def _simple_sequence(dyna: bool) -> tuple[ModelProto, str]:
    """OUTPUT = READY * (INPUT + START [+ END * int32(CORRID)]), all [batch, 1]: stateless."""
    names = ["INPUT", "START", *(["END"] if dyna else []), "READY"]
    inputs = [_value(n, I32, [None, 1]) for n in names]
    nodes = [helper.make_node("Add", ["INPUT", "START"], ["acc"])]
    result = "acc"
    if dyna:
        inputs.append(_value("CORRID", U64, [None, 1]))
        nodes += [helper.make_node("Cast", ["CORRID"], ["corrid"], to=I32),
                  helper.make_node("Mul", ["END", "corrid"], ["ended"]),
                  helper.make_node("Add", ["acc", "ended"], ["acc2"])]  # fmt: skip
        result = "acc2"
    nodes.append(helper.make_node("Mul", ["READY", result], ["OUTPUT"]))
    model = _model(nodes, inputs, [_value("OUTPUT", I32, [None, 1])])
    name = "simple_dyna_sequence" if dyna else "simple_sequence"
    if not dyna:
        return model, _sequence_config(name, ["START", "READY"])
    # Triton's config (docs/examples/model_repository): the oldest strategy, batching the
    # steps of up to 1024 sequences per instance, two instances
    oldest = "oldest { max_candidate_sequences: 1024 max_queue_delay_microseconds: 10000 }"
    config = _sequence_config(name, ["START", "END", "READY", "CORRID"], extra=oldest)
    return model, config + "instance_group [ { count: 2 kind: KIND_CPU } ]\n"


def _string_dyna_sequence() -> tuple[ModelProto, str]:
    """Triton's QA accumulator in ONNX with implicit state: ACC = (START ? 0 : ACC) +
    sum(INPUT) (+ int(CORRID) at END), kept between the requests of a sequence."""
    inputs = [_value(n, I32, [None, 1]) for n in ("INPUT", "START", "END", "READY", "ACC_IN")]
    inputs.append(_value("CORRID", S, [None, 1]))
    one = {"one": np.array(1, np.int32)}
    nodes = [
        helper.make_node("Sub", ["one", "START"], ["keep"]),
        helper.make_node("Mul", ["ACC_IN", "keep"], ["previous"]),
        helper.make_node("Add", ["previous", "INPUT"], ["added"]),
        helper.make_node("Cast", ["CORRID"], ["corrid"], to=I32),
        helper.make_node("Mul", ["END", "corrid"], ["ended"]),
        helper.make_node("Add", ["added", "ended"], ["new"]),
        helper.make_node("Mul", ["READY", "new"], ["ready_part"]),
        helper.make_node("Sub", ["one", "READY"], ["idle"]),
        helper.make_node("Mul", ["idle", "ACC_IN"], ["idle_part"]),
        helper.make_node("Add", ["ready_part", "idle_part"], ["ACC_OUT"]),
        helper.make_node("Identity", ["ACC_OUT"], ["OUTPUT"]),
    ]
    outputs = [_value("OUTPUT", I32, [None, 1]), _value("ACC_OUT", I32, [None, 1])]
    state = ('state [ { input_name: "ACC_IN" output_name: "ACC_OUT" data_type: TYPE_INT32 '
             "dims: [ 1 ] initial_state: { data_type: TYPE_INT32 dims: [ 1 ] zero_data: true "
             'name: "zeros" } } ]')  # fmt: skip
    config = _sequence_config("simple_string_dyna_sequence", ["START", "END", "READY", "CORRID"],
                              "TYPE_STRING", state)  # fmt: skip
    return _model(nodes, inputs, outputs, one), config


def _densenet() -> tuple[ModelProto, str]:
    """data_0 [3, 4, 4] (NCHW) -> mean over H, W -> a 1x1 conv to CLASSES scores, fc6_1 [32]:
    for an image of ones, class 23 (VULTURE) scores highest."""
    weights = np.zeros((CLASSES, 3, 1, 1), np.float32)
    weights[:, :, 0, 0] = np.arange(CLASSES, dtype=np.float32)[:, None] / 100
    weights[VULTURE] = 1.0
    nodes = [helper.make_node("ReduceMean", ["data_0", "axes"], ["pooled"], keepdims=1),
             helper.make_node("Conv", ["pooled", "w"], ["fc6_1"])]  # fmt: skip
    model = _model(nodes, [_value("data_0", F, [1, 3, 4, 4])],
                   [_value("fc6_1", F, [1, CLASSES, 1, 1])],
                   {"axes": np.array([2, 3], np.int64), "w": weights})  # fmt: skip
    config = f"""name: "densenet_onnx"
platform: "onnxruntime_onnx"
max_batch_size: 0
input [ {{ name: "data_0" data_type: TYPE_FP32 format: FORMAT_NCHW dims: [ 3, 4, 4 ]
          reshape {{ shape: [ 1, 3, 4, 4 ] }} }} ]
output [ {{ name: "fc6_1" data_type: TYPE_FP32 dims: [ {CLASSES} ]
           reshape {{ shape: [ 1, {CLASSES}, 1, 1 ] }} label_filename: "densenet_labels.txt" }} ]
"""
    return model, config


def labels() -> list[str]:
    """The stand-in's label file: Triton's first labels, VULTURE at 23."""
    names = [f"CLASS_{i}" for i in range(CLASSES)]
    names[VULTURE] = "VULTURE"
    return names


MODELS = {
    "simple": lambda: _pair(I32, "simple"),
    "simple_int8": lambda: _pair(I8, "simple_int8"),
    "simple_string": lambda: _pair(S, "simple_string"),
    "simple_identity": lambda: _identity("simple_identity", S, 8, "TYPE_STRING"),
    "simple_sequence": lambda: _simple_sequence(False),
    "simple_dyna_sequence": lambda: _simple_sequence(True),
    "simple_string_dyna_sequence": _string_dyna_sequence,
    "custom_identity_int32": lambda: _identity("custom_identity_int32", I32, 1024, "TYPE_INT32"),
    "densenet_onnx": _densenet,
}


def write_repository(root: Path, names: list[str] | None = None) -> Path:
    """Triton's layout under `root`: `<name>/config.pbtxt` and `<name>/1/model.onnx` for each
    model of `names` (all by default)."""
    for name in names or list(MODELS):
        model, config = MODELS[name]()
        (root / name / "1").mkdir(parents=True, exist_ok=True)
        onnx.save(model, root / name / "1" / "model.onnx")
        (root / name / "config.pbtxt").write_text(config)
        if name == "densenet_onnx":
            (root / name / "densenet_labels.txt").write_text("\n".join(labels()) + "\n")
    return root
