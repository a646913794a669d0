"""Exactly-once sequence steps in cluster mode (issue 32, item 1): two real replicas reach a real
Redis through the tests' own proxy (drop_proxy.py), which breaks a connection after a command
ran and before its reply came back, or Redis stalls (SIGSTOP). The `history` model's state is
every input its sequence took (after its initial state, [0]), so a doubled or lost step shows in the answer. Over HTTP and
gRPC, a client that follows the server's advice (on 503, wait Retry-After and send the same
request again) ends with every step applied exactly once."""

import hashlib
import os
import signal
import time
import warnings
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from dataclasses import dataclass

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from service.cluster.sequence_scripts import ARRIVE, FINISH
from tests.cluster.drop_proxy import DropProxy, drop_proxy
from tests.cluster.redis_server import RedisServer, redis_server
from tests.cluster.sequence_models import HISTORY_IDLE_US, sequence_repository
from tests.grpc.conftest import Served, serve_grpc

TIMEOUT = 1.0  # OPSERVE_CLUSTER_TIMEOUT_SECONDS
ARRIVE_SHA = hashlib.sha1(ARRIVE.encode()).hexdigest().encode()
FINISH_SHA = hashlib.sha1(FINISH.encode()).hexdigest().encode()


@dataclass
class Cluster:
    redis: RedisServer
    proxy: DropProxy
    replicas: list[Served]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    root = sequence_repository(tmp_path_factory.mktemp("models"))
    config = (
        root / "history" / "config.pbtxt"
    )  # idle long enough for a resend's wait on a busy machine
    config.write_text(config.read_text().replace(str(HISTORY_IDLE_US), "30000000"))
    with redis_server(tmp_path_factory.mktemp("redis")) as redis, drop_proxy(redis.port) as proxy:
        settings = {"model_repository": str(root), "reference_fallback": "true",
                    "cluster_redis_url": proxy.url, "cluster_heartbeat_seconds": "0.2",
                    "cluster_timeout_seconds": str(TIMEOUT),
                    "cluster_sequence_lease_seconds": "1"}  # fmt: skip
        with ExitStack() as stack:
            replicas = [stack.enter_context(serve_grpc(**settings)) for _ in range(2)]
            yield Cluster(redis, proxy, replicas)


class Refused(Exception):
    """A 503 / UNAVAILABLE: its text, and the Retry-After it came with."""

    def __init__(self, text: str, retry_after: float) -> None:
        super().__init__(text)
        self.retry_after = retry_after


def _http(served: Served, seq_id: str, value: int, request_id: str, **flags: bool) -> list[int]:
    body = {"inputs": [{"name": "INPUT", "shape": [1], "datatype": "INT32", "data": [value]}],
            "parameters": {"sequence_id": seq_id, **{f"sequence_{k}": v for k, v in flags.items()}}}  # fmt: skip
    if request_id:
        body["id"] = request_id
    answer = httpx.post(f"{served.http.url}/v2/models/history/infer", json=body, timeout=30)
    if answer.status_code == 503:
        raise Refused(answer.json()["error"], float(answer.headers["retry-after"]))
    assert answer.status_code == 200, answer.text
    return answer.json()["outputs"][0]["data"]


def _grpc(served: Served, seq_id: str, value: int, request_id: str, **flags: bool) -> list[int]:
    data = grpcclient.InferInput("INPUT", [1], "INT32")
    data.set_data_from_numpy(np.array([value], np.int32))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        client = grpcclient.InferenceServerClient(served.target)
    try:
        result = client.infer("history", [data], sequence_id=seq_id, request_id=request_id,
                              sequence_start=flags.get("start", False),
                              sequence_end=flags.get("end", False))  # fmt: skip
    except InferenceServerException as exc:
        if exc.status() == "StatusCode.UNAVAILABLE":
            raise Refused(exc.message() or "", 1.0) from exc
        raise
    finally:
        client.close()
    return result.as_numpy("OUTPUT").tolist()


DOORS: dict[str, Callable[..., list[int]]] = {"http": _http, "grpc": _grpc}


def _advised(step: Callable[..., list[int]], *args: object, refusals: list[str] | None = None,
             **flags: bool) -> list[int]:  # fmt: skip
    """One step sent as a client following the server's advice: on 503, wait Retry-After and
    send the same request again (at most 10 times)."""
    for _ in range(10):
        try:
            return step(*args, **flags)
        except Refused as refused:
            if refusals is not None:
                refusals.append(str(refused))
            time.sleep(refused.retry_after)
    raise AssertionError("10 refusals in a row")


