"""Issue 31, item 2, against a live server: a repository model whose integer Div divides a
value computed from an input's shape (tests/conformance/test_ort_crashes.py's SHAPED, each of
which kills onnxruntime with SIGFPE there) loads on the exact engine with the reason, answers
the very shape that crashes onnxruntime, and the server stays up; posted and asked for
onnxruntime, it runs in an isolated worker, which the crash ends (500 naming SIGFPE), and
nothing else."""

from pathlib import Path

import httpx
import numpy as np
import pytest

from tests.api.live_server import serve
from tests.bounds.models import post_run, posted
from tests.conformance.test_ort_crashes import SHAPED


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("repository")
    for name, (built, _shape) in SHAPED.items():
        (root / f"{name}.onnx").write_bytes(built().SerializeToString())
    return root


def _x(shape: tuple[int, ...]) -> dict:
    return {"dtype": "uint8", "shape": list(shape), "data": [0] * int(np.prod(shape))}


def test_a_shape_that_would_crash_onnxruntime_never_reaches_it(repository: Path) -> None:
    with (
        serve(model_repository=str(repository), reference_fallback="true") as server,
        httpx.Client(timeout=60) as client,
    ):
        listed = {m["name"]: m["versions"][0]
                  for m in client.get(f"{server.url}/v1/models").json()["models"]}  # fmt: skip
        for name, (built, shape) in SHAPED.items():
            assert listed[name]["engine"] == "exact", listed[name]
            assert "SIGFPE" in listed[name]["engine_reason"], listed[name]
            answer = client.post(f"{server.url}/v1/models/{name}/run",
                                 json={"inputs": {"x": _x(shape)}})  # fmt: skip
            assert answer.status_code == 200, (name, answer.text)
            assert answer.json()["outputs"]["q"]["data"] == [-(2**63)], answer.text  # wraps
            status, body, _took = post_run(server, posted(built(), {"x": _x(shape)},
                                                          engine="onnxruntime"))  # fmt: skip
            assert status == 500 and "worker process: SIGFPE" in body["detail"], body
        assert server.process.poll() is None
        assert client.get(f"{server.url}/v2/health/live").status_code == 200
