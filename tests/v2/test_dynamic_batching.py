"""Dynamic batching against a live server, driven by tritonclient (HTTP and gRPC, sync and
async): concurrent requests each get exactly their own rows and outputs (checked against numpy),
statistics show batches where batching is on and none where it is off, a preferred batch runs
without waiting for the delay while a lone request waits for it, and Triton's queue policies
(max_queue_size, REJECT and DELAY timeouts, the timeout override, priorities) answer as on
Triton (qa/L0_model_queue); a request whose data its batch's run refuses fails alone, and a
client that leaves the queue is taken out of it.

Timing checks compare against the test's own measures (the delay set in the config, a run of
the same model), with wide margins: they hold on a busy host."""

import functools
import json
import socket
import threading
import time
import warnings
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from onnx import TensorProto, helper
from tritonclient.utils import InferenceServerException

from tests.api.live_server import Server, free_port, serve
from tests.api.test_triton_metrics import scrape
from tests.runtime.models import model, value

WIDTH, DEPTH = 512, 3
LONG_ROWS = 6000  # of the "prioritized" model: a run of about a second
PENDING = ("nv_inference_pending_request_count", (("model", "prioritized"), ("version", "1")))
"""The prioritized model's queued requests, as /metrics says them (a `scrape` key)."""
CLIENTS = 32
RNG = np.random.default_rng(7)
WEIGHTS = [(RNG.standard_normal((WIDTH, WIDTH)) / np.sqrt(WIDTH)).astype(np.float32)
           for _ in range(DEPTH)]  # fmt: skip


def _mlp() -> bytes:
    """DEPTH MatMuls by WIDTH x WIDTH weights: a run reads them all, whatever its rows, so a
    batch costs little more than one row (and runs on a kernel thread, not inline)."""
    nodes = [helper.make_node("MatMul", [f"h{i}", f"w{i}"], [f"h{i + 1}"]) for i in range(DEPTH)]
    nodes.append(helper.make_node("Identity", [f"h{DEPTH}"], ["Y"]))
    nodes.append(helper.make_node("ReduceSum", ["X", "axis"], ["S"], keepdims=1))
    nodes.insert(0, helper.make_node("Identity", ["X"], ["h0"]))
    return model(nodes, [value("X", TensorProto.FLOAT, ["n", WIDTH])],
                 [value("Y", TensorProto.FLOAT, ["n", WIDTH]),
                  value("S", TensorProto.FLOAT, ["n", 1])],
                 {"axis": np.array([1], np.int64), **{f"w{i}": w for i, w in enumerate(WEIGHTS)}}, opset=17).SerializeToString()  # fmt: skip


def _scaling() -> bytes:
    """Y [1, 512] = the sum over `reps` copies of X [1, 512], each through eight MatMuls by
    512 x 512 weights: a small request whose time follows `reps`, so one (reps = LONG_ROWS)
    can hold the model's only instance while others queue."""
    weights = (np.eye(WIDTH) * 0.5).astype(np.float32)
    nodes = [helper.make_node("Reshape", ["reps", "flat"], ["repeats"]),
             helper.make_node("Tile", ["X", "repeats"], ["h0"])]  # fmt: skip
    nodes += [helper.make_node("MatMul", [f"h{i}", "w"], [f"h{i + 1}"]) for i in range(8)]
    nodes.append(helper.make_node("ReduceSum", ["h8", "axis"], ["Y"], keepdims=1))
    return model(nodes, [value("X", TensorProto.FLOAT, ["b", WIDTH]),
                         value("reps", TensorProto.INT64, ["b", 2])],
                 [value("Y", TensorProto.FLOAT, ["b", WIDTH])],
                 {"w": weights, "flat": np.array([-1], np.int64),
                  "axis": np.array([0], np.int64)}, opset=17).SerializeToString()  # fmt: skip


def _gather() -> bytes:
    return model([helper.make_node("Gather", ["data", "idx"], ["y"])],
                 [value("idx", TensorProto.INT64, ["n", 2])],
                 [value("y", TensorProto.FLOAT, ["n", 2])],
                 {"data": np.arange(10, dtype=np.float32)}).SerializeToString()  # fmt: skip


def _expected(x: np.ndarray) -> np.ndarray:
    for w in WEIGHTS:
        x = x @ w
    return x


