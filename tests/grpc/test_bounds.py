"""Issue 25's gRPC rows, as variants of what was sent (other sizes, orders and compression):
concurrent large and compressed messages held to the memory budget, malformed messages and
extra raw contents refused in words, idle streams ended, and no one connection nor any
unauthenticated client able to shut the others out. Each watches the server's RSS every 50 ms
and a small call's latency from another connection, and reads the server's log for tracebacks.
"""

import gzip
import threading
import time
import zlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import grpc
import numpy as np
import pytest
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc

from tests.api.resilience import in_background
from tests.grpc.conftest import Served, serve_grpc

MiB = 1 << 20
BUDGET = 256 * MiB
MESSAGE = 64 * MiB  # OPSERVE_MAX_REQUEST_BYTES, the default
MARGIN = 3 * MESSAGE + 192 * MiB
"""Above the budget: the free read (a message twice in grpc core and once in Python at its
peak), and slack for the interpreter, grpc, and the freed memory the heap keeps (allocator.py:
up to 170 MiB seen in these tests at their peak)."""
INFER = "/inference.GRPCInferenceService/ModelInfer"
STREAM = "/inference.GRPCInferenceService/ModelStreamInfer"
SETTINGS = {"memory_budget_bytes": str(BUDGET), "memory_wait_seconds": "3",
            "log_level": "info", "access_log": "true"}  # fmt: skip
"""A small call waits for the read in progress at most (message_room.py), which a loaded
2-core host took over 1 s to bring in: the wait is 3 s, not 1."""


def connection(target: str) -> grpc.Channel:
    """A channel on a connection of its own, sending and taking bytes as they are."""
    return grpc.insecure_channel(target, options=[("grpc.use_local_subchannel_pool", 1),
                                                  ("grpc.max_send_message_length", -1)])  # fmt: skip


def shape_call(data: bytes) -> bytes:
    """A serialized Shape-25 call on `data`: its answer is tiny, what the server holds is the
    message's."""
    request = pb.ModelInferRequest(model_name="Shape", model_version="25")
    request.inputs.add(name="data", datatype="UINT8", shape=[len(data)])
    request.raw_input_contents.append(data)
    return request.SerializeToString()


def tile_call(contents: int = 2) -> pb.ModelInferRequest:
    request = pb.ModelInferRequest(model_name="Tile", model_version="13")
    request.inputs.add(name="input", datatype="FP32", shape=[2, 3])
    request.inputs.add(name="repeats", datatype="INT64", shape=[2])
    raw = [np.ones(6, np.float32).tobytes(), np.array([2, 1], np.int64).tobytes()]
    request.raw_input_contents.extend((raw * contents)[:contents])
    return request


@dataclass
class Watch:
    """The server's peak RSS and the slowest small call seen while the block ran, and the
    slowest of a second before it (this host's own pace now)."""

    peak: int = 0
    slowest: float = 0.0
    failures: list[str] = field(default_factory=list)
    before: float = 0.0

    def within(self, seconds: float) -> float:
        """How slow a small call may be: `seconds`, or 4 x the slowest before on a busy host."""
        return max(seconds, 4 * self.before)

    @property
    def allowed(self) -> float:
        return self.within(2.0)


@contextmanager
def watching(served: Served, metadata: tuple[tuple[str, str], ...] = ()) -> Iterator[Watch]:
    """Sample the server's RSS and a small ModelInfer's latency (sent with `metadata`) every
    50 ms, for a second before the block (`before`) and while it runs."""
    watch = Watch()
    with in_background(partial(_sample, served, metadata, watch)):
        time.sleep(1)
    watch.before, watch.slowest, watch.peak = watch.slowest, 0.0, 0
    with in_background(partial(_sample, served, metadata, watch)):
        yield watch


