"""Issue 27, item 2, against a live server: runs of posted models on the onnxruntime engine
(in the isolated workers since issue 31) are held to the exact engine's bounds. A long run
stops at OPSERVE_MAX_RUN_SECONDS (its worker killed) and the server's memory stays; a run
whose client left stops; a run whose estimated peak passes OPSERVE_MAX_GRAPH_BYTES is refused
before it runs; N large runs at once stay within the memory budget while a small request
still answers within a second; a division that crashes onnxruntime fails only its run, and
with OPSERVE_CLIENT_MODELS_IN_PROCESS it never reaches onnxruntime (onnxruntime/crashes.py)."""

import contextlib
import threading
import time

import httpx
import pytest
from onnx import ModelProto, TensorProto, helper

from tests.api.live_server import serve
from tests.api.resilience import MiB, watching
from tests.bounds.models import back_near_idle, post_run, posted
from tests.conformance.test_ort_crashes import divide
from tests.runtime.models import I64, F, model, value

MARGIN = 160 * MiB  # the process's own growth (onnxruntime's import, its thread pools)


def sines(nodes: int) -> ModelProto:
    """ConstantOfShape(n) floats, then `nodes` Sin nodes over them: a long run on onnxruntime
    whose size comes in as an input (nothing to fold while the session is made)."""
    steps = [helper.make_node("ConstantOfShape", ["n"], ["t0"], name="fill")]
    steps += [helper.make_node("Sin", [f"t{i}"], [f"t{i + 1}"], name=f"sin{i}")
              for i in range(nodes)]  # fmt: skip
    steps.append(helper.make_node("ReduceMax", [f"t{nodes}"], ["m"], name="max", keepdims=0))
    return model(steps, [value("n", I64, [1])], [value("m", F, [])])


def _body(nodes: int, elements: int) -> bytes:
    return posted(sines(nodes), {"n": {"dtype": "int64", "data": [elements]}},
                  engine="onnxruntime")  # fmt: skip


@pytest.mark.slow  # the deadline waited out
def test_a_long_run_stops_at_the_deadline_and_gives_its_memory_back() -> None:
    with serve(max_run_seconds="5") as server:
        status, body, _took = post_run(server, _body(3000, 4))  # the session, made once
        assert status == 200 and body["nodes"][0]["ran_on"] == "onnxruntime", body
        idle = server.rss_bytes()
        with watching(server) as watch:
            status, body, took = post_run(server, _body(3000, 8 * MiB))
        assert status == 504, body
        assert "OPSERVE_MAX_RUN_SECONDS" in body["detail"] and "onnxruntime" in body["detail"]
        assert took < 5 + 5, took  # within the deadline plus the worker's kill
        watch.answered_within(1.0)
        assert back_near_idle(server, idle, MARGIN) < idle + MARGIN
        status, body, took = post_run(server, _body(3000, 4))  # a new worker opens it again
        assert status == 200, (status, body)


def test_a_run_whose_client_left_is_stopped() -> None:
    with serve(max_run_seconds="60", kernel_threads="1") as server:
        status, _answer, cold = post_run(server, _body(3000, 4))  # a worker started, opened
        assert status == 200
        with contextlib.suppress(httpx.TimeoutException):  # the client leaves after 1 s
            post_run(server, _body(3000, 8 * MiB), timeout=1)
        time.sleep(0.5)
        status, _answer, took = post_run(server, _body(3000, 4))
        # the one kernel thread was freed (held, this would wait for the 60 s deadline); the
        # worker was killed, so the model is opened again, as cold as the first call
        assert status == 200 and took < 2 * cold + 3, (took, cold)


def test_a_run_past_the_graph_limit_is_refused_before_it_runs() -> None:
    with serve(max_graph_bytes=str(64 * MiB)) as server:
        assert post_run(server, _body(2, 4))[0] == 200
        idle = server.rss_bytes()
        status, body, took = post_run(server, _body(2, 32 * MiB))  # 128 MiB per value
        assert status == 413, body
        assert "OPSERVE_MAX_GRAPH_BYTES" in body["detail"] and "onnxruntime" in body["detail"]
        assert took < 1 and server.rss_bytes() < idle + 32 * MiB


def test_large_runs_at_once_stay_within_the_budget() -> None:
    """Six runs of 2 x 16 MiB live, on six kernel threads at once, under a 256 MiB budget:
    they take turns on the two isolated workers, and the server's memory holds."""
    budget = 256 * MiB
    with serve(memory_budget_bytes=str(budget), kernel_threads="6", max_run_seconds="120",
               memory_wait_seconds="30") as server:  # fmt: skip
        assert post_run(server, _body(20, 4))[0] == 200
        idle = server.rss_bytes()
        results: list[int] = []

        def one() -> None:
            results.append(post_run(server, _body(20, 4 * MiB), timeout=180)[0])

        with watching(server) as watch:
            threads = [threading.Thread(target=one) for _ in range(6)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(120)
        assert results == [200] * 6, results
        watch.answered_within(1.0)
        assert watch.peak_rss < idle + budget + MARGIN, (watch.peak_rss - idle) // MiB


def test_a_division_that_crashes_onnxruntime_fails_only_its_run() -> None:
    """int32 -2**31 / -1 kills a process running it on onnxruntime (SIGFPE): posted for
    onnxruntime, it ends its worker and answers 500 naming the signal; kept in the server's
    process (OPSERVE_CLIENT_MODELS_IN_PROCESS), the crash screen refuses it with the reason;
    on the exact engine it answers."""
    inputs = {"a": {"dtype": "int32", "data": [-(2**31), 7]},
              "b": {"dtype": "int32", "data": [-1, 2]}}  # fmt: skip
    hostile = posted(divide(TensorProto.INT32), inputs, engine="onnxruntime")
    with serve(reference_fallback="true") as server:
        status, body, _took = post_run(server, hostile)
        assert status == 500 and "ended its worker process: SIGFPE" in body["detail"], body
        status, body, _took = post_run(server, posted(divide(TensorProto.INT32), inputs))
        assert status == 200 and body["nodes"][0]["ran_on"] == "reference", body
        assert body["outputs"]["y"]["data"][1] == 3
        assert httpx.get(f"{server.url}/v2/health/live", timeout=5).status_code == 200
    with serve(client_models_in_process="true") as server:
        status, body, _took = post_run(server, hostile)
        assert status == 422 and "SIGFPE" in body["detail"], body
        assert httpx.get(f"{server.url}/v2/health/live", timeout=5).status_code == 200
