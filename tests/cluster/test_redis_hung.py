"""A Redis that hangs (its process stopped: SIGSTOP), not one that refuses connections: the
kernel still accepts them, and every read waits for the store's timeout. Whatever needs Redis
must answer 503 within about that timeout, however many requests wait for it at once; what
does not need Redis answers at once; and once Redis runs again the sequence continues from
what was committed."""

import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from tests.cluster.redis_server import RedisServer
from tests.cluster.repository_cluster import example_repository, replica
from tests.cluster.sequence_models import sequence_repository
from tests.grpc.conftest import Served, serve_grpc

ACCUMULATOR = "simple_string_dyna_sequence"
TIMEOUT = 0.5  # OPSERVE_CLUSTER_TIMEOUT_SECONDS


@pytest.fixture
def served(redis: RedisServer, tmp_path: Path) -> Iterator[Served]:
    root = sequence_repository(tmp_path / "models")
    settings = {"model_repository": str(root), "reference_fallback": "true",
                "cluster_redis_url": redis.url, "cluster_heartbeat_seconds": "0.2",
                "cluster_timeout_seconds": str(TIMEOUT), "access_log": "false",
                "cluster_sequence_lease_seconds": "1"}  # fmt: skip
    with serve_grpc(**settings) as server:
        yield server


def _body(value: int, seq_id: str, **flags: bool) -> dict[str, object]:
    return {"inputs": [{"name": "INPUT", "shape": [1, 1], "datatype": "INT32", "data": [value]}],
            "parameters": {"sequence_id": seq_id, **flags}}  # fmt: skip


def _infer(served: Served, body: dict[str, object]) -> httpx.Response:
    return httpx.post(f"{served.http.url}/v2/models/{ACCUMULATOR}/infer", json=body, timeout=30)


def _all_at_once(redis: RedisServer, calls: list[Callable[[], httpx.Response]]) -> list[float]:
    """Run `calls` at once with Redis stopped (SIGSTOP); each must answer 503 with the store's
    text and Retry-After: how long each took."""
    assert redis.process is not None
    answers: list[tuple[float, httpx.Response]] = []

    def timed(call: Callable[[], httpx.Response]) -> None:
        began = time.monotonic()
        answer = call()
        answers.append((time.monotonic() - began, answer))

    os.kill(redis.process.pid, signal.SIGSTOP)
    try:
        threads = [threading.Thread(target=timed, args=(call,)) for call in calls]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        os.kill(redis.process.pid, signal.SIGCONT)
    for _took, answer in answers:
        assert answer.status_code == 503, answer.text
        assert "cluster store (Redis)" in answer.json()["error"]
        assert answer.headers["retry-after"] == "1"
    return sorted(took for took, _ in answers)


def test_steps_waiting_for_a_hung_redis_answer_within_its_timeout(
    redis: RedisServer, served: Served
) -> None:
    assert _infer(served, _body(4, "4242", sequence_start=True)).status_code == 200
    took = _all_at_once(redis, [lambda: _infer(served, _body(1, "4242"))] * 8)
    # one timeout for the step at the head, one more at most for those behind it in the
    # replica (not one per step ahead: 8 steps took 0.5, 1.0 ... 4.0 s before)
    assert took[-1] < 4 * TIMEOUT + 0.5, took
    # nothing was committed meanwhile: the sequence goes on from 4
    deadline = time.monotonic() + 10
    while (answer := _infer(served, _body(1, "4242", sequence_end=True))).status_code != 200:
        assert time.monotonic() < deadline, answer.text
        time.sleep(0.1)
    assert answer.json()["outputs"][0]["data"] == [5 + 4242]  # the accumulator adds its id at END


def test_control_calls_waiting_for_a_hung_redis_answer_within_its_timeout(
    redis: RedisServer, tmp_path: Path
) -> None:
    root = example_repository(tmp_path)
    with replica(redis.url, root, cluster_timeout_seconds=str(TIMEOUT)) as server:
        calls = [lambda n=name: httpx.post(f"{server.url}/v2/repository/models/{n}/load",
                                           json={}, timeout=30)
                 for name in ["simple", "custom_identity_int32"] * 4]  # fmt: skip
        took = _all_at_once(redis, calls)
        # 8 calls took 0.6, 1.1 ... 4.2 s before: each waited for the one ahead's timeout
        assert took[-1] < 4 * TIMEOUT + 0.5, took
        deadline = time.monotonic() + 10  # and control works again once Redis runs
        while httpx.post(f"{server.url}/v2/repository/models/simple/load").status_code != 200:
            assert time.monotonic() < deadline
            time.sleep(0.1)
