"""The onnx backend node cases of our five operators, through V2 with tritonclient.http: each
case's node attributes become request parameters (a TENSOR attribute an extra input), its
inputs go once as JSON and once as binary data, and the outputs must equal onnx's exactly."""

import json
from typing import Any

import ml_dtypes
import numpy as np
import onnx.defs
import pytest
import tritonclient.http as triton
from onnx import AttributeProto, helper, numpy_helper

from tests.conformance.backend_cases import backend_cases, opset

CASES = backend_cases()


def test_the_cases_are_collected() -> None:
    assert len(CASES) == 17


def _input(name: str, array: np.ndarray, binary: bool) -> triton.InferInput:
    datatype = (
        "BF16" if array.dtype == ml_dtypes.bfloat16 else triton.np_to_triton_dtype(array.dtype)
    )
    tensor = triton.InferInput(name, list(array.shape), datatype)
    return tensor.set_data_from_numpy(array, binary_data=binary)


def _parameter(attribute: AttributeProto) -> Any:
    value = helper.get_attribute_value(attribute)
    if attribute.type == AttributeProto.STRING:
        return value.decode()
    if attribute.type in (AttributeProto.INTS, AttributeProto.FLOATS):
        return json.dumps(list(value))
    if attribute.type == AttributeProto.STRINGS:
        return json.dumps([v.decode() for v in value])
    return value


@pytest.mark.parametrize("binary", [False, True], ids=["json", "binary"])
@pytest.mark.parametrize("case", CASES, ids=[case.name for case in CASES])
def test_backend_case_over_v2(
    client: triton.InferenceServerClient, case: Any, binary: bool
) -> None:
    node = case.model.graph.node[0]
    schema = onnx.defs.get_schema(node.op_type, opset(case), "")
    parameters = {a.name: _parameter(a) for a in node.attribute if a.type != AttributeProto.TENSOR}
    tensors = {a.name: numpy_helper.to_array(a.t) for a in node.attribute
               if a.type == AttributeProto.TENSOR}  # fmt: skip
    for inputs, expected in case.data_sets:
        named = {f.name: np.asarray(a) for f, a in zip(schema.inputs, inputs, strict=False)}
        sent = [_input(name, array, binary) for name, array in {**named, **tensors}.items()]
        result = client.infer(node.op_type, sent, model_version=str(schema.since_version),
                              parameters=parameters or None)  # fmt: skip
        for formal, want in zip(schema.outputs, expected, strict=True):
            got = result.as_numpy(formal.name)
            assert got is not None and got.dtype == want.dtype and got.shape == want.shape
            np.testing.assert_array_equal(got, want)
