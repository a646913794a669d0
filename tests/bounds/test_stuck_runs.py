"""Issue 31, item 2: repository models on onnxruntime whose runs never stop (RunOptions.terminate
is never looked at), against a real server: each answers 504 at its deadline all the same,
its thread is counted stuck (opserve_stuck_runs), a normal request is answered at once while a
kernel thread is free, once stuck threads hold every kernel slot the liveness routes (HTTP,
gRPC's ServerLive) fail and a run is refused at once, and SIGTERM still ends the process."""

import contextlib
import json
import re
import signal
import subprocess
import threading
import time
from pathlib import Path

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from onnx import ModelProto, TensorProto, helper

from tests.api.live_server import Server, free_port, serve
from tests.runtime.models import I64, F, model, value

DEADLINE = 2.0
GRACE = 3
THREADS = 2


def empty_loop() -> ModelProto:
    """A Loop of `m` turns (m: the client's) whose body has no node: nothing between kernels
    for onnxruntime to stop at, so 10**15 turns run on for good."""
    body = helper.make_graph(
        [], "body",
        [value("i", I64, []), value("cond_in", TensorProto.BOOL, []), value("x_in", F, [1])],
        [value("cond_in", TensorProto.BOOL, []), value("x_in", F, [1])],
    )  # fmt: skip
    steps = [helper.make_node("Squeeze", ["m"], ["trips"]),
             helper.make_node("Loop", ["trips", "", "x"], ["y"], body=body)]  # fmt: skip
    return model(steps, [value("m", I64, [1]), value("x", F, [1])], [value("y", F, [1])])


def conv() -> ModelProto:
    """A Conv whose kernel the client sends: one with a zero-size dimension spins for good."""
    node = helper.make_node("Conv", ["x", "w"], ["y"])
    return model([node], [value("x", F, [1, 1, 4, 4]), value("w", F, [1, 1, None, None])],
                 [value("y", F, [1, 1, None, None])])  # fmt: skip


def repository(root: Path) -> Path:
    for name, built in (("loop", empty_loop()), ("conv", conv())):
        (root / name / "1").mkdir(parents=True)
        (root / name / "1" / "model.onnx").write_bytes(built.SerializeToString())
        (root / name / "config.pbtxt").write_text("max_batch_size: 0")
    return root


def tensor(name: str, array: np.ndarray) -> dict:
    datatype = {"int64": "INT64", "float32": "FP32"}[str(array.dtype)]
    return {"name": name, "shape": list(array.shape), "datatype": datatype,
            "data": array.reshape(-1).tolist()}  # fmt: skip


def infer(server: Server, name: str, **inputs: np.ndarray) -> tuple[int, dict, float]:
    body = {"inputs": [tensor(k, v) for k, v in inputs.items()]}
    start = time.monotonic()
    answer = httpx.post(f"{server.url}/v2/models/{name}/infer", json=body, timeout=60)
    return answer.status_code, answer.json(), time.monotonic() - start


def loop_of(trips: int) -> tuple[str, dict[str, np.ndarray]]:
    return "loop", {"m": np.array([trips], np.int64), "x": np.array([1.5], np.float32)}


def conv_of(kernel: tuple[int, int]) -> tuple[str, dict[str, np.ndarray]]:
    x = np.arange(16, dtype=np.float32).reshape(1, 1, 4, 4)
    return "conv", {"x": x, "w": np.ones((1, 1, *kernel), np.float32)}


def stuck_runs(server: Server) -> int:
    text = httpx.get(f"{server.url}/metrics", timeout=10).text
    found = re.search(r"^opserve_stuck_runs (\S+)$", text, re.M)
    assert found, text[-2000:]
    return int(float(found.group(1)))


def grpc_live(port: int) -> bool:
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{port}")
    try:
        return bool(client.is_server_live())
    finally:
        client.close()


def normal_answers(server: Server) -> float:
    """A normal request to each model: the right answers (by hand); the longest time."""
    status, body, took_loop = infer(server, "loop", **loop_of(3)[1])
    assert status == 200 and body["outputs"][0]["data"] == [1.5], body
    status, body, took_conv = infer(server, "conv", **conv_of((2, 2))[1])
    assert status == 200, body
    x = np.arange(16, dtype=np.float32).reshape(4, 4)
    by_hand = [x[i : i + 2, j : j + 2].sum() for i in range(3) for j in range(3)]
    assert body["outputs"][0]["data"] == by_hand, body
    return max(took_loop, took_conv)


