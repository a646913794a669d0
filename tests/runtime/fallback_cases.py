"""The onnx backend node cases that onnx.reference itself passes in-process, and how to send
one through `POST /v1/models/run` (tensor_proto both ways)."""

import base64
import os
import warnings
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from onnx import TensorProto, numpy_helper
from onnx.backend.test.case.test_case import TestCase
from onnx.reference import ReferenceEvaluator

from tests.conformance.backend_cases import all_node_cases

SHARDS = 3  # test files test_fallback_cases_<i>.py, one per shard, spread over the workers
SLOW = frozenset({"test_averagepool_3d_default", "test_lppool_3d_default",
                  "test_maxpool_3d_default"})  # fmt: skip
"""onnx.reference takes 3-15 s on each (pure-Python pooling loops), twice per case here: about
30 s, a third of the suite's budget for these files. OPSERVE_TEST_SLOW_CASES=1 runs them."""


RANDOM_OPS = frozenset({"Bernoulli", "Multinomial", "RandomNormal", "RandomNormalLike",
                        "RandomUniform", "RandomUniformLike"})  # fmt: skip


def unseeded(case: TestCase) -> bool:
    """A node of the case draws random values without a seed (test_bernoulli and its kin): its
    expected outputs are one draw, which onnx.reference and the route match only by chance."""
    return any(node.op_type in RANDOM_OPS and not any(a.name == "seed" for a in node.attribute)
               for node in case.model.graph.node)  # fmt: skip


def wire_expressible(case: TestCase) -> bool:
    """Every input and expected output of every data set is a tensor: sequences, optionals
    and maps do not travel in the API's tensor forms."""
    return all(
        isinstance(value, np.ndarray)
        for inputs, outputs in case.data_sets
        for value in [*inputs, *outputs]
    )


def close(got: Any, want: Any, case: TestCase) -> bool:
    """The backend runner's comparison: exact for strings and bools, else within the case's
    rtol/atol (NaN equal to NaN), and the same dtype and shape."""
    got, want = np.asarray(got), np.asarray(want)
    if got.dtype != want.dtype or got.shape != want.shape:
        return False
    if want.dtype == object or want.dtype == bool:
        return bool(np.array_equal(got, want))
    try:
        np.testing.assert_allclose(got.astype(np.float64) if got.dtype.kind == "V" else got,
                                   want.astype(np.float64) if want.dtype.kind == "V" else want,
                                   rtol=case.rtol, atol=case.atol)  # fmt: skip
    except (AssertionError, TypeError, ValueError):
        try:  # ml_dtypes (bfloat16, float8, int4...) compare through float64
            np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64),
                                       rtol=case.rtol, atol=case.atol)  # fmt: skip
        except (AssertionError, TypeError, ValueError):
            return False
    return True


def reference_passes(case: TestCase) -> bool:
    """onnx.reference runs the case's model in-process and matches every expected output."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            evaluator = ReferenceEvaluator(case.model)
            for inputs, expected in case.data_sets:
                names = [i.name for i in case.model.graph.input]
                got = evaluator.run(None, dict(zip(names, inputs, strict=False)))
                if len(got) != len(expected):
                    return False
                if not all(close(g, w, case) for g, w in zip(got, expected, strict=True)):
                    return False
    except Exception:
        return False
    return True


def shard(index: int) -> list[TestCase]:
    """Shard `index` of the node cases (every SHARDS-th, by name)."""
    cases = sorted(all_node_cases(), key=lambda c: c.name)
    return cases[index::SHARDS]


def request(case: TestCase, inputs: list[np.ndarray]) -> dict[str, Any]:
    names = [i.name for i in case.model.graph.input]
    return {
        "model": base64.b64encode(case.model.SerializeToString()).decode(),
        "inputs": {n: {"tensor_proto": _b64(numpy_helper.from_array(np.asarray(a)))}
                   for n, a in zip(names, inputs, strict=False)},
        "output_format": "tensor_proto",
    }  # fmt: skip


def decoded(tensor: dict[str, str]) -> np.ndarray:
    proto = TensorProto()
    proto.ParseFromString(base64.b64decode(tensor["tensor_proto"]))
    return numpy_helper.to_array(proto)


def _b64(message: Any) -> str:
    return base64.b64encode(message.SerializeToString()).decode()


def check_case(client: Any, case: TestCase, ran: list[str], matched: list[str]) -> None:
    """The case through the route: with reference_passes, every output matches (the case's
    name goes in `matched`); otherwise no 5xx (a node the reference cannot run is a 4xx)."""
    ran.append(case.name)
    if case.name in SLOW and not os.environ.get("OPSERVE_TEST_SLOW_CASES"):
        pytest.skip("onnx.reference takes seconds on it (OPSERVE_TEST_SLOW_CASES=1 runs it)")
    if unseeded(case):  # draws: answered, of the expected dtype and shape
        for inputs, expected in case.data_sets:
            answer = client.post("/v1/models/run", json=request(case, inputs))
            assert answer.status_code == 200, answer.text
            for output, want in zip(case.model.graph.output, expected, strict=True):
                got = decoded(answer.json()["outputs"][output.name])
                assert (got.dtype, got.shape) == (want.dtype, want.shape), (output.name, got)
        return
    passes = reference_passes(case)
    if not wire_expressible(case):
        if passes:
            pytest.skip("sequence, optional or map values do not travel in the tensor forms")
        return
    names = [o.name for o in case.model.graph.output]
    for inputs, expected in case.data_sets:
        answer = client.post("/v1/models/run", json=request(case, inputs))
        assert answer.status_code < 500, answer.text
        if not passes:
            return
        assert answer.status_code == 200, answer.text
        body = answer.json()
        assert {n["ran_on"] for n in body["nodes"]} <= {"kernel", "reference"}
        for name, want in zip(names, expected, strict=True):
            got = decoded(body["outputs"][name])
            assert close(got, want, case), (name, got, want)
    matched.append(case.name)


def shard_tests(index: int) -> tuple[Any, Any, Any]:
    """The fixture and tests of one shard, for its test file to bind at module level (one file
    per shard lets pytest-xdist's --dist loadfile spread the cases over the workers)."""
    cases = shard(index)
    ran: list[str] = []
    matched: list[str] = []

    @pytest.fixture(scope="module")
    def client() -> Iterator[Any]:
        from starlette.testclient import TestClient

        from service.main import create_app
        from service.settings import Settings

        app = create_app(Settings(reference_fallback=True, access_log=False))
        with TestClient(app, raise_server_exceptions=False) as test_client:
            yield test_client

    @pytest.mark.parametrize("case", cases, ids=[case.name for case in cases])
    def test_backend_case_with_fallback(client: Any, case: TestCase) -> None:
        check_case(client, case, ran, matched)

    def test_most_of_the_shard_matched() -> None:
        """Runs after the cases above (same file, same worker): about 1,480 of the 1,884 cases
        match over the wire (the rest: the reference fails them, or they hold sequences)."""
        if len(ran) < len(cases):
            pytest.skip("only part of the shard ran (-k or -x)")
        assert len(matched) >= 470, len(matched)

    return client, test_backend_case_with_fallback, test_most_of_the_shard_matched
