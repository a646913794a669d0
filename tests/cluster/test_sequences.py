"""Sequences on any replica (issue 26, item 2): two real opserve processes in cluster mode on a
real Redis, driven by tritonclient as a load balancer would spread a client's calls. A sequence
alternating between replicas answers as one process does; a replica SIGKILLed between steps or
mid-step loses nothing committed; steps sent close together to both replicas run in the
order they arrived; the idle time and the model's slots hold cluster-wide; with Redis away a
step is 503 with the store's text, sequence models are not ready, stateless calls still
answer, and all comes back by itself."""

import contextlib
import queue
import signal
import threading
import time
import warnings
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

import httpx
import numpy as np
import pytest
import redis as redis_py
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from service.main import create_app
from service.settings import Settings
from tests.cluster.redis_server import RedisServer, redis_server
from tests.cluster.sequence_models import HISTORY_SLOTS, sequence_repository
from tests.grpc.conftest import Served, serve_grpc

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from starlette.testclient import TestClient

ACCUMULATOR = "simple_string_dyna_sequence"
VALUES = [20, -11, -7, -5, -3, -2, 0, -1]  # Triton's example client's third sequence
LEASE_SECONDS = 1.0


@dataclass
class Cluster:
    redis: RedisServer
    replicas: list[Served]
    settings: dict[str, str]
    root: Path

    def key(self, kind: str, *parts: str) -> str:
        return ":".join(("opserve:opserve:" + kind, *parts))


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    root = sequence_repository(tmp_path_factory.mktemp("models"))
    with redis_server(tmp_path_factory.mktemp("redis")) as redis, ExitStack() as stack:
        settings = {"model_repository": str(root), "reference_fallback": "true",
                    "cluster_redis_url": redis.url, "cluster_heartbeat_seconds": "0.2",
                    "cluster_timeout_seconds": "2",
                    "cluster_sequence_lease_seconds": str(LEASE_SECONDS)}  # fmt: skip
        replicas = [stack.enter_context(serve_grpc(**settings)) for _ in range(2)]
        yield Cluster(redis, replicas, settings, root)


def _http(served: Served) -> httpclient.InferenceServerClient:
    return httpclient.InferenceServerClient(f"127.0.0.1:{served.http.port}")


def _step(served: Served, model: str, seq_id: int | str, value: int, start: bool = False,
          end: bool = False) -> list[int]:  # fmt: skip
    """One step over tritonclient.http: the answer's OUTPUT, flattened."""
    shape = [1] if model == "history" else [1, 1]
    data = httpclient.InferInput("INPUT", shape, "INT32")
    data.set_data_from_numpy(np.array(value, np.int32).reshape(shape), binary_data=True)
    client = _http(served)
    try:
        result = client.infer(model, [data], sequence_id=seq_id, sequence_start=start,
                              sequence_end=end)  # fmt: skip
    finally:
        client.close()
    return [int(x) for x in result.as_numpy("OUTPUT").flat]


def _one_process(root: Path, values: list[int], seq_id: str) -> list[int]:
    """The accumulator's answers for `values` from one process (cluster mode off)."""
    settings = Settings(model_repository=root, reference_fallback=True, access_log=False)
    answers = []
    with TestClient(create_app(settings)) as client:
        for i, value in enumerate(values):
            body = {"inputs": [{"name": "INPUT", "shape": [1, 1], "datatype": "INT32",
                                "data": [value]}],
                    "parameters": {"sequence_id": seq_id, "sequence_start": i == 0,
                                   "sequence_end": i == len(values) - 1}}  # fmt: skip
            answer = client.post(f"/v2/models/{ACCUMULATOR}/infer", json=body)
            answers.append(answer.json()["outputs"][0]["data"][0])
    return answers


