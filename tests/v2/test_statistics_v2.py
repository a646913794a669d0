"""Triton's statistics extension after a known mix of calls: counts of successes, failures,
executions and inferences (batched requests count their batch), every phase counted, the
batch sizes seen, and Triton's refusals for what is not available; on onnxruntime,
compute_infer is the session's run alone."""

import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest

from service.main import create_app
from service.settings import Settings
from tests.bounds.test_onnxruntime_bounds import sines
from tests.triton_examples import write_repository

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from starlette.testclient import TestClient

TILE = {"inputs": [{"name": "input", "shape": [2], "datatype": "INT64", "data": [1, 2]},
                   {"name": "repeats", "shape": [1], "datatype": "INT64", "data": [2]}]}  # fmt: skip
BAD_TILE = {"inputs": [{"name": "input", "shape": [2], "datatype": "INT64", "data": [1, 2]},
                       {"name": "repeats", "shape": [1], "datatype": "INT64", "data": [-1]}]}  # fmt: skip


def _simple(batch: int) -> dict:
    data = list(range(16)) * batch
    return {"inputs": [{"name": n, "shape": [batch, 16], "datatype": "INT32", "data": data}
                       for n in ("INPUT0", "INPUT1")]}  # fmt: skip


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestClient]:
    root: Path = write_repository(tmp_path_factory.mktemp("models"), ["simple"])
    (root / "sines" / "1").mkdir(parents=True)
    (root / "sines" / "1" / "model.onnx").write_bytes(sines(2000).SerializeToString())
    (root / "sines" / "config.pbtxt").write_text("max_batch_size: 0")
    settings = Settings(model_repository=root, reference_fallback=True, access_log=False)
    with TestClient(create_app(settings), raise_server_exceptions=False) as test_client:
        yield test_client


def test_counts_after_a_known_mix(client: TestClient) -> None:
    for _ in range(5):
        assert client.post("/v2/models/Tile/versions/13/infer", json=TILE).status_code == 200
    for _ in range(3):
        assert client.post("/v2/models/Tile/versions/13/infer", json=BAD_TILE).status_code == 400
    for _ in range(2):  # the same operator over v1 counts for its V2 model too
        body = {"inputs": {"input": {"dtype": "int64", "data": [1]},
                           "repeats": {"dtype": "int64", "data": [3]}}}  # fmt: skip
        assert client.post("/v1/ops/Tile/13", json=body).status_code == 200
    for batch in (1, 2, 2, 4):
        assert client.post("/v2/models/simple/infer", json=_simple(batch)).status_code == 200
    (tile,) = client.get("/v2/models/Tile/versions/13/stats").json()["model_stats"]
    assert (tile["name"], tile["version"]) == ("Tile", "13")
    assert (tile["inference_count"], tile["execution_count"]) == (7, 7)
    stats = tile["inference_stats"]
    assert stats["success"]["count"] == 7 and stats["fail"]["count"] == 3
    for phase in ("queue", "compute_input", "compute_infer", "compute_output"):
        assert stats[phase]["count"] == 7 and stats[phase]["ns"] >= 0
    assert stats["success"]["ns"] >= stats["compute_infer"]["ns"] > 0
    assert stats["cache_hit"] == stats["cache_miss"] == {"count": 0, "ns": 0}
    (simple,) = client.get("/v2/models/simple/stats").json()["model_stats"]
    assert (simple["inference_count"], simple["execution_count"]) == (9, 4)  # 1+2+2+4 items
    assert {b["batch_size"]: b["compute_infer"]["count"] for b in simple["batch_stats"]} == {
        1: 1, 2: 2, 4: 1}  # fmt: skip
    assert simple["last_inference"] > 1_700_000_000_000  # milliseconds since the epoch
    everything = client.get("/v2/models/stats").json()["model_stats"]
    names = {(s["name"], s["version"]) for s in everything}
    assert ("simple", "1") in names and ("Tile", "13") in names and ("Tile", "6") in names


@pytest.mark.parametrize(("path", "words"), [
    ("/v2/models/nope/stats", "requested model 'nope' is not available"),
    ("/v2/models/simple/versions/9/stats", "requested model 'simple' is not available"),
])  # fmt: skip
def test_refusals(client: TestClient, path: str, words: str) -> None:
    answer = client.get(path)
    assert answer.status_code == 400 and answer.json()["error"] == words


def test_compute_infer_on_onnxruntime_is_the_session_run(client: TestClient) -> None:
    """2,000 Sin nodes over ConstantOfShape(n): each new n makes the memory estimate infer the
    graph's shapes again (about 15-30 ms, the service's work: compute_input), while onnxruntime
    runs the graph in about 1 ms (compute_infer).

    Each call's phases are read apart and the median call judged: in a clean-clone run, the
    sum of eight calls' compute_infer was once 373 ms, one pause inside one run on a busy
    host (a full collection over the test process's large heap, which the server's frozen
    start-up does not have, is the likely cause), and a sum carries such a pause."""

    def phases() -> dict[str, int]:
        (sines_stats,) = client.get("/v2/models/sines/stats").json()["model_stats"]
        stats = sines_stats["inference_stats"]
        return {phase: stats[phase]["ns"] for phase in ("success", "compute_input",
                                                        "compute_infer", "compute_output")}  # fmt: skip

    calls = []
    before = phases()
    for n in range(1, 10):
        body = {"inputs": [{"name": "n", "shape": [1], "datatype": "INT64", "data": [n]}]}
        assert client.post("/v2/models/sines/infer", json=body).status_code == 200
        after = phases()
        calls.append({phase: after[phase] - before[phase] for phase in after})
        before = after
    for call in calls:
        assert call["compute_infer"] > 0 and call["compute_input"] > 0, call
        assert (
            call["compute_input"] + call["compute_infer"] + call["compute_output"]
            <= call["success"]
        )
    ratios = sorted(call["compute_input"] / call["compute_infer"] for call in calls)
    assert ratios[len(ratios) // 2] > 4, calls
    assert client.get("/v2/models/sines/config").json()["parameters"]["engine"] == {
        "string_value": "onnxruntime"}  # fmt: skip
