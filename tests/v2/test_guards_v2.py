"""The V2 lane under the hostile-client guards: answers bounded and claimed by their real form,
small binary answers sent whole from the event loop, header counts that are really counts, and
metric labels that a long path cannot bloat."""

import warnings
from collections.abc import Iterator

import numpy as np
import orjson
import pytest

from service.api.v2_codec import SMALL_ANSWER_BYTES, encode_result, parse_request
from service.codecs.limits import Limits
from service.core.inference import InferWork
from service.core.model_lookup import find_model
from service.kernels.context import KernelContext
from service.main import create_app
from service.settings import Settings
from service.telemetry.recorder import UNKNOWN, _operator_labels, operator_labels

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from starlette.testclient import TestClient

MiB = 1024 * 1024
BUDGET = 16 * MiB  # the smallest budget the settings allow
COUNT = 2 * MiB  # float32 elements: 8 MiB of output, about 32 MiB as JSON text


def _fill(count: int, binary: bool) -> bytes:
    return orjson.dumps({
        "inputs": [{"name": "input", "shape": [1], "datatype": "INT64", "data": [count]},
                   {"name": "value", "shape": [1], "datatype": "FP32", "data": [1.5]}],
        "parameters": {"binary_data_output": binary},
    })  # fmt: skip


@pytest.fixture(scope="module")
def client() -> Iterator[TestClient]:
    settings = Settings(memory_budget_bytes=BUDGET, access_log=False)
    with TestClient(create_app(settings), raise_server_exceptions=False) as test_client:
        yield test_client


def test_a_json_answer_claims_its_whole_text(client: TestClient) -> None:
    """A large V2 JSON answer is encoded as it is sent (issue 16): 8 MiB of floats as ~32 MiB
    of text fit a 16 MiB budget, as the same output as binary data (sent from the output's
    memory) does; compressed, either is joined whole and no longer fits."""
    url = "/v2/models/ConstantOfShape/versions/25/infer"
    identity = {"Accept-Encoding": "identity"}  # httpx asks for gzip: that would copy the answer
    as_json = client.post(url, content=_fill(COUNT, False), headers=identity)
    assert as_json.status_code == 200, as_json.text[:300]
    assert as_json.json()["outputs"][0]["data"][-1] == 1.5
    gzipped = client.post(url, content=_fill(COUNT, False), headers={"Accept-Encoding": "gzip"})
    assert gzipped.status_code == 413, gzipped.text[:300]
    assert "OPSERVE_MEMORY_BUDGET_BYTES" in gzipped.json()["error"]
    as_binary = client.post(url, content=_fill(COUNT, True), headers=identity)
    assert as_binary.status_code == 200, as_binary.text[:300]
    head = int(as_binary.headers["inference-header-content-length"])
    values = np.frombuffer(as_binary.content[head:], dtype="<f4")
    assert values.shape == (COUNT,) and np.all(values == 1.5)
    # compressed, the answer is joined and deflated: two more copies, which pass the budget
    gzipped = client.post(url, content=_fill(COUNT, True), headers={"Accept-Encoding": "gzip"})
    assert gzipped.status_code == 413, gzipped.text[:300]


def test_a_header_length_in_other_digits_is_refused(client: TestClient) -> None:
    answer = client.post("/v2/models/Shape/infer", content=b"{}",
                         headers={"Inference-Header-Content-Length": "\u00b2".encode("latin-1")})  # fmt: skip
    assert answer.status_code == 400
    assert "is not a byte count" in answer.json()["error"]


@pytest.mark.parametrize("count", [16, SMALL_ANSWER_BYTES // 4 + 1])
def test_binary_answers_are_whole_when_small_and_parts_when_large(count: int) -> None:
    model, body = find_model("ConstantOfShape", "25", None), _fill(count, True)
    work = InferWork(model, lambda ctx: parse_request(body, None),
                     lambda call, result, ctx: encode_result(call, result), Limits(), len(body))  # fmt: skip
    content, head = work(KernelContext(64 * MiB))
    assert head is not None
    assert isinstance(content, bytes) == (count * 4 + head <= SMALL_ANSWER_BYTES)
    body = content if isinstance(content, bytes) else b"".join(content.chunks)
    assert np.all(np.frombuffer(body[head:], dtype="<f4") == 1.5)


def test_a_long_operator_path_is_labelled_unknown_without_a_cache_entry() -> None:
    before = _operator_labels.cache_info().currsize
    assert operator_labels("/v1/ops/" + "T" * 5000 + "/13") == UNKNOWN
    assert _operator_labels.cache_info().currsize == before
    assert operator_labels("/v1/ops/Tile/13") == ("Tile", "13")