def test_a_sequence_alternating_between_replicas_answers_as_one_process(cluster: Cluster) -> None:
    replicas = cluster.replicas
    answers = [_step(replicas[i % 2], ACCUMULATOR, "1002", value, start=i == 0,
                     end=i == len(VALUES) - 1)[0] for i, value in enumerate(VALUES)]  # fmt: skip
    assert answers == _one_process(cluster.root, VALUES, "1002")
    assert answers == [20, 9, 2, -3, -6, -8, -8, -9 + 1002]  # Triton's example client's
    # ended: the sequence's state, order and lease are gone from the store (what a resend of
    # the END needs stays its idle time), and a step without START is refused anywhere
    store = redis_py.Redis(port=cluster.redis.port)
    seq = cluster.key("seq", ACCUMULATOR, "1", "s1002")
    # (kept for the sequence's idle time, which a busy host may already have let pass)
    assert store.keys("opserve:opserve:seq*:s1002") in ([seq.encode()], [])
    assert not store.hexists(seq, "state")
    assert not store.zscore(cluster.key("seqlive", ACCUMULATOR, "1"), "s1002")
    with pytest.raises(InferenceServerException, match="must specify the START flag"):
        _step(replicas[1], ACCUMULATOR, "1002", 1)


def test_grpc_unary_calls_alternate_between_replicas(cluster: Cluster) -> None:
    clients = [grpcclient.InferenceServerClient(r.target) for r in cluster.replicas]
    answers = []
    for i, value in enumerate(VALUES):
        data = grpcclient.InferInput("INPUT", [1, 1], "INT32")
        data.set_data_from_numpy(np.array([[value]], np.int32))
        result = clients[i % 2].infer(ACCUMULATOR, [data], sequence_id="2002",
                                      sequence_start=i == 0, sequence_end=i == len(VALUES) - 1)  # fmt: skip
        answers.append(int(result.as_numpy("OUTPUT")[0][0]))
    for client in clients:
        client.close()
    assert answers == [20, 9, 2, -3, -6, -8, -8, -9 + 2002]


def test_a_grpc_stream_continues_a_sequence_started_over_http_elsewhere(cluster: Cluster) -> None:
    """START over HTTP on one replica, the rest on a gRPC stream to the other, END over HTTP."""
    first, second = cluster.replicas
    assert _step(first, ACCUMULATOR, "4002", VALUES[0], start=True) == [20]
    got: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(second.target)
    client.start_stream(callback=lambda result, error: got.put((result, error)))
    for value in VALUES[1:-1]:
        data = grpcclient.InferInput("INPUT", [1, 1], "INT32")
        data.set_data_from_numpy(np.array([[value]], np.int32))
        client.async_stream_infer(ACCUMULATOR, [data], sequence_id="4002")
    answers = []
    for _ in VALUES[1:-1]:
        result, error = got.get(timeout=10)
        assert error is None, error
        answers.append(int(result.as_numpy("OUTPUT")[0][0]))
    client.stop_stream()
    client.close()
    assert answers == [9, 2, -3, -6, -8, -8]
    assert _step(first, ACCUMULATOR, "4002", VALUES[-1], end=True) == [-9 + 4002]


def test_steps_sent_close_together_to_both_replicas_keep_their_order(cluster: Cluster) -> None:
    """Steps 2..12 each sent once the previous one has its ticket (so their arrival order is
    known), alternating replicas, while the line is held (the test takes the sequence's lease
    as a step that runs long would: a fast engine would otherwise finish each step before the
    next arrives); let go, they run in that order: the history shows it."""
    replicas, seq_id, last = cluster.replicas, 7001, 12
    assert _step(replicas[0], "history", seq_id, 1, start=True) == [0, 1]
    store = redis_py.Redis(port=cluster.redis.port)
    tickets = cluster.key("seq", "history", "1", f"i{seq_id}")
    queue = cluster.key("seqqueue", "history", "1", f"i{seq_id}")
    lease = cluster.key("seqlease", "history", "1", f"i{seq_id}")
    answers: dict[int, list[int]] = {}
    failures: list[BaseException] = []
    longest_queue = 0

    def send(i: int) -> None:
        try:
            answers[i] = _step(replicas[i % 2], "history", seq_id, i)
        except BaseException as exc:  # reported by the test
            failures.append(exc)

    threads = []
    assert store.set(lease, "the-test-holds-the-line", px=10_000, nx=True)
    for i in range(2, last + 1):
        threads.append(threading.Thread(target=send, args=(i,)))
        threads[-1].start()
        deadline = time.monotonic() + 10
        while int(store.hget(tickets, "tickets") or 0) < i and time.monotonic() < deadline:
            longest_queue = max(longest_queue, int(store.zcard(queue)))
            time.sleep(0.0005)
    longest_queue = max(longest_queue, int(store.zcard(queue)))
    store.delete(lease)
    for thread in threads:
        thread.join(timeout=30)
    assert not failures, failures
    assert longest_queue == last - 1  # every step waited in line: the order was at stake
    for i in range(2, last + 1):
        assert answers[i] == list(range(i + 1)), i
    assert _step(replicas[1], "history", seq_id, 99, end=True) == [*range(last + 1), 99]


