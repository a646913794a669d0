"""The onnx backend node test cases of the five operators pass over HTTP: each request is built
the way a client would, from the case's node attributes and input arrays, and POSTed to
/v1/ops/{op_type}/{the case's opset}; the outputs must equal the expected arrays exactly."""

import base64
from typing import Any

import numpy as np
import onnx.defs
import pytest
from onnx import AttributeProto, ModelProto, helper
from starlette.testclient import TestClient

from tests.conformance.backend_cases import all_node_cases

from .cases import from_wire, json_tensor, proto_tensor

OPERATORS = {"Constant", "ConstantOfShape", "RandomUniformLike", "Tile", "Shape"}
ALL_CASES = all_node_cases()  # shared with the other users in this process
CASES = [
    case
    for case in ALL_CASES
    if len(case.model.graph.node) == 1 and case.model.graph.node[0].op_type in OPERATORS
]


def test_the_whole_set_is_collected() -> None:
    assert len(CASES) == 17
    assert {case.model.graph.node[0].op_type for case in CASES} == OPERATORS - {
        "RandomUniformLike"  # onnx has no node case for it: its values are random
    }


def _b64(message: Any) -> str:
    return base64.b64encode(message.SerializeToString()).decode()


def attribute_json(attribute: AttributeProto) -> Any:
    """An ONNX attribute as the REST API takes it: TENSOR as {"tensor_proto": base64}."""
    kind = attribute.type
    if kind == AttributeProto.TENSOR:
        return {"tensor_proto": _b64(attribute.t)}
    if kind == AttributeProto.SPARSE_TENSOR:
        return {"sparse_tensor_proto": _b64(attribute.sparse_tensor)}
    value = helper.get_attribute_value(attribute)
    if kind == AttributeProto.STRING:
        return value.decode()
    if kind == AttributeProto.STRINGS:
        return [v.decode() for v in value]
    return list(value) if kind in (AttributeProto.INTS, AttributeProto.FLOATS) else value


def _opset(model: ModelProto) -> int:
    return next(o.version for o in model.opset_import if o.domain in ("", "ai.onnx"))


@pytest.mark.parametrize("tensor_form", ["tensor_proto", "json"])
@pytest.mark.parametrize("case", CASES, ids=[case.name for case in CASES])
def test_backend_case_over_http(client: TestClient, case: Any, tensor_form: str) -> None:
    node, opset = case.model.graph.node[0], _opset(case.model)
    schema = onnx.defs.get_schema(node.op_type, opset, "")
    encode = proto_tensor if tensor_form == "tensor_proto" else json_tensor
    for inputs, expected in case.data_sets:
        # The graph names its values freely; the API takes the schema's formal names.
        body = {
            "inputs": {formal.name: encode(np.asarray(array))
                       for formal, array in zip(schema.inputs, inputs, strict=False)},
            "attributes": {a.name: attribute_json(a) for a in node.attribute},
            "output_format": tensor_form,
        }  # fmt: skip
        answer = client.post(f"/v1/ops/{node.op_type}/{opset}", json=body)
        assert answer.status_code == 200, answer.text
        response = answer.json()
        assert response["version"] == schema.since_version
        outputs = response["outputs"]
        for formal, want in zip(schema.outputs, expected, strict=True):
            got = from_wire(outputs[formal.name])
            assert got.dtype == want.dtype and got.shape == want.shape
            np.testing.assert_array_equal(got, want)