MLP_IO = (
    f'input [{{name: "X" data_type: TYPE_FP32 dims: [{WIDTH}]}}]\n'
    f'output [{{name: "Y" data_type: TYPE_FP32 dims: [{WIDTH}]}},'
    ' {name: "S" data_type: TYPE_FP32 dims: [1]}]\n'
)
CONFIGS = {
    # batching on: a delay long enough for 32 clients' requests to meet
    "batched": "max_batch_size: 8\n"
    + MLP_IO
    + "dynamic_batching {preferred_batch_size: [4, 8] max_queue_delay_microseconds: 20000}\n",
    "unbatched": "max_batch_size: 8\n" + MLP_IO,  # inputs and outputs named: no autocomplete
    # a long delay: a lone request waits it out, a preferred batch does not
    "delayed": "max_batch_size: 8\n"
    + MLP_IO
    + "dynamic_batching {preferred_batch_size: [4] max_queue_delay_microseconds: 1500000}\n",
    "small_queue": "max_batch_size: 8\n"
    + MLP_IO
    + "dynamic_batching {preferred_batch_size: [8] max_queue_delay_microseconds: 2000000"
    " default_queue_policy {max_queue_size: 2}}\n",
    "rejecting": "max_batch_size: 8\n"
    + MLP_IO
    + "dynamic_batching {preferred_batch_size: [8] max_queue_delay_microseconds: 3000000"
    " default_queue_policy {timeout_action: REJECT default_timeout_microseconds: 300000}}\n",
    "delaying": "max_batch_size: 8\n"
    + MLP_IO
    + "dynamic_batching {preferred_batch_size: [8] max_queue_delay_microseconds: 1000000"
    " default_queue_policy {timeout_action: DELAY default_timeout_microseconds: 100000}}\n",
    "override": "max_batch_size: 8\n"
    + MLP_IO
    + "dynamic_batching {preferred_batch_size: [8] max_queue_delay_microseconds: 2000000"
    " default_queue_policy {default_timeout_microseconds: 10000000"
    " allow_timeout_override: true}}\n",
    # one instance, one row a batch: a pure priority queue
    "prioritized": "max_batch_size: 1\n"
    f'input [{{name: "X" data_type: TYPE_FP32 dims: [{WIDTH}]}},'
    ' {name: "reps" data_type: TYPE_INT64 dims: [2]}]\n'
    f'output [{{name: "Y" data_type: TYPE_FP32 dims: [{WIDTH}]}}]\n'
    "instance_group [{count: 1 kind: KIND_CPU}]\n"
    "dynamic_batching {priority_levels: 2 default_priority_level: 2}\n",
    "gather": 'max_batch_size: 8\ninput [{name: "idx" data_type: TYPE_INT64 dims: [2]}]\n'
    'output [{name: "y" data_type: TYPE_FP32 dims: [2]}]\n'
    "dynamic_batching {preferred_batch_size: [4] max_queue_delay_microseconds: 2000000}\n",
}


GRPC_PORT = free_port()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    root = tmp_path_factory.mktemp("models")
    for name, config in CONFIGS.items():
        (root / name / "1").mkdir(parents=True)
        data = {"gather": _gather, "prioritized": _scaling}.get(name, _mlp)()
        (root / name / "1" / "model.onnx").write_bytes(data)
        (root / name / "config.pbtxt").write_text(f'name: "{name}"\n{config}')
    with serve(model_repository=str(root), grpc_port=str(GRPC_PORT), kernel_threads="2",
               max_run_seconds="60") as running:  # fmt: skip
        yield running


def _http(server: Server) -> httpclient.InferenceServerClient:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return httpclient.InferenceServerClient(f"127.0.0.1:{server.port}")


def _row(i: int) -> np.ndarray:
    return np.full((1, WIDTH), 0.01 * (i + 1), np.float32) + RNG.standard_normal(
        (1, WIDTH)).astype(np.float32)  # fmt: skip


_LOCAL = threading.local()


def _own_client(server: Server) -> httpclient.InferenceServerClient:
    """This thread's client (tritonclient.http's sync client is one thread's: gevent)."""
    client = getattr(_LOCAL, "client", None)
    if client is None or _LOCAL.port != server.port:
        client = _LOCAL.client = _http(server)
        _LOCAL.port = server.port
    return client


