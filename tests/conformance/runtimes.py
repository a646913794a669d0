"""One-node models and the two runtimes that run them: onnx.reference and onnxruntime."""

import ctypes
from collections.abc import Sequence
from functools import lru_cache
from typing import Any

import numpy as np
import onnxruntime as ort
from onnx import ModelProto, NodeProto, TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

from service.codecs.dtypes import element_type_of

ort.set_default_logger_severity(4)  # the gap checks provoke load errors on purpose
# Types numpy and onnxruntime exchange directly; others go through OrtValue as raw bytes.
_NATIVE = frozenset(
    [
        "bool",
        "int8",
        "int16",
        "int32",
        "int64",
        "uint8",
        "uint16",
        "uint32",
        "uint64",
        "float16",
        "float32",
        "float64",
    ]
)


def one_node_model(
    node: NodeProto, version: int, inputs: dict[str, np.ndarray], outputs: dict[str, np.ndarray]
) -> ModelProto:
    """A model of one node at `version`, with the lowest IR version that opset needs; the
    graph's inputs and outputs typed like the given arrays (onnxruntime needs output types)."""
    graph = helper.make_graph(
        [node],
        "one_node",
        [helper.make_tensor_value_info(name, _enum(a), None) for name, a in inputs.items()],
        [helper.make_tensor_value_info(name, _enum(a), None) for name, a in outputs.items()],
    )
    opset = helper.make_opsetid("", version)
    model = helper.make_model(graph, opset_imports=[opset])
    model.ir_version = helper.find_min_ir_version_for([opset])
    return model


def _enum(array: np.ndarray) -> int:
    return element_type_of(array).enum


def run_reference(model: ModelProto, inputs: dict[str, np.ndarray]) -> list[np.ndarray]:
    return list(ReferenceEvaluator(model).run(None, inputs))


def run_onnxruntime(model: ModelProto, inputs: dict[str, np.ndarray]) -> list[np.ndarray]:
    session = _session(model.SerializeToString())
    if any(a.dtype == object for a in inputs.values()):  # OrtValue takes no strings
        return list(session.run(None, inputs))
    values = {name: _to_ort(a) for name, a in inputs.items()}
    outputs = session.run_with_ort_values(None, values)
    if any(v.is_sparse_tensor() for v in outputs):
        raise ValueError("onnxruntime returned a sparse tensor")
    return [_from_ort(v) for v in outputs]


@lru_cache(maxsize=256)  # one session per distinct model (operator, version, types, attributes)
def _session(serialized: bytes) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    return ort.InferenceSession(serialized, options, providers=["CPUExecutionProvider"])


def _to_ort(array: np.ndarray) -> ort.OrtValue:
    array = np.require(array, requirements="C")  # ascontiguousarray would make a scalar 1-D
    if array.dtype.name in _NATIVE:
        return ort.OrtValue.ortvalue_from_numpy(array)
    bits = array.view(f"u{array.dtype.itemsize}")  # bfloat16, float8: same-size integers
    return ort.OrtValue.ortvalue_from_numpy_with_onnx_type(bits, _enum(array))


def _from_ort(value: ort.OrtValue) -> np.ndarray:
    if value.element_type() == TensorProto.STRING:
        return value.numpy()
    # Raw bytes through a TensorProto, so numpy_helper unpacks 4-bit and 2-bit types.
    raw = ctypes.string_at(value.data_ptr(), value.tensor_size_in_bytes())
    return numpy_helper.to_array(
        helper.make_tensor("out", value.element_type(), value.shape(), raw, raw=True)
    )


def canonical(array: np.ndarray) -> Any:
    """A form in which equal tensors compare equal: bits for floats (NaN payloads and -0.0
    count), values for packed types (their spare bits mean nothing), lists for strings."""
    if array.dtype == object:
        return [str(s) for s in array.reshape(-1)]
    if array.dtype.itemsize == 1 and array.dtype.name.startswith(("int4", "uint4", "int2",
                                                                  "uint2", "float4")):  # fmt: skip
        return array.astype(np.float32).tobytes()
    return array.tobytes()


def assert_same(actual: Sequence[np.ndarray], expected: Sequence[np.ndarray]) -> None:
    assert len(actual) == len(expected)
    for got, want in zip(actual, expected, strict=True):
        want = np.asarray(want)
        if want.dtype.kind == "U":
            want = want.astype(object)
        assert got.dtype == want.dtype, (got.dtype, want.dtype)
        assert got.shape == want.shape, (got.shape, want.shape)
        assert canonical(got) == canonical(want), (got, want)