def test_a_replica_killed_between_steps_or_mid_step_loses_nothing_committed(
    cluster: Cluster,
) -> None:
    survivor = cluster.replicas[0]
    store = redis_py.Redis(port=cluster.redis.port)
    seq = "i8001"
    with serve_grpc(**cluster.settings) as doomed:
        assert _step(doomed, "history", 8001, 1, start=True) == [0, 1]
        assert _step(survivor, "history", 8001, 2) == [0, 1, 2]
        assert _step(doomed, "history", 8001, 3) == [0, 1, 2, 3]
        # mid-step: killed once its step has the lease, before it can write back
        sender = threading.Thread(target=_quietly, args=(doomed, 8001, 4))
        sender.start()
        lease = cluster.key("seqlease", "history", "1", seq)
        deadline = time.monotonic() + 10
        while not store.exists(lease) and time.monotonic() < deadline:
            time.sleep(0.0005)
        doomed.http.process.send_signal(signal.SIGKILL)
        doomed.http.process.wait(timeout=10)
        held = bool(store.exists(lease))  # still the dead step's: it never wrote back
        sender.join(timeout=10)
        began = time.monotonic()
        # the sequence's keys live the idle time and a lease past the dead step's arrival: a
        # machine too slow to come back by then sees the sequence released, as it should be
        released = store.pttl(cluster.key("seq", "history", "1", seq)) < 100
        if released:
            with pytest.raises(InferenceServerException, match="must specify the START flag"):
                _step(survivor, "history", 8001, 5)
            return
        answer = _step(survivor, "history", 8001, 5)
    if held:  # the usual case: the dead step's lease ran out, its state never was
        assert answer == [0, 1, 2, 3, 5]
        assert time.monotonic() - began < LEASE_SECONDS + 2
    else:  # it wrote back just before the kill
        assert answer == [0, 1, 2, 3, 4, 5]
    # killed between steps: the next continues on the survivor
    assert _step(survivor, "history", 8001, 6, end=True)[-2:] == [5, 6]


def _quietly(served: Served, seq_id: int, value: int) -> None:
    with contextlib.suppress(Exception):  # its replica is killed under it
        _step(served, "history", seq_id, value)


def test_an_idle_sequence_is_released_on_every_replica(cluster: Cluster) -> None:
    first, second = cluster.replicas
    assert _step(first, "history", 9001, 1, start=True) == [0, 1]
    time.sleep(0.5)  # within the idle time (1.5 s), with a second for a busy host: still live
    assert _step(second, "history", 9001, 2) == [0, 1, 2]
    time.sleep(2.0)  # past it
    with pytest.raises(InferenceServerException, match=(
            "inference request for sequence 9001 to model 'history' must specify the START flag "
            "on the first request of the sequence")):  # fmt: skip
        _step(first, "history", 9001, 3)
    assert _step(second, "history", 9001, 4, start=True) == [0, 4]  # a new one, from scratch
    _step(second, "history", 9001, 5, end=True)


