"""When a run on onnxruntime takes the event loop (service/runtime/ort_inline.py): a quick
model's small run, once its first runs on threads were all quick; one slow run sends it back
to threads; a run past the leash is stopped and starts again on a thread, and the model stays
off the loop; a run whose estimated peak is large never runs inline. A run inline is one that
completes under the inline context (an inline attempt that may not raises RunOffLoop)."""

import time
from collections.abc import Iterator

import numpy as np
import pytest
from fastapi.testclient import TestClient
from onnx import TensorProto, helper

from service.codecs.limits import SMALL_BYTES
from service.kernels.context import KernelContext, RunOffLoop
from service.main import create_app
from service.runtime.engines import load_ort
from service.runtime.ort_inline import QUICK_RUN_SECONDS, QUICK_RUNS
from service.runtime.ort_model import OrtModel
from service.settings import Settings

from .models import I64, F, model, value

INLINE = KernelContext(1 << 30, SMALL_BYTES)  # as core/execution.py's inline attempts
Y0 = np.arange(64, dtype=np.float32).reshape(8, 8)
TWICE = (2 * np.eye(8)).astype(np.float32)


def _loop(w: np.ndarray = TWICE) -> bytes:
    """y = y0 @ w, `m` times over (w = 2I: y = 2**m * y0): its time grows with the value of
    `m`, its memory does not (one 8x8 at a time)."""
    body = helper.make_graph(
        [helper.make_node("MatMul", ["y_in", "w"], ["y_out"]),
         helper.make_node("Identity", ["cond_in"], ["cond_out"])],
        "body",
        [value("i", I64, []), value("cond_in", TensorProto.BOOL, []), value("y_in", F, [8, 8])],
        [value("cond_out", TensorProto.BOOL, []), value("y_out", F, [8, 8])],
    )  # fmt: skip
    loop = helper.make_node("Loop", ["m", "", "y0"], ["y"], body=body)
    return model([loop], [value("m", I64, []), value("y0", F, [8, 8])], [value("y", F, [8, 8])],
                 {"w": w}).SerializeToString()  # fmt: skip


def _inputs(m: int) -> dict[str, np.ndarray]:
    return {"m": np.array(m, np.int64), "y0": Y0}


def _warmed(data: bytes, inputs: dict[str, np.ndarray]) -> OrtModel:
    """The model after QUICK_RUNS runs on threads (each inline attempt before them refused)."""
    loaded = load_ort(data, Settings())
    for _ in range(QUICK_RUNS):
        with pytest.raises(RunOffLoop):
            loaded.run(inputs, ctx=INLINE)
        loaded.run(inputs)
    return loaded


def test_a_quick_model_runs_inline_once_its_first_runs_were_quick() -> None:
    loaded = _warmed(_loop(), _inputs(3))
    answer = loaded.run(_inputs(3), ctx=INLINE).outputs["y"]
    np.testing.assert_array_equal(answer, 8 * Y0)


def test_one_slow_run_sends_the_model_back_to_threads() -> None:
    loaded = _warmed(_loop(), _inputs(1))
    started = time.monotonic()
    loaded.run(_inputs(200_000))  # on a thread: longer than a quick run
    assert time.monotonic() - started > QUICK_RUN_SECONDS
    with pytest.raises(RunOffLoop):
        loaded.run(_inputs(1), ctx=INLINE)
    _warmed_again = [loaded.run(_inputs(1)) for _ in range(QUICK_RUNS)]
    assert len(_warmed_again) == QUICK_RUNS
    np.testing.assert_array_equal(loaded.run(_inputs(1), ctx=INLINE).outputs["y"], 2 * Y0)


def test_a_run_past_the_leash_leaves_the_loop_for_good() -> None:
    """10 million turns would take about 15 s; inline, the leash stops them within 20-40 ms
    (the stopper's poll), and the model never runs inline again."""
    loaded = _warmed(_loop(), _inputs(1))
    started = time.monotonic()
    with pytest.raises(RunOffLoop):
        loaded.run(_inputs(10_000_000), ctx=INLINE)
    assert time.monotonic() - started < 1.0
    for _ in range(2 * QUICK_RUNS):
        loaded.run(_inputs(1))
    with pytest.raises(RunOffLoop):
        loaded.run(_inputs(1), ctx=INLINE)


def test_a_run_with_a_large_estimated_peak_stays_on_threads() -> None:
    """A Tile of a small input to 1.25 MiB: over the inline allowance at its peak, so it stays
    on threads however quick its runs are."""
    tile = model([helper.make_node("Tile", ["x", "r"], ["y"])], [value("x", F, [8])],
                 [value("y", F, [8 * 40960])],
                 {"r": np.array([40960], np.int64)}).SerializeToString()  # fmt: skip
    small = {"x": np.ones(8, np.float32)}
    loaded = load_ort(tile, Settings())
    for _ in range(QUICK_RUNS):
        loaded.gate.ran(0.0)  # quick, whatever this host's speed
    assert loaded.gate.open
    with pytest.raises(RunOffLoop):
        loaded.run(small, ctx=INLINE)
    np.testing.assert_array_equal(loaded.run(small).outputs["y"], np.ones(8 * 40960))


@pytest.fixture(scope="module")
def loop_client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestClient]:
    root = tmp_path_factory.mktemp("inline")
    (root / "loop" / "1").mkdir(parents=True)
    (root / "loop" / "1" / "model.onnx").write_bytes(_loop(np.eye(8, dtype=np.float32)))
    (root / "loop" / "config.pbtxt").write_text("max_batch_size: 0")
    settings = Settings(model_repository=root, access_log=False)
    with TestClient(create_app(settings), raise_server_exceptions=False) as client:
        yield client


def _infer(client: TestClient, m: int) -> list[float]:
    body = {"inputs": [{"name": "m", "shape": [1], "datatype": "INT64", "data": [m]},
                       {"name": "y0", "shape": [8, 8], "datatype": "FP32",
                        "data": Y0.reshape(-1).tolist()}]}  # fmt: skip
    answer = client.post("/v2/models/loop/infer", json=body)
    assert answer.status_code == 200, answer.text
    return answer.json()["outputs"][0]["data"]


def test_through_the_door_answers_are_the_same_inline_on_threads_and_past_the_leash(
    loop_client: TestClient,
) -> None:
    """Quick calls (on threads, then inline), one past the leash (answered from a thread),
    and quick calls after it: each answer is y0 (w is the identity here), and the statistics
    count them all."""
    expected = Y0.reshape(-1).tolist()
    assert all(_infer(loop_client, 2) == expected for _ in range(2 * QUICK_RUNS))
    started = time.monotonic()
    assert _infer(loop_client, 3_000_000) == expected  # about 4 s: well past the leash
    assert time.monotonic() - started > 0.5
    assert all(_infer(loop_client, 2) == expected for _ in range(4))
    stats = loop_client.get("/v2/models/loop/stats").json()["model_stats"][0]
    assert stats["inference_stats"]["success"]["count"] == 2 * QUICK_RUNS + 5
