"""The onnx backend node cases of the five operators, as whole models through
`POST /v1/models/run` (fallback off: every node runs on our kernels), in a JSON body with
either tensor form and as multipart/form-data; outputs equal the expected arrays exactly."""

import json
from typing import Any

import numpy as np
import pytest
from starlette.testclient import TestClient

from tests.conformance.backend_cases import backend_cases

from .cases import from_wire, json_tensor, proto_tensor

CASES = backend_cases()


def test_the_cases_are_collected() -> None:
    assert len(CASES) == 17


def _options(case: Any, inputs: list[np.ndarray], form: str) -> dict[str, Any]:
    encode = proto_tensor if form == "tensor_proto" else json_tensor
    names = [i.name for i in case.model.graph.input]
    return {"inputs": {n: encode(np.asarray(a)) for n, a in zip(names, inputs, strict=False)},
            "output_format": form}  # fmt: skip


@pytest.mark.parametrize("transport", ["json", "multipart"])
@pytest.mark.parametrize("form", ["tensor_proto", "json"])
@pytest.mark.parametrize("case", CASES, ids=[case.name for case in CASES])
def test_backend_case_as_a_model(client: TestClient, case: Any, form: str, transport: str) -> None:
    from .test_backend_cases_http import _b64

    for inputs, expected in case.data_sets:
        options = _options(case, inputs, form)
        if transport == "json":
            answer = client.post("/v1/models/run", json={"model": _b64(case.model), **options})
        else:
            answer = client.post("/v1/models/run", data={"request": json.dumps(options)},
                                 files={"model": ("model.onnx", case.model.SerializeToString())})  # fmt: skip
        assert answer.status_code == 200, answer.text
        body = answer.json()
        assert [n["ran_on"] for n in body["nodes"]] == ["kernel"]
        names = [o.name for o in case.model.graph.output]
        for name, want in zip(names, expected, strict=True):
            got = from_wire(body["outputs"][name])
            assert got.dtype == want.dtype and got.shape == want.shape
            np.testing.assert_array_equal(got, want)
