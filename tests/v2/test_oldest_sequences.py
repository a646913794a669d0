"""The sequence batcher's `oldest` strategy (issue 34, item 4): Triton's simple_dyna_sequence
(its configuration: oldest, 1024 candidate sequences, a 10 ms delay, two instances) and the
`-d` variants of Triton's sequence example clients (replayed: tests/triton_clients.py) answer
as on Triton, in one process and in cluster mode (two replicas on one Redis); and the steps of
different sequences sent together run in batches (execution_count below inference_count),
each sequence still getting exactly its own answers, CORRID included."""

import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from tests.api.live_server import free_port, serve
from tests.cluster.redis_server import redis_server
from tests.cluster.replicas import Replica, replica
from tests.triton_clients import REPLAYS, VALUES
from tests.triton_examples import write_repository

MODELS = ["simple_dyna_sequence", "simple_string_dyna_sequence"]
DYNA = sorted(script for script in REPLAYS if script.endswith(" -d"))
SEQUENCES = 12


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_repository(tmp_path_factory.mktemp("models"), MODELS)


@pytest.fixture(scope="module")
def one(root: Path) -> Iterator[Replica]:
    grpc_port = free_port()
    with serve(model_repository=str(root), grpc_port=str(grpc_port)) as server:
        yield Replica(server.process, server.port, server.host, grpc_port)


@pytest.fixture(scope="module")
def two(root: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[Replica]]:
    with redis_server(tmp_path_factory.mktemp("redis")) as redis, ExitStack() as stack:
        yield [stack.enter_context(replica(redis.url, model_repository=str(root)))
               for _ in range(2)]  # fmt: skip


def _url(server: Replica, script: str) -> str:
    return server.grpc_target if "_grpc_" in script else f"127.0.0.1:{server.port}"


@pytest.mark.parametrize("script", DYNA)
def test_the_dyna_example_clients_pass_in_one_process(one: Replica, script: str) -> None:
    REPLAYS[script](_url(one, script))


@pytest.mark.parametrize("script", DYNA)
def test_the_dyna_example_clients_pass_in_cluster_mode(two: list[Replica], script: str) -> None:
    for server in two:  # each replica, its sequences kept in Redis
        REPLAYS[script](_url(server, script))


def _sequences_at_once(servers: list[Replica], first_id: int) -> dict[int, list[int]]:
    """SEQUENCES sequences of simple_dyna_sequence, each on its own gRPC stream on one of
    `servers` in turn, all sent at once: each sequence's answers."""
    answers: dict[int, list[int]] = {}
    done = threading.Barrier(SEQUENCES + 1, timeout=120)

    def one_sequence(n: int) -> None:
        seq_id = first_id + n
        client = grpcclient.InferenceServerClient(servers[n % len(servers)].grpc_target)
        got: list[int] = []
        ready = threading.Event()

        def callback(result: object, error: object) -> None:
            got.append(error if error is not None else int(result.as_numpy("OUTPUT")[0][0]))  # type: ignore[attr-defined]
            if len(got) == len(VALUES) + 1:
                ready.set()

        client.start_stream(callback=callback)
        values = [n, *VALUES]
        for count, value in enumerate(values, 1):
            data = grpcclient.InferInput("INPUT", [1, 1], "INT32")
            data.set_data_from_numpy(np.full((1, 1), value, np.int32))
            client.async_stream_infer("simple_dyna_sequence", [data], sequence_id=seq_id,
                                      sequence_start=count == 1,
                                      sequence_end=count == len(values))  # fmt: skip
        ready.wait(60)
        client.stop_stream()
        client.close()
        answers[seq_id] = got
        done.wait()

    for n in range(SEQUENCES):
        threading.Thread(target=one_sequence, args=(n,), daemon=True).start()
    done.wait()
    return answers


def _expected(seq_id: int, n: int) -> list[int]:
    """READY * (INPUT + START + END * CORRID), computed by hand."""
    values = [n, *VALUES]
    return [v + (i == 0) + (i == len(values) - 1) * seq_id for i, v in enumerate(values)]


def _counts(server: Replica) -> tuple[int, int]:
    client = grpcclient.InferenceServerClient(server.grpc_target)
    stats = client.get_inference_statistics("simple_dyna_sequence").model_stats[0]
    client.close()
    return stats.inference_count, stats.execution_count


def _settled(server: Replica) -> tuple[int, int]:
    """The counts once two reads a few flushes apart (OPSERVE_CLUSTER_STATISTICS_SECONDS,
    0.25 s) agree, within 10 s."""
    counts, deadline = _counts(server), time.monotonic() + 10
    while time.monotonic() < deadline:
        time.sleep(0.6)
        if (again := _counts(server)) == counts:
            break
        counts = again
    return counts


@pytest.mark.parametrize("where", ["one", "two"])
def test_steps_of_different_sequences_run_in_batches(where: str,
                                                     request: pytest.FixtureRequest) -> None:  # fmt: skip
    servers = [request.getfixturevalue("one")] if where == "one" else request.getfixturevalue(
        "two")  # fmt: skip
    # in cluster mode any replica's statistics are the cluster's sum (written a few times a
    # second): read from the first, until every step is counted, and from counts that held
    # still first (an earlier test's last steps, written late, counted here once: 98 of 96)
    before = _settled(servers[0])
    answers = _sequences_at_once(servers, 5000)
    for n in range(SEQUENCES):
        assert answers[5000 + n] == _expected(5000 + n, n), (n, answers[5000 + n])
    steps = SEQUENCES * (len(VALUES) + 1)
    deadline = time.monotonic() + 30
    while (after := _counts(servers[0]))[0] - before[0] < steps:
        assert time.monotonic() < deadline, (before, after)
        time.sleep(0.2)
    inferences, executions = after[0] - before[0], after[1] - before[1]
    assert inferences == steps
    assert executions < inferences, (executions, inferences)  # steps shared batches