@pytest.mark.parametrize("door", DOORS)
@pytest.mark.parametrize("times", [1, 2])
@pytest.mark.parametrize("request_id", ["", "step"])
def test_a_write_back_whose_reply_is_lost_is_applied_once(cluster: Cluster, door: str, times: int,
                                                           request_id: str) -> None:  # fmt: skip
    """Once: the store's retry finds the write-back done (200 at once). Twice (the retry's
    reply lost too): 503 "unknown", and the resend is answered as the committed step."""
    step, (first, second) = DOORS[door], cluster.replicas
    seq_id = f"finish-{door}-{times}-{request_id or 'none'}"
    assert step(first, seq_id, 1, request_id, start=True) == [0, 1]
    cluster.proxy.dropped = 0
    cluster.proxy.drop(FINISH_SHA, seq_id.encode(), times=times)
    refusals: list[str] = []
    assert _advised(step, second, seq_id, 2, request_id, refusals=refusals) == [0, 1, 2]
    assert cluster.proxy.dropped == times
    assert len(refusals) == times - 1
    assert all("was applied is unknown; send the same request again" in r for r in refusals)
    assert step(first, seq_id, 3, request_id) == [0, 1, 2, 3]
    assert step(second, seq_id, 4, request_id, end=True) == [0, 1, 2, 3, 4]


@pytest.mark.parametrize("door", DOORS)
@pytest.mark.parametrize(("script", "times"), [("arrive", 1), ("arrive", 2), ("finish", 2)])
def test_an_end_whose_reply_is_lost_runs_once(cluster: Cluster, door: str, script: str,
                                              times: int) -> None:  # fmt: skip
    """Triton's END, its arrival's or its write-back's reply lost: 200 and run once (it was
    400 "must specify the START flag"); the sequence is then ended."""
    step, (first, second) = DOORS[door], cluster.replicas
    seq_id = f"end-{door}-{script}-{times}"
    assert step(first, seq_id, 1, "", start=True) == [0, 1]
    assert step(second, seq_id, 2, "") == [0, 1, 2]
    cluster.proxy.dropped = 0
    cluster.proxy.drop(ARRIVE_SHA if script == "arrive" else FINISH_SHA, seq_id.encode(),
                       times=times)  # fmt: skip
    assert _advised(step, first, seq_id, 3, "", end=True) == [0, 1, 2, 3]
    assert cluster.proxy.dropped == times
    with pytest.raises((AssertionError, InferenceServerException), match="START flag"):
        step(second, seq_id, 4, "")
    assert step(second, seq_id, 5, "", start=True, end=True) == [0, 5]


def _stalled(redis: RedisServer, send: Callable[[], list[int]]) -> Refused:
    """`send` while Redis is stopped (SIGSTOP): the 503 it answered; Redis runs again after."""
    assert redis.process is not None
    os.kill(redis.process.pid, signal.SIGSTOP)
    try:
        with pytest.raises(Refused) as refused:
            send()
    finally:
        os.kill(redis.process.pid, signal.SIGCONT)
    return refused.value


@pytest.mark.parametrize("door", DOORS)
def test_steps_refused_while_redis_stalls_run_once_when_sent_again(cluster: Cluster,
                                                                   door: str) -> None:  # fmt: skip
    """A step answered 503 during a stall still ran once Redis woke (its command was queued):
    the resend neither applies it twice nor, for an END, finds the sequence closed."""
    step, (first, second) = DOORS[door], cluster.replicas
    seq_id = f"stall-{door}"
    assert step(first, seq_id, 1, "", start=True) == [0, 1]
    refused = _stalled(cluster.redis, lambda: step(second, seq_id, 2, ""))
    assert "cluster store (Redis)" in str(refused)
    time.sleep(refused.retry_after)
    assert _advised(step, first, seq_id, 2, "") == [0, 1, 2]
    refused = _stalled(cluster.redis, lambda: step(first, seq_id, 3, "", end=True))
    time.sleep(refused.retry_after)
    assert _advised(step, second, seq_id, 3, "", end=True) == [0, 1, 2, 3]
    with pytest.raises((AssertionError, InferenceServerException), match="START flag"):
        step(first, seq_id, 4, "")


def test_a_client_following_the_advice_applies_every_step_once(cluster: Cluster) -> None:
    """Faults at every kind of call of a sequence's steps, both doors, both replicas: the
    history is every value once, in order."""
    seq_id, values = "advised", list(range(10, 22))
    cluster.proxy.dropped = 0
    faults = [(FINISH_SHA, 1), (ARRIVE_SHA, 1), (FINISH_SHA, 2), (ARRIVE_SHA, 2), None]
    for i, value in enumerate(values):
        fault = faults[i % len(faults)]
        if fault is not None:
            cluster.proxy.drop(fault[0], seq_id.encode(), times=fault[1])
        step = DOORS[("http", "grpc")[i % 2]]
        flags = {"start": i == 0, "end": i == len(values) - 1}
        answer = _advised(step, cluster.replicas[i // 2 % 2], seq_id, value, "", **flags)
        assert answer == [0, *values[: i + 1]], (i, fault)
    assert cluster.proxy.dropped  # the faults were met