def test_the_models_slots_hold_across_replicas(cluster: Cluster) -> None:
    first, second = cluster.replicas
    ids = list(range(9100, 9100 + HISTORY_SLOTS))
    for i, seq_id in enumerate(ids):
        _step(cluster.replicas[i % 2], "history", seq_id, 1, start=True)
    body = {"inputs": [{"name": "INPUT", "shape": [1], "datatype": "INT32", "data": [1]}],
            "parameters": {"sequence_id": 9199, "sequence_start": True}}  # fmt: skip
    for served in (first, second):
        refused = httpx.post(f"{served.http.url}/v2/models/history/infer", json=body)
        assert refused.status_code == 503
        assert (f"model 'history' has {HISTORY_SLOTS} live sequences, the most its configuration "
                "allows (Triton's sequence slots: 1 instance x oldest.max_candidate_sequences "
                f"{HISTORY_SLOTS})") in refused.json()["error"]  # fmt: skip
        assert 1 <= int(refused.headers["retry-after"]) <= 2  # the soonest idle deadline
    _step(second, "history", ids[0], 2, end=True)  # one ends: a slot is free, on any replica
    assert httpx.post(f"{first.http.url}/v2/models/history/infer", json=body).status_code == 200
    for seq_id in [*ids[1:], 9199]:
        _step(first, "history", seq_id, 3, end=True)


def test_with_redis_away_steps_are_503_and_sequence_models_not_ready(cluster: Cluster) -> None:
    first, second = cluster.replicas
    assert _step(first, ACCUMULATOR, "3002", 20, start=True) == [20]
    cluster.redis.stop()
    try:
        body = {"inputs": [{"name": "INPUT", "shape": [1, 1], "datatype": "INT32", "data": [5]}],
                "parameters": {"sequence_id": "3002"}}  # fmt: skip
        refused = httpx.post(f"{second.http.url}/v2/models/{ACCUMULATOR}/infer", json=body,
                             timeout=10)  # fmt: skip
        assert refused.status_code == 503, refused.text
        assert "the cluster store (Redis) is unreachable" in refused.json()["error"]
        assert refused.headers["retry-after"] == "1"
        with pytest.raises(
            InferenceServerException, match=r"cluster store \(Redis\) is unreachable"
        ):
            data = grpcclient.InferInput("INPUT", [1, 1], "INT32")
            data.set_data_from_numpy(np.array([[5]], np.int32))
            grpcclient.InferenceServerClient(first.target).infer(ACCUMULATOR, [data],
                                                                 sequence_id="3002")  # fmt: skip
        for served in (first, second):
            assert _eventually(lambda s=served: not _ready(s, ACCUMULATOR))
            assert _ready(served, "simple")  # stateless: ready, and answers
            index = httpx.post(f"{served.http.url}/v2/repository/index", json={}).json()
            states = {row["name"]: row.get("state") for row in index}
            assert states[ACCUMULATOR] == "UNAVAILABLE" and states["simple"] == "READY"
            assert not grpcclient.InferenceServerClient(served.target).is_model_ready(ACCUMULATOR)
            two = httpclient.InferInput("INPUT0", [1, 16], "INT32")
            two.set_data_from_numpy(np.ones((1, 16), np.int32))
            other = httpclient.InferInput("INPUT1", [1, 16], "INT32")
            other.set_data_from_numpy(np.ones((1, 16), np.int32))
            result = _http(served).infer("simple", [two, other])
            assert result.as_numpy("OUTPUT0").tolist() == [[2] * 16]
    finally:
        cluster.redis.start()
    for served in (first, second):
        assert _eventually(lambda s=served: _ready(s, ACCUMULATOR))
    # what was committed before Redis went away is still there (append-only persistence)
    assert _step(second, ACCUMULATOR, "3002", 5, end=True) == [25 + 3002]


def _ready(served: Served, model: str) -> bool:
    return httpx.get(f"{served.http.url}/v2/models/{model}/ready").status_code == 200


def _eventually(check: object, seconds: float = 5.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if check():  # type: ignore[operator]
            return True
        time.sleep(0.05)
    return False
