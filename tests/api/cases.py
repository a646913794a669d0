"""Valid requests for every served operator version, with the expected outputs from onnx's
reference implementation (numpy's np.tile for Caffe2's Tile-1, which onnx.reference lacks)."""

import base64
from typing import Any

import numpy as np
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

# The contract's table: every since_version served, per operator.
CONTRACT: dict[str, list[int]] = {
    "Constant": [1, 9, 11, 12, 13, 19, 21, 23, 24, 25],
    "ConstantOfShape": [9, 20, 21, 23, 24, 25],
    "RandomUniformLike": [1, 22],
    "Tile": [1, 6, 13],
    "Shape": [1, 13, 15, 19, 21, 23, 24, 25],
}
VERSIONS = [(op, v) for op, versions in CONTRACT.items() for v in versions]

X = np.arange(1, 7, dtype=np.float32).reshape(2, 3)


def json_tensor(array: np.ndarray) -> dict[str, Any]:
    """The JSON form of a numeric array (canonical dtype names are onnx's lower-case enum names)."""
    enum = helper.np_dtype_to_tensor_dtype(array.dtype)
    name = TensorProto.DataType.Name(enum).lower()
    return {"dtype": name, "shape": list(array.shape), "data": array.reshape(-1).tolist()}


def proto_tensor(array: np.ndarray) -> dict[str, str]:
    """The tensor_proto form of an array."""
    return {
        "tensor_proto": base64.b64encode(
            numpy_helper.from_array(array).SerializeToString()
        ).decode()
    }


def from_wire(tensor: dict[str, Any]) -> np.ndarray:
    """An output tensor in either form -> array (tensor_proto decoded by onnx.numpy_helper)."""
    if "tensor_proto" in tensor:
        proto = TensorProto()
        proto.ParseFromString(base64.b64decode(tensor["tensor_proto"]))
        return numpy_helper.to_array(proto)
    enum = getattr(TensorProto, tensor["dtype"].upper())
    dtype = helper.tensor_dtype_to_np_dtype(enum)
    return np.array(tensor["data"], dtype=dtype).reshape(tensor["shape"])


def inputs_of(op_type: str, since: int) -> dict[str, np.ndarray]:
    """The input arrays of the valid request of a version."""
    if op_type == "Constant":
        return {}
    if op_type == "ConstantOfShape":
        return {"input": np.array([2, 3], dtype=np.int64)}
    if op_type == "Tile" and since == 1:
        return {
            "input": X,
            "tiles": np.array(2, dtype=np.int64),
            "axis": np.array(1, dtype=np.int64),
        }
    if op_type == "Tile":
        return {"input": X, "repeats": np.array([2, 3], dtype=np.int64)}
    name = "data" if op_type == "Shape" else "input"
    return {name: X}


def attributes_of(op_type: str, since: int) -> dict[str, Any]:
    """The attributes (as ONNX values: arrays for TENSOR) of the valid request of a version."""
    if op_type == "Constant":
        return {"value": X}
    if op_type == "ConstantOfShape":
        return {"value": np.array([7], dtype=np.int32)}
    if op_type == "RandomUniformLike":
        return {"low": -2.0, "high": 3.0, "seed": 5.0}
    if op_type == "Shape" and since >= 15:
        return {"start": 1}
    return {}


def request_body(
    op_type: str, since: int, tensor_form: str = "json", output_format: str = "json"
) -> dict[str, Any]:
    """The valid request of a version, its tensors in `tensor_form` (json or tensor_proto)."""
    encode = json_tensor if tensor_form == "json" else proto_tensor
    attributes = {
        name: encode(value) if isinstance(value, np.ndarray) else value
        for name, value in attributes_of(op_type, since).items()
    }
    inputs = {name: encode(array) for name, array in inputs_of(op_type, since).items()}
    return {"inputs": inputs, "attributes": attributes, "output_format": output_format}


def reference_output(op_type: str, since: int, **overrides: Any) -> np.ndarray:
    """The one output of the version's valid request, by onnx.reference."""
    inputs = inputs_of(op_type, since)
    attributes = {**attributes_of(op_type, since), **overrides}
    if op_type == "Tile" and since == 1:  # Caffe2's Tile: np.tile along one axis
        repeats = [1] * inputs["input"].ndim
        repeats[int(inputs["axis"])] = int(inputs["tiles"])
        return np.tile(inputs["input"], repeats)
    return run_reference(op_type, since, inputs, attributes)


def run_reference(
    op_type: str, opset: int, inputs: dict[str, np.ndarray], attributes: dict[str, Any]
) -> np.ndarray:
    """Run one node with onnx.reference at `opset`."""
    onnx_attributes = {
        name: numpy_helper.from_array(value) if isinstance(value, np.ndarray) else value
        for name, value in attributes.items()
    }
    node = helper.make_node(op_type, list(inputs), ["y"], **onnx_attributes)
    graph_inputs = [
        helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(a.dtype), a.shape)
        for name, a in inputs.items()
    ]
    output = helper.make_tensor_value_info("y", TensorProto.UNDEFINED, None)
    graph = helper.make_graph([node], "node", graph_inputs, [output])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    return np.asarray(ReferenceEvaluator(model).run(None, inputs)[0])