def _sample(served: Served, metadata: tuple[tuple[str, str], ...], watch: Watch,
            stop: threading.Event) -> None:  # fmt: skip
    """Every 50 ms until `stop`: the server's RSS and one small call's latency."""
    with grpc.insecure_channel(served.target,
                               options=[("grpc.use_local_subchannel_pool", 1)]) as channel:  # fmt: skip
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        while not stop.is_set():
            watch.peak = max(watch.peak, served.http.rss_bytes())
            started = time.perf_counter()
            try:
                stub.ModelInfer(tile_call(), metadata=metadata, timeout=10)
            except grpc.RpcError as exc:
                watch.failures.append(f"{exc.code()}: {exc.details()}")
            watch.slowest = max(watch.slowest, time.perf_counter() - started)
            stop.wait(0.05)


def at_once(served: Served, count: int, call: Callable[[grpc.Channel], object]) -> list[object]:
    """`call` on `count` connections of their own, from threads started together."""
    channels = [connection(served.target) for _ in range(count)]
    for channel in channels:
        grpc.channel_ready_future(channel).result(timeout=10)
    found: list[object] = [None] * count
    barrier = threading.Barrier(count)

    def run(i: int) -> None:
        barrier.wait()
        found[i] = call(channels[i])

    threads = [threading.Thread(target=run, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    for channel in channels:
        channel.close()
    return found


@dataclass(frozen=True)
class Outcome:
    code: grpc.StatusCode
    seconds: float
    retry_after: str | None = None
    details: str = ""


def unary(
    data: bytes, compression: grpc.Compression | None = None
) -> Callable[[grpc.Channel], Outcome]:
    def call(channel: grpc.Channel) -> Outcome:
        started = time.monotonic()
        try:
            channel.unary_unary(INFER)(data, timeout=60, compression=compression)
        except grpc.RpcError as exc:
            hint = dict(exc.trailing_metadata() or ()).get("retry-after")  # type: ignore[attr-defined]
            return Outcome(exc.code(), time.monotonic() - started, hint, exc.details() or "")  # type: ignore[attr-defined]
        return Outcome(grpc.StatusCode.OK, time.monotonic() - started)

    return call


NEAR_IDLE = 64 * MiB
"""RSS over idle that counts as back: grpc core's and the allocator's pools after the first
large messages (a loaded CI run measured 48.3 MiB after 12 x 48 MiB; before the bounds, over
1,000 MiB stayed)."""


def settled(served: Served, idle: int, within: float = 10.0) -> int:
    """The server's RSS over `idle` once it has come back near idle (or after `within` s)."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        over = served.http.rss_bytes() - idle
        if over < NEAR_IDLE:
            return over
        time.sleep(0.2)
    return served.http.rss_bytes() - idle


def no_traceback(log: Path) -> None:
    text = log.read_text(errors="replace")
    assert "Traceback" not in text, text[-3000:]


@pytest.fixture(scope="module")
def bounded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Served, Path]]:
    log = tmp_path_factory.mktemp("log") / "server.log"
    with serve_grpc(log_to=log, **SETTINGS) as served:
        yield served, log


def _held_to_the_budget(served: Served, log: Path, outcomes: list[object], idle: int,
                        watch: Watch, margin: int = MARGIN) -> None:  # fmt: skip
    codes = {o.code for o in outcomes}  # type: ignore[attr-defined]
    assert codes <= {grpc.StatusCode.OK, grpc.StatusCode.RESOURCE_EXHAUSTED}, outcomes
    assert grpc.StatusCode.OK in codes, outcomes
    for outcome in outcomes:
        if outcome.code == grpc.StatusCode.RESOURCE_EXHAUSTED:  # type: ignore[attr-defined]
            assert outcome.retry_after == "1", outcome  # HTTP's Retry-After
    assert watch.peak - idle < BUDGET + margin, (watch.peak - idle) / MiB
    # a small call waits for the large read in progress at most: the fastest large call
    # answered took about that (and its run) here, now; 3 s at least (2.4 s once with another
    # job taking a core: a small call refused for room is a failure, whatever its time)
    fastest = min(o.seconds for o in outcomes if o.code == grpc.StatusCode.OK)  # type: ignore[attr-defined]
    allowed = max(watch.within(3.0), 2 * fastest)
    assert not watch.failures and watch.slowest < allowed, (watch.failures, watch.slowest, allowed)
    assert settled(served, idle) < NEAR_IDLE
    no_traceback(log)


def test_concurrent_large_messages_are_held_to_the_budget(bounded: tuple[Served, Path]) -> None:
    """12 clients at once, each a 48 MiB ModelInfer on a connection of its own (576 MiB of
    messages against a 256 MiB budget): the overflow waits for room or is refused."""
    served, log = bounded
    data = shape_call(np.random.default_rng(1).bytes(48 * MiB))
    idle = served.http.rss_bytes()
    with watching(served) as watch:
        outcomes = at_once(served, 12, unary(data))
    slowest = max(o.seconds for o in outcomes)  # type: ignore[attr-defined]
    assert slowest < 20, outcomes
    _held_to_the_budget(served, log, outcomes, idle, watch)


@pytest.mark.slow  # messages inflated to hundreds of MB at once
def test_concurrent_compressed_messages_inflate_under_the_budget(
    bounded: tuple[Served, Path],
) -> None:
    """10 deflate calls at once, each ~50 KiB on the wire inflating to 50 MiB."""
    served, log = bounded
    data = shape_call(bytes(50 * MiB))
    idle = served.http.rss_bytes()
    with watching(served) as watch:
        outcomes = at_once(served, 10, unary(data, grpc.Compression.Deflate))
    _held_to_the_budget(served, log, outcomes, idle, watch)


def test_concurrent_compressed_stream_messages_inflate_under_the_budget(
    bounded: tuple[Served, Path],
) -> None:
    """8 streams at once, each one gzip message of ~40 KiB inflating to 40 MiB (a stream's
    reads take no lease: its inflating is what is bounded)."""
    served, log = bounded
    data = shape_call(bytes(40 * MiB))

    def call(channel: grpc.Channel) -> Outcome:
        started = time.monotonic()
        stream = channel.stream_stream(STREAM)(iter([data]), timeout=60,
                                               compression=grpc.Compression.Gzip)  # fmt: skip
        try:
            answers = [pb.ModelStreamInferResponse.FromString(a) for a in stream]
        except grpc.RpcError as exc:
            hint = dict(exc.trailing_metadata() or ()).get("retry-after")  # type: ignore[attr-defined]
            return Outcome(exc.code(), time.monotonic() - started, hint)  # type: ignore[attr-defined]
        refused = answers[0].error_message
        code = grpc.StatusCode.RESOURCE_EXHAUSTED if "busy" in refused else (
            grpc.StatusCode.UNKNOWN if refused else grpc.StatusCode.OK)  # fmt: skip
        return Outcome(code, time.monotonic() - started, "1" if refused else None, refused)

    idle = served.http.rss_bytes()
    with watching(served) as watch:
        outcomes = at_once(served, 8, call)
    # no free read here (streams take no lease): the slack alone above the budget
    _held_to_the_budget(served, log, outcomes, idle, watch, margin=MARGIN - 3 * MESSAGE)


def test_a_gzip_bomb_is_refused_at_the_size_limit(bounded: tuple[Served, Path]) -> None:
    """256 MiB of zeros sent gzip (as grpc compresses), and the same as a raw gzip stream."""
    served, log = bounded
    zeros = shape_call(bytes(256 * MiB))
    started = time.monotonic()
    bomb = gzip.compress(zeros, compresslevel=1)
    # this host's pace now: grpc's client compresses as much at its own level (3-4 x level
    # 1's time, on a loaded host), the server inflates a quarter
    pace = max(5.0, 8 * (time.monotonic() - started))
    idle = served.http.rss_bytes()
    with watching(served) as watch:
        outcomes = [unary(zeros, grpc.Compression.Gzip)(channel)
                    for channel in (connection(served.target),)]  # fmt: skip
        outcomes.append(unary(bomb)(connection(served.target)))
    for outcome in outcomes:
        assert outcome.code == grpc.StatusCode.RESOURCE_EXHAUSTED, outcome
        assert outcome.details == ("the decompressed message is over the limit of 67108864 "
                                   "bytes (OPSERVE_MAX_REQUEST_BYTES)")  # fmt: skip
        assert outcome.seconds < pace, (outcome, pace)
    # two inflated messages at most (the first's pages may still be held when the second
    # inflates: the heap is trimmed once the budget is idle), and grpc's and Python's own: a
    # clean-clone .ci/run beside a cluster test measured 132 MiB; unbounded, 512 MiB
    assert watch.peak - idle < 2 * MESSAGE + 16 * MiB, (watch.peak - idle) / MiB
    assert not watch.failures and watch.slowest < watch.allowed, (
        watch.failures,
        watch.slowest,
        watch.allowed,
    )
    no_traceback(log)


TRUNCATED = tile_call().SerializeToString()[:-3]  # the last raw content cut short


@pytest.mark.parametrize(("method", "data", "name"), [
    (INFER, b"\xff\xff\xff\xff\xff", "inference.ModelInferRequest"),
    (INFER, TRUNCATED, "inference.ModelInferRequest"),
    ("/inference.GRPCInferenceService/ModelMetadata", b"\x0a\x10abc",
     "inference.ModelMetadataRequest"),
    ("/grpc.health.v1.Health/Check", b"\x0a", "grpc.health.v1.HealthCheckRequest"),
    (INFER, zlib.compress(b"\x0a\x05Shape\xff\xff"), "inference.ModelInferRequest"),
])  # fmt: skip
def test_a_malformed_message_is_invalid_argument(bounded: tuple[Served, Path], method: str,
                                                 data: bytes, name: str) -> None:  # fmt: skip
    served, log = bounded
    with connection(served.target) as channel:
        started = time.monotonic()
        with pytest.raises(grpc.RpcError) as refused:
            channel.unary_unary(method)(data, timeout=5)
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT  # type: ignore[attr-defined]
    details = refused.value.details()  # type: ignore[attr-defined]
    assert details.startswith(f"the request is not a valid {name} message ("), details
    assert time.monotonic() - started < 2
    deadline = time.monotonic() + 10  # the access log writes its lines every 50 ms
    while time.monotonic() < deadline:
        lines = [line for line in log.read_text().splitlines() if method in line]
        if lines and '"status":3' in lines[-1].replace(" ", ""):
            break
        time.sleep(0.1)
    no_traceback(log)
    assert lines and '"status":3' in lines[-1].replace(" ", ""), lines[-3:]  # its access line


def test_a_malformed_stream_message_ends_the_stream(bounded: tuple[Served, Path]) -> None:
    served, log = bounded
    good = tile_call().SerializeToString()
    with connection(served.target) as channel:
        answers = channel.stream_stream(STREAM)(iter([good, b"\xff\xff\xff"]), timeout=5)
        first = pb.ModelStreamInferResponse.FromString(next(answers))
        with pytest.raises(grpc.RpcError) as refused:
            next(answers)
    assert not first.error_message
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT  # type: ignore[attr-defined]
    no_traceback(log)


@pytest.mark.parametrize("contents", [3, 5])
def test_extra_raw_contents_are_refused(bounded: tuple[Served, Path], contents: int) -> None:
    served, _log = bounded
    with grpc.insecure_channel(served.target) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        with pytest.raises(grpc.RpcError) as refused:
            stub.ModelInfer(tile_call(contents), timeout=5)
        streamed = list(stub.ModelStreamInfer(iter([tile_call(contents)]), timeout=5))
    expected = (f"unexpected additional input data for model 'Tile': {contents} "
                "raw_input_contents for 2 inputs that take raw contents")  # fmt: skip
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT  # type: ignore[attr-defined]
    assert refused.value.details() == f"Tile-13: {expected}"  # type: ignore[attr-defined]
    assert streamed[0].error_message == f"Tile-13: {expected}"
