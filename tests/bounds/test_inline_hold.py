"""Issue 31, item 2, against a real server: a repository model whose If runs heavy MatMuls on
one branch, after many quick runs of the other, never holds the event loop: health probes sent
all along are answered as fast while the heavy runs go on (before, the inline attempt ran the
heavy branch on the loop until the leash stopped it between two MatMuls: 1.1 s here)."""

import threading
import time
from pathlib import Path

import httpx

from tests.api.live_server import Server, serve
from tests.runtime.test_ort_inline import branches

N, MATMULS = 2048, 2  # each MatMul of 2048 x 2048 floats: tenths of a second


def _infer(client: httpx.Client, server: Server, heavy: bool) -> tuple[float, float]:
    body = {"inputs": [{"name": "c", "shape": [1], "datatype": "BOOL", "data": [heavy]},
                       {"name": "x", "shape": [4], "datatype": "FP32", "data": [1, 2, 3, 4]}]}  # fmt: skip
    start = time.monotonic()
    answer = client.post(f"{server.url}/v2/models/branches/infer", json=body)
    assert answer.status_code == 200, answer.text
    return answer.json()["outputs"][0]["data"][0], time.monotonic() - start


class Probes:
    """GET /v2/health/live without pause on a thread of its own; the slowest answer."""

    def __init__(self, server: Server) -> None:
        self.url, self.slowest, self.count = f"{server.url}/v2/health/live", 0.0, 0
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._probe)

    def __enter__(self) -> "Probes":
        self.thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.done.set()
        self.thread.join(30)

    def _probe(self) -> None:
        with httpx.Client(timeout=30) as client:
            while not self.done.is_set():
                start = time.monotonic()
                assert client.get(self.url).status_code == 200
                self.slowest = max(self.slowest, time.monotonic() - start)
                self.count += 1
                time.sleep(0.002)


SCENES = 3
"""How often the probes' scene is set up before the test fails: on a busy host (a clean-clone
run beside the suite's other worker) one probe once waited 0.32 s against a baseline of 0.14
s. A loop held by the heavy branch holds every scene's probes for most of a heavy run."""


def test_a_heavy_branch_never_holds_the_loop(tmp_path: Path) -> None:
    (tmp_path / "branches" / "1").mkdir(parents=True)
    model = branches(N, MATMULS).SerializeToString()
    (tmp_path / "branches" / "1" / "model.onnx").write_bytes(model)
    (tmp_path / "branches" / "config.pbtxt").write_text("max_batch_size: 0")
    # one kept-alive client: a new one per call made its TLS context and connection each time,
    # most of the 300 quick runs' time
    scenes = []
    with serve(model_repository=str(tmp_path)) as server, httpx.Client(timeout=120) as client:
        _infer(client, server, True)  # on a thread, as a first call is: the estimate is made
        for _ in range(SCENES):
            with Probes(server) as quiet:  # the baseline: the probes alone
                time.sleep(2)
            for _ in range(300):  # enough quick runs in a row (each under 1 ms) to open a gate
                assert _infer(client, server, False)[0] == 10.0
            with Probes(server) as busy:
                heavy = [_infer(client, server, True) for _ in range(2)]
            expected = N * 10.0 * 0.5 ** (MATMULS + 1)  # by hand: (0.5 I * 10) @ 0.5 I @ 0.5 I
            assert all(value == expected for value, _took in heavy), heavy
            assert busy.count > 10 and quiet.count > 10
            shortest = min(took for _value, took in heavy)
            scenes.append((busy.slowest, quiet.slowest, shortest))
            # inline, a probe sent during a heavy run would wait for most of it
            if busy.slowest < max(0.25, 2 * quiet.slowest) and busy.slowest < shortest / 2:
                return
    raise AssertionError(f"(slowest probe busy, quiet, shortest heavy run) in s: {scenes}")
