"""Bare `Infinity`, `-Infinity` and `NaN` in a JSON body (not JSON, but pydantic's parser reads
them as floats): refused with the words that say how to write them, never a 500 (a data list
holding both infinities made plain_numbers' fsum raise ValueError)."""

import pytest
from fastapi.testclient import TestClient

from service.main import create_app

V2 = (b'{"inputs":[{"name":"input","shape":[2],"datatype":"FP32","data":[%s]},'
      b'{"name":"repeats","shape":[1],"datatype":"INT64","data":[2]}]}')  # fmt: skip
V1 = (b'{"inputs":{"input":{"dtype":"float","shape":[2],"data":[%s]},'
      b'"repeats":{"dtype":"int64","data":[2]}}}')  # fmt: skip


@pytest.mark.parametrize("values", [b"Infinity,-Infinity", b"-Infinity,Infinity", b"NaN,1",
                                    b"Infinity,1"])  # fmt: skip
def test_bare_non_finite_numbers_are_refused_not_a_500(values: bytes) -> None:
    headers = {"content-type": "application/json"}
    with TestClient(create_app()) as client:
        v2 = client.post("/v2/models/Tile/versions/13/infer", content=V2 % values,
                         headers=headers)  # fmt: skip
        v1 = client.post("/v1/ops/Tile/13", content=V1 % values, headers=headers)
    assert v2.status_code == 400 and "not finite" in v2.json()["error"], v2.text
    assert v1.status_code == 422 and "not finite" in v1.json()["detail"], v1.text