def _http_call(server: Server, name: str, x: np.ndarray, outputs: list[str] | None = None,
               **kwargs: Any) -> dict[str, np.ndarray]:  # fmt: skip
    client = _own_client(server)
    tensor = httpclient.InferInput("X", list(x.shape), "FP32")
    tensor.set_data_from_numpy(x, binary_data=True)
    wanted = [httpclient.InferRequestedOutput(o) for o in outputs] if outputs else None
    result = client.infer(name, [tensor], outputs=wanted, **kwargs)
    return {o["name"]: result.as_numpy(o["name"]) for o in result.get_response()["outputs"]}


def _stats(client: Any, name: str) -> dict[str, Any]:
    (stats,) = client.get_inference_statistics(name)["model_stats"]
    return stats  # type: ignore[no-any-return]


def test_concurrent_requests_get_their_own_rows_and_run_in_batches(server: Server) -> None:
    rows = [_row(i) for i in range(CLIENTS)]
    for name in ("batched", "unbatched"):
        client = _http(server)
        # half ask for Y only, half for both outputs (JSON for some): each gets what it asked
        asked = [["Y"] if i % 2 else None for i in range(CLIENTS)]
        with ThreadPoolExecutor(CLIENTS) as pool:
            answers = list(pool.map(_http_call, [server] * CLIENTS, [name] * CLIENTS, rows,
                                    asked))  # fmt: skip
        for i, answer in enumerate(answers):
            assert sorted(answer) == (["Y"] if asked[i] else ["S", "Y"]), (i, sorted(answer))
            np.testing.assert_allclose(answer["Y"], _expected(rows[i]), rtol=1e-4, atol=1e-4)
            if "S" in answer:
                np.testing.assert_allclose(answer["S"], rows[i].sum(keepdims=True), rtol=1e-4)
        stats = _stats(client, name)
        client.close()
        assert stats["inference_count"] == CLIENTS
        sizes = {b["batch_size"]: b["compute_infer"]["count"] for b in stats["batch_stats"]}
        assert sum(size * count for size, count in sizes.items()) == CLIENTS
        assert sum(sizes.values()) == stats["execution_count"]
        assert stats["inference_stats"]["success"]["count"] == CLIENTS
        assert stats["inference_stats"]["queue"]["count"] == CLIENTS
        if name == "batched":
            assert stats["execution_count"] < CLIENTS, stats
            assert max(sizes) > 1, sizes
        else:
            assert stats["execution_count"] == CLIENTS and set(sizes) == {1}, sizes


