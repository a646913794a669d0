"""An ensemble is bounded as a whole: its steps run under one run deadline
(OPSERVE_MAX_RUN_SECONDS), so sixteen steps that each fit in it but together do not answer 504,
while the step model called alone with the same inputs answers; the server goes on serving.

Times are the test's own: one step's time is measured on the step model first, and the steps'
size is set from it (a step at a fifth to a half of the deadline, sixteen of them 3 to 8 times
it: a busy host may slow either twofold and the outcome holds)."""

import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
import tritonclient.http as httpclient
from onnx import TensorProto, helper
from prometheus_client.parser import text_string_to_metric_families
from tritonclient.utils import InferenceServerException

from tests.api.live_server import Server, serve
from tests.runtime.models import chained_steps, model, value

WIDTH = 256
DEADLINE = 2.0
STEPS = 16  # a host 3x quicker in the chain's moment than in the sizing's still passes it
STEP_IO = (
    f'input [{{name: "X" data_type: TYPE_FP32 dims: [{WIDTH}]}},'
    ' {name: "reps" data_type: TYPE_INT64 dims: [2]}]\n'
    f'output [{{name: "Y" data_type: TYPE_FP32 dims: [{WIDTH}]}}]\n'
)


def _slow_step() -> bytes:
    """Y = the mean over `reps` copies of X through eight MatMuls by a 256 x 256 identity:
    Y equals X, and a run's time follows `reps`."""
    nodes = [helper.make_node("Reshape", ["reps", "flat"], ["repeats"]),
             helper.make_node("Tile", ["X", "repeats"], ["h0"])]  # fmt: skip
    nodes += [helper.make_node("MatMul", [f"h{i}", "w"], [f"h{i + 1}"]) for i in range(8)]
    nodes.append(helper.make_node("ReduceMean", ["h8", "axis"], ["Y"], keepdims=1))
    return model(nodes, [value("X", TensorProto.FLOAT, ["b", WIDTH]),
                         value("reps", TensorProto.INT64, ["b", 2])],
                 [value("Y", TensorProto.FLOAT, ["b", WIDTH])],
                 {"w": np.eye(WIDTH, dtype=np.float32), "flat": np.array([-1], np.int64),
                  "axis": np.array([0], np.int64)}, opset=18).SerializeToString()  # fmt: skip


def _ensemble(steps: int) -> str:
    return (f'name: "chain"\nplatform: "ensemble"\nmax_batch_size: 1\n{STEP_IO}'
            + chained_steps("slow", steps, ("X", "Y"), shared=("reps",)))  # fmt: skip


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    root: Path = tmp_path_factory.mktemp("models")
    (root / "slow" / "1").mkdir(parents=True)
    (root / "slow" / "1" / "model.onnx").write_bytes(_slow_step())
    (root / "slow" / "config.pbtxt").write_text(f'name: "slow"\nmax_batch_size: 1\n{STEP_IO}')
    (root / "chain" / "1").mkdir(parents=True)
    (root / "chain" / "config.pbtxt").write_text(_ensemble(STEPS))
    with serve(model_repository=str(root), max_run_seconds=str(DEADLINE),
               grpc_port="0") as running:  # fmt: skip
        yield running


def _call(client: httpclient.InferenceServerClient, name: str, reps: int) -> np.ndarray:
    x = np.linspace(-1, 1, WIDTH, dtype=np.float32).reshape(1, WIDTH)
    inputs = [httpclient.InferInput("X", [1, WIDTH], "FP32"),
              httpclient.InferInput("reps", [1, 2], "INT64")]  # fmt: skip
    inputs[0].set_data_from_numpy(x)
    inputs[1].set_data_from_numpy(np.array([[reps, 1]], np.int64))
    answer = client.infer(name, inputs).as_numpy("Y")
    # every step gives X back (a float32 mean of many equal rows: a few ulps per step)
    np.testing.assert_allclose(answer, x, rtol=1e-3, atol=1e-4)
    return answer  # type: ignore[no-any-return]


def test_the_ensembles_steps_share_one_deadline(server: Server) -> None:
    client = httpclient.InferenceServerClient(f"127.0.0.1:{server.port}")
    _call(client, "chain", 1)  # small: the ensemble answers, checked against X
    reps, step = 2000, 0.0
    for _ in range(6):  # a step of about a quarter of the deadline, measured as it runs
        began = time.monotonic()
        try:
            _call(client, "slow", reps)
        except InferenceServerException:  # a moment of a busy host: smaller, and again
            reps //= 4
            continue
        step = time.monotonic() - began
        if DEADLINE / 5 <= step <= DEADLINE / 2:
            break
        reps = max(1, int(reps * DEADLINE / 4 / step))
    assert DEADLINE / 5 <= step <= DEADLINE / 2, f"no step size fits this host's pace: {step}"
    before = _failures(server)
    began = time.monotonic()
    with pytest.raises(InferenceServerException) as refused:
        _call(client, "chain", reps)  # sixteen of them do not
    waited = time.monotonic() - began
    assert refused.value.status() == "504", refused.value
    assert waited < STEPS * step, (waited, step)  # stopped at the deadline, not after every step
    _call(client, "chain", 1)  # and the server goes on
    client.close()
    # the ensemble's run that ended at its deadline is Triton's BACKEND reason; so is the step
    # that was running then, for the step model, when the deadline came within it (not
    # between two steps); never OTHER, the client's fault (the sizing above may have had a
    # slow call of its own fail, hence the counts' growth)
    after = _failures(server)
    grown = {key: after[key] - before.get(key, 0) for key in after}
    assert grown[("chain", "BACKEND")] == 1 and grown[("slow", "BACKEND")] <= 1, grown
    assert grown[("chain", "OTHER")] == 0 and grown[("slow", "OTHER")] == 0, grown


def _failures(server: Server) -> dict[tuple[str, str], float]:
    """nv_inference_request_failure by model and reason."""
    text = httpx.get(f"{server.url}/metrics").text
    return {(sample.labels["model"], sample.labels["reason"]): sample.value
            for family in text_string_to_metric_families(text)
            if family.name == "nv_inference_request_failure"
            for sample in family.samples}  # fmt: skip
