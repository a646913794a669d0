"""Issue 31, item 2, against a live server: repository models whose run's size onnx's shape
inference cannot follow (tests/runtime/unfollowed.py), each asked to fill 256 MiB of floats,
under a 64 MiB budget. Where the estimate now follows (FOLDED) the run is refused (413) before
it runs. Where it cannot (MEASURED: an If branch, a Loop's scan outputs) the operator's model
is trusted: the first request is answered, and the server's RSS read right after the answer is
back near idle (the heap trimmed after the run: the Loop's 1 MiB rows stayed resident without
it). Its measured peak is then the estimate for those inputs: the same request again claims it
before the run, more than the budget, and is refused (413) without running. A small request to
each still answers."""

from pathlib import Path

import httpx
import pytest

from tests.api.live_server import serve
from tests.api.resilience import MiB
from tests.runtime.unfollowed import FOLDED, MEASURED, ROW, UNFOLLOWED, inputs

BUDGET = 64 * MiB
FLOATS = 256 * ROW  # 256 MiB of floats
MARGIN = 48 * MiB  # RSS right after the answer, over idle: the answer's own and the allocator's


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("repository")
    for name, built in UNFOLLOWED.items():
        (root / f"{name}.onnx").write_bytes(built().SerializeToString())
    return root


def test_sizes_the_estimate_cannot_follow_are_measured_and_given_back(repository: Path) -> None:
    with (
        serve(model_repository=str(repository), memory_budget_bytes=str(BUDGET)) as server,
        httpx.Client(timeout=120) as client,
    ):

        def run(name: str, n: int) -> httpx.Response:
            return client.post(f"{server.url}/v1/models/{name}/run",
                               json={"inputs": inputs(name, n)})  # fmt: skip

        for name in UNFOLLOWED:  # each session made, each path warm
            assert run(name, 2 * ROW).json()["outputs"]["y"]["data"] == [2 * ROW]
        idle = server.rss_bytes()
        peak_is_now = Path(f"/proc/{server.process.pid}/clear_refs").write_text
        for name in FOLDED:
            peak_is_now("5")  # VmHWM := VmRSS
            refused = run(name, FLOATS)
            assert refused.status_code == 413, refused.text
            assert "OPSERVE_MAX_GRAPH_BYTES" in refused.json()["detail"]
            assert server.rss_bytes("VmHWM") - idle < MARGIN  # refused before it ran
            assert run(name, 2 * ROW).status_code == 200
        for name in MEASURED:
            answer = run(name, FLOATS)
            after = server.rss_bytes()
            peak = server.rss_bytes("VmHWM")  # since the run began (the server reset it)
            assert answer.status_code == 200, answer.text
            assert answer.json()["outputs"]["y"]["data"] == [FLOATS]
            assert peak - idle > FLOATS * 4 * 0.9, (name, (peak - idle) // MiB)  # it did hold it
            assert after - idle < MARGIN, (name, (after - idle) // MiB)
            peak_is_now("5")
            again = run(name, FLOATS)
            assert again.status_code == 413, again.text
            detail = again.json()["detail"]  # "the request would hold N bytes of memory, over..."
            assert "OPSERVE_MEMORY_BUDGET_BYTES" in detail
            claimed = int(detail.split(" bytes")[0].split()[-1].replace(",", ""))
            assert claimed > FLOATS * 4 * 0.9, detail  # the measured peak (up to the graph limit)
            assert server.rss_bytes("VmHWM") - idle < MARGIN  # refused before it ran
            assert run(name, 2 * ROW).status_code == 200
