"""Models and helpers of the cluster sequence tests: Triton's accumulator
(tests/triton_examples.py simple_string_dyna_sequence) and `history`, a sequence model whose
implicit state is the list of every INPUT its sequence took, in the order the steps ran, so
a test reads the order (and any lost or doubled step) off one answer. Each history step also
tiles a constant to WORK_ELEMENTS (a few milliseconds of work) so steps sent close together
overlap on the server."""

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from tests.triton_examples import write_repository

I32, I64 = TensorProto.INT32, TensorProto.INT64
WORK_ELEMENTS = 4_000_000
HISTORY_IDLE_US = 1_500_000
HISTORY_SLOTS = 3


def _history() -> onnx.ModelProto:
    constants = {"block": np.ones(1000, np.int32),
                 "repeats": np.array([WORK_ELEMENTS // 1000], np.int64),
                 "axes": np.array([0], np.int64), "zero": np.zeros(1, np.int32)}  # fmt: skip
    nodes = [helper.make_node("Tile", ["block", "repeats"], ["work"]),
             helper.make_node("ReduceMin", ["work", "axes"], ["one"], keepdims=1),
             helper.make_node("Mul", ["one", "zero"], ["nothing"]),  # the work feeds the answer
             helper.make_node("Add", ["INPUT", "nothing"], ["input"]),
             helper.make_node("Concat", ["HIST_IN", "input"], ["HIST_OUT"], axis=0),
             helper.make_node("Identity", ["HIST_OUT"], ["OUTPUT"])]  # fmt: skip
    graph = helper.make_graph(
        nodes, "history",
        [helper.make_tensor_value_info("INPUT", I32, [1]),
         helper.make_tensor_value_info("HIST_IN", I32, [None])],
        [helper.make_tensor_value_info("OUTPUT", I32, [None]),
         helper.make_tensor_value_info("HIST_OUT", I32, [None])],
        [numpy_helper.from_array(array, name) for name, array in constants.items()])  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)


HISTORY_CONFIG = f"""name: "history"
max_batch_size: 0
sequence_batching {{
  max_sequence_idle_microseconds: {HISTORY_IDLE_US}
  oldest {{ max_candidate_sequences: {HISTORY_SLOTS} }}
  state [ {{ input_name: "HIST_IN" output_name: "HIST_OUT" data_type: TYPE_INT32 dims: [ -1 ] }} ]
}}
input [ {{ name: "INPUT" data_type: TYPE_INT32 dims: [ 1 ] }} ]
output [ {{ name: "OUTPUT" data_type: TYPE_INT32 dims: [ -1 ] }} ]
instance_group [ {{ count: 1 kind: KIND_CPU }} ]
"""


def sequence_repository(root: Path) -> Path:
    """Triton's simple (stateless), simple_sequence and simple_string_dyna_sequence, and
    history, in Triton's layout under `root`."""
    write_repository(root, ["simple", "simple_sequence", "simple_string_dyna_sequence"])
    (root / "history" / "1").mkdir(parents=True)
    onnx.save(_history(), root / "history" / "1" / "model.onnx")
    (root / "history" / "config.pbtxt").write_text(HISTORY_CONFIG)
    return root