def test_grpc_sync_and_async_clients_get_their_own_rows(server: Server) -> None:
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{GRPC_PORT}")
    before = _stats_grpc(client, "batched")
    rows = [_row(i) for i in range(CLIENTS)]

    def sync_call(i: int) -> np.ndarray:
        tensor = grpcclient.InferInput("X", [1, WIDTH], "FP32")
        tensor.set_data_from_numpy(rows[i])
        return client.infer("batched", [tensor]).as_numpy("Y")  # type: ignore[no-any-return]

    with ThreadPoolExecutor(CLIENTS // 2) as pool:
        answers = list(pool.map(sync_call, range(CLIENTS // 2)))
    done: dict[int, Any] = {}
    finished = threading.Event()

    def callback(i: int, result: Any, error: Any) -> None:
        done[i] = error if error is not None else result.as_numpy("Y")
        if len(done) == CLIENTS // 2:
            finished.set()

    for i in range(CLIENTS // 2, CLIENTS):
        tensor = grpcclient.InferInput("X", [1, WIDTH], "FP32")
        tensor.set_data_from_numpy(rows[i])
        client.async_infer("batched", [tensor], functools.partial(callback, i))
    assert finished.wait(120)
    answers += [done[i] for i in range(CLIENTS // 2, CLIENTS)]
    for i, answer in enumerate(answers):
        assert isinstance(answer, np.ndarray), answer
        np.testing.assert_allclose(answer, _expected(rows[i]), rtol=1e-4, atol=1e-4)
    after = _stats_grpc(client, "batched")
    client.close()
    assert after.inference_count - before.inference_count == CLIENTS
    assert after.execution_count - before.execution_count < CLIENTS


def _stats_grpc(client: grpcclient.InferenceServerClient, name: str) -> Any:
    return client.get_inference_statistics(name).model_stats[0]


def test_a_preferred_batch_runs_at_once_and_a_lone_request_waits_the_delay(
    server: Server,
) -> None:
    client = _http(server)
    delay = 1.5  # the "delayed" model's max_queue_delay
    began = time.monotonic()
    _http_call(server, "delayed", _row(0))
    lone = time.monotonic() - began
    assert delay <= lone < delay + 10, lone
    rows = [_row(i) for i in range(4)]  # the preferred batch size
    began = time.monotonic()
    with ThreadPoolExecutor(4) as pool:
        answers = list(pool.map(lambda i: _http_call(server, "delayed", rows[i]), range(4)))
    together = time.monotonic() - began
    assert together < delay, together  # did not wait for the delay
    for row, answer in zip(rows, answers, strict=True):
        np.testing.assert_allclose(answer["Y"], _expected(row), rtol=1e-4, atol=1e-4)
    stats = _stats(client, "delayed")
    assert {b["batch_size"] for b in stats["batch_stats"]} == {1, 4}
    client.close()


def _errors(server: Server, name: str, count: int, **kwargs: Any) -> list[str | None]:
    """`count` concurrent calls: None for each answered, else its error text."""

    def call(i: int) -> str | None:
        try:
            _http_call(server, name, _row(i), **kwargs)
        except InferenceServerException as exc:
            return f"{exc.status()} {exc.message()}"
        return None

    with ThreadPoolExecutor(count) as pool:
        return list(pool.map(call, range(count)))


def test_a_full_queue_refuses_with_tritons_words(server: Server) -> None:
    client = _http(server)
    errors = _errors(server, "small_queue", 4)
    refused = [e for e in errors if e is not None]
    assert len(refused) == 2, errors  # max_queue_size 2: two queue, two are refused at once
    assert all(e == "503 Exceeds maximum queue size" for e in refused), refused
    client.close()


def test_queue_timeouts_reject_or_delay(server: Server) -> None:
    client = _http(server)
    began = time.monotonic()
    (rejected,) = _errors(server, "rejecting", 1)
    waited = time.monotonic() - began
    assert rejected == "503 Request timeout expired", rejected
    assert waited < 3.0, waited  # refused at its 0.3 s timeout, not after the 3 s delay
    began = time.monotonic()
    assert _errors(server, "delaying", 1) == [None]  # DELAY: past its timeout, still served
    assert time.monotonic() - began >= 1.0  # after the batch's delay
    # the override shortens the default (10 s) for this request; a longer one is ignored
    began = time.monotonic()
    (short,) = _errors(server, "override", 1, timeout=200_000)
    assert short == "503 Request timeout expired" and time.monotonic() - began < 2.0, short
    assert _errors(server, "override", 1, timeout=60_000_000) == [None]  # the 2 s delay ran
    client.close()


def test_a_higher_priority_request_runs_first(server: Server) -> None:
    """A long request holds the model's one instance; six of the default level (2) queue, then
    one of level 1: it runs next, before all six. The scene holds only when the long request
    reached the server first and the others while it still ran, which a busy host can upset
    (a thread woken late, a request read late, a run quicker than measured): then it is set
    again, up to five times. Whether it held is read from the server: its batcher's queue
    (Triton's `nv_inference_pending_request_count`) held all seven before the blocker's
    answer came. (Judged by when each was sent, a busy host's server read the high request
    after the blocker and two low steps had run.)"""
    _prioritized_call("warm", server, 1, 0, [], set())  # the session made
    began = time.monotonic()
    _prioritized_call("alone", server, LONG_ROWS, 0, [], set())
    blocking = time.monotonic() - began  # how long the long request holds the instance
    for _ in range(5):
        order, queued = _priority_scene(server, blocking)
        assert len(order) == 8, order
        # the setting held: the blocker ran first, the others queued while it still ran
        if order[0] == "blocker" and queued:
            break
    else:
        pytest.fail(f"the long request never held the instance first: {order}, {blocking}")
    # next (or answered a moment after the low step that ran after it: the client threads
    # append as they wake); without priorities it would be last
    assert order.index("high") <= 2, order


def _prioritized_call(label: str, server: Server, rows: int, priority: int, order: list[str],
         sent: set[str], go: threading.Event | None = None) -> None:  # fmt: skip
    """One request to "prioritized" of `rows` rows at `priority`, once `go` is set; its label
    in `sent` as it is sent, and in `order` as it is answered."""
    client = _own_client(server)  # made before `go`: the send is all that is left
    tensors = [httpclient.InferInput("X", [1, WIDTH], "FP32"),
               httpclient.InferInput("reps", [1, 2], "INT64")]  # fmt: skip
    tensors[0].set_data_from_numpy(np.ones((1, WIDTH), np.float32), binary_data=True)
    tensors[1].set_data_from_numpy(np.array([[rows, 1]], np.int64), binary_data=True)
    if go is not None:
        go.wait(60)
    sent.add(label)
    client.infer("prioritized", tensors, priority=priority)
    order.append(label)


def _priority_scene(server: Server, blocking: float) -> tuple[list[str], bool]:
    """The blocker sent, six of level 2 while it runs, then one of level 1: the order they
    were answered in, and whether the seven were all queued before the blocker answered."""
    order: list[str] = []
    sent: set[str] = set()

    def ready(label: str, rows: int, priority: int) -> tuple[threading.Thread, threading.Event]:
        go = threading.Event()
        thread = threading.Thread(target=_prioritized_call, args=(
            label, server, rows, priority, order, sent, go))  # fmt: skip
        thread.start()
        return thread, go

    blocker = ready("blocker", LONG_ROWS, 0)
    lows = [ready(f"low{i}", 1, 2) for i in range(6)]
    high = ready("high", 1, 1)
    time.sleep(0.5)  # every thread has its client and tensor

    def sending(*labels: str) -> None:
        """Until each thread is in its call (a busy host may wake a thread late), then a
        quarter of the long run for the request to reach the server."""
        deadline = time.monotonic() + 30
        while not all(label in sent for label in labels) and time.monotonic() < deadline:
            time.sleep(0.005)
        time.sleep(blocking / 4)

    blocker[1].set()
    sending("blocker")  # it runs
    for _, go in lows:
        go.set()
    sending(*(f"low{i}" for i in range(6)))  # they queue behind it
    high[1].set()
    queued = False  # seven in the queue: the blocker still ran, or had just ended unpicked
    while not queued and "blocker" not in order:
        queued = scrape(server.url).get(PENDING) == 7
        time.sleep(0.01)
    for thread, _ in [blocker, *lows, high]:
        thread.join(120)
    return order, queued


def test_bad_data_fails_only_its_own_request(server: Server) -> None:
    client = _http(server)
    indices = [np.array([[i, i + 1]], np.int64) for i in range(3)] + [np.array([[4, 55]], np.int64)]

    def call(i: int) -> Any:
        tensor = httpclient.InferInput("idx", [1, 2], "INT64")
        tensor.set_data_from_numpy(indices[i])
        try:
            return _own_client(server).infer("gather", [tensor]).as_numpy("y")
        except InferenceServerException as exc:
            return exc

    with ThreadPoolExecutor(4) as pool:
        answers = list(pool.map(call, range(4)))  # 4: the preferred batch, run at once
    for i in range(3):
        np.testing.assert_array_equal(answers[i], indices[i].astype(np.float32))
    assert isinstance(answers[3], InferenceServerException), answers[3]
    assert answers[3].status() in ("400", "422"), answers[3]
    client.close()


def test_a_client_that_leaves_the_queue_is_taken_out_of_it(server: Server) -> None:
    """small_queue holds two requests: a client that sent one and left frees its place."""
    body = json.dumps({"inputs": [{"name": "X", "shape": [1, WIDTH], "datatype": "FP32",
                                   "data": [0.5] * WIDTH}]}).encode()  # fmt: skip
    with socket.create_connection(("127.0.0.1", server.port)) as gone:
        gone.sendall(b"POST /v2/models/small_queue/infer HTTP/1.1\r\nHost: x\r\n"
                     b"Content-Type: application/json\r\n"
                     + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)  # fmt: skip
        time.sleep(0.3)  # queued: its batch waits for the 2 s delay
    time.sleep(0.5)  # noticed once it has waited 0.1 s
    errors = _errors(server, "small_queue", 2)
    assert errors == [None, None], errors  # both queued: the one that left holds no place
    stats = _stats(_own_client(server), "small_queue")
    assert stats["inference_stats"]["fail"]["count"] >= 1  # the one that left