@pytest.mark.slow  # every slot's deadline waited out
@pytest.mark.parametrize("first", ["loop", "conv"])
def test_runs_that_never_stop_answer_504_and_every_slot_stuck_fails_liveness(
    tmp_path: Path, first: str
) -> None:
    hostile = {"loop": loop_of(10**15), "conv": conv_of((0, 2))}
    second = "conv" if first == "loop" else "loop"
    grpc_port = free_port()
    with serve(model_repository=str(repository(tmp_path)), kernel_threads=str(THREADS),
               max_run_seconds=str(DEADLINE), graceful_shutdown_seconds=str(GRACE),
               grpc_port=str(grpc_port)) as server:  # fmt: skip
        baseline = normal_answers(server)
        assert stuck_runs(server) == 0 and grpc_live(grpc_port)
        for count, name in enumerate((first, second), start=1):
            status, body, took = infer(server, name, **hostile[name][1])
            assert status == 504, body
            assert "did not stop" in body["error"] and "OPSERVE_MAX_RUN_SECONDS" in body["error"]
            assert DEADLINE <= took < DEADLINE + 5, took
            assert stuck_runs(server) == count
            if count < THREADS:  # a thread is free: answered at once, live
                assert normal_answers(server) < max(1.0, 10 * baseline)
                assert httpx.get(f"{server.url}/v2/health/live").status_code == 200
                assert grpc_live(grpc_port)
        live = httpx.get(f"{server.url}/v2/health/live", timeout=10)
        assert live.status_code == 400 and live.json()["live"] is False, live.text
        assert "OPSERVE_KERNEL_THREADS" in live.json()["error"]
        assert not grpc_live(grpc_port)
        assert httpx.get(f"{server.url}/v2/health/ready").status_code == 400
        status, body, took = infer(server, "loop", **loop_of(3)[1])  # no thread to run on
        assert status == 503 and "OPSERVE_KERNEL_THREADS" in body["error"] and took < 1, body
        _ends_on_sigterm(server)


def _ends_on_sigterm(server: Server) -> None:
    """Within the graceful period plus a few seconds, with threads still spinning in it."""
    start = time.monotonic()
    server.process.send_signal(signal.SIGTERM)
    try:
        code = server.process.wait(timeout=GRACE + 10)
    except subprocess.TimeoutExpired:
        pytest.fail("SIGTERM did not end the server with stuck threads")
    assert time.monotonic() - start < GRACE + 4
    assert code == 0, code


def test_a_client_leaving_a_run_that_never_stops_leaves_it_counted(tmp_path: Path) -> None:
    """The request gone before its deadline: its thread is left behind, stuck once it had its
    while to stop, and SIGTERM with that thread in flight still ends the process."""
    with serve(model_repository=str(repository(tmp_path)), kernel_threads=str(THREADS),
               max_run_seconds="60", graceful_shutdown_seconds=str(GRACE)) as server:  # fmt: skip
        body = {"inputs": [tensor(k, v) for k, v in loop_of(10**15)[1].items()]}
        with pytest.raises(httpx.TimeoutException):
            httpx.post(f"{server.url}/v2/models/loop/infer", json=body, timeout=1)
        deadline = time.monotonic() + 5
        while stuck_runs(server) != 1 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert stuck_runs(server) == 1
        assert normal_answers(server) < 2
        metrics = httpx.get(f"{server.url}/metrics").text
        assert f"opserve_kernel_threads {THREADS}.0" in metrics
        _ends_on_sigterm(server)


@pytest.mark.slow  # a stuck run, then shutdown's graceful period waited out
def test_sigterm_during_a_run_that_never_stops(tmp_path: Path) -> None:
    """SIGTERM while the request still waits (its deadline far off): uvicorn's graceful
    period ends it, and the process after it, though its thread runs on."""
    with serve(model_repository=str(repository(tmp_path)), kernel_threads=str(THREADS),
               max_run_seconds="60", graceful_shutdown_seconds=str(GRACE)) as server:  # fmt: skip
        body = json.dumps({"inputs": [tensor(k, v) for k, v in conv_of((0, 2))[1].items()]})
        client = httpx.Client(timeout=30)
        try:
            sent = threading.Thread(target=lambda: _quietly(client, server, body))
            sent.start()
            time.sleep(1)
            _ends_on_sigterm(server)
            sent.join(30)
        finally:
            client.close()


def _quietly(client: httpx.Client, server: Server, body: str) -> None:
    with contextlib.suppress(httpx.HTTPError):  # the server ends under it
        client.post(f"{server.url}/v2/models/conv/infer", content=body,
                    headers={"content-type": "application/json"})  # fmt: skip
