"""CPU per request of the service's own code, in process: no sockets, no uvicorn, no grpc.aio.

The small Tile-13 request of bench_http.py goes 3,000 times through the app's ASGI entry (v1,
V2 JSON and V2 binary, as tritonclient.http sends it), and 20,000 times through
ModelStreamInfer's stream handler over a stand-in gRPC context whose reads complete a loop
turn later, as grpc.aio's do. Each figure is the best of
`--runs` timed runs (process CPU time). On a VM shared with other jobs the server benchmarks'
figures moved by half from one server process to the next; these move by a few percent, so
they are the ones to compare a change with (`--tree` measures another checkout, e.g. a git
worktree of the commit before). It also prints how much slower plain code runs right after a
request of each HTTP lane (1.00x: no slower; see `_aftermath`).

    python bench/bench_inprocess.py
    git worktree add /tmp/before HEAD~1 && python bench/bench_inprocess.py --tree /tmp/before
"""

import argparse
import asyncio
import os
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.append(str(ROOT))  # after --tree's checkout, which must win for `service`

# bench_http's requests, so both benches time the same calls (it imports nothing of service)
from bench.bench_http import GRPC_REQUEST, HEADERS, JSON_HEADERS, LANES  # noqa: E402


def _scope(path: str, body: bytes) -> dict:
    """The ASGI scope of bench_http's POST of `body` to `path`."""
    return {"type": "http", "method": "POST", "path": path, "raw_path": path.encode(),
            "query_string": b"", "http_version": "1.1", "scheme": "http",
            "server": ("127.0.0.1", 8000), "client": ("127.0.0.1", 1), "root_path": "",
            "headers": [(b"host", b"x"), (b"content-length", str(len(body)).encode()),
                        *((k.lower().encode(), v.encode())
                          for k, v in HEADERS.get(body, JSON_HEADERS).items())]}  # fmt: skip


def _caller(app: object, path: str, body: bytes) -> tuple[Callable[[], Awaitable[None]], list[int]]:
    """One call of bench_http's POST of `body` to `path` through the app's ASGI entry, and the
    list of statuses it answered."""
    scope = _scope(path, body)
    statuses: list[int] = []

    async def receive() -> dict:
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(message: dict) -> None:
        if message["type"] == "http.response.start":
            statuses.append(message["status"])

    async def call() -> None:
        await app(dict(scope), receive, send)  # type: ignore[operator]

    return call, statuses


def _check(path: str, statuses: list[int]) -> None:
    if set(statuses) != {200}:
        raise RuntimeError(f"{path} answered {sorted(set(statuses))}")


async def _http(app: object, path: str, body: bytes, calls: int, runs: int) -> float:
    call, statuses = _caller(app, path, body)
    best = float("inf")
    for _ in range(runs):
        started = time.process_time()
        for _ in range(calls):
            await call()
        best = min(best, (time.process_time() - started) / calls * 1e6)
    _check(path, statuses)
    return best


async def _aftermath(app: object, path: str, body: bytes) -> float:
    """How much slower plain code runs right after one request than after another turn of
    plain code (1.00: not at all). orjson.loads of a string left the core about 15% slower for
    a few hundred microseconds on an AVX-512 Xeon (service/codecs/json_tensor.common_json): a
    request path that does so again shows here as about 1.15."""
    call, statuses = _caller(app, path, body)
    numbers = list(range(100_000))  # summed in about 0.65 ms: inside the slow spell
    after_plain = after_request = float("inf")
    for _ in range(30):
        started = time.perf_counter()
        sum(numbers)  # after the last sum: plain code before it
        after_plain = min(after_plain, time.perf_counter() - started)
        await call()
        started = time.perf_counter()
        sum(numbers)
        after_request = min(after_request, time.perf_counter() - started)
    _check(path, statuses)
    return after_request / after_plain


async def _stream(app: object, requests: int, runs: int) -> float:
    from types import SimpleNamespace

    import grpc
    from tritonclient.grpc import service_pb2 as pb

    from service.grpc.servicer import Servicer
    from service.grpc.stream import InferStream

    try:  # the door reads messages as bytes and parses them itself
        from service.core.message_room import MessageRoom
        from service.grpc.door import Incoming
        from service.grpc.messages import Messages
    except ImportError:  # a tree from before: grpc.aio parses them
        Incoming = None  # type: ignore[assignment,misc]
    state = app.state  # type: ignore[attr-defined]
    # what a read gives: the message's bytes (the door's way), or the message (before)
    message = (
        GRPC_REQUEST if Incoming is not None else pb.ModelInferRequest.FromString(GRPC_REQUEST)
    )

    class Context:  # what the stream and the door use of grpc.aio's ServicerContext
        def __init__(self, count: int) -> None:
            self.left, self.answers = count, []

        async def read(self) -> object:
            if not self.left:
                return grpc.aio.EOF
            self.left -= 1
            await asyncio.sleep(0)  # a read completes on a later turn of the loop
            return message

        async def write(self, message: bytes) -> None:
            self.answers.append(len(message))

    servicer = Servicer(state.plane, state.memory_budget, 30.0)
    best = float("inf")
    for _ in range(runs):
        context = Context(requests)
        requests_in = None
        if Incoming is not None:  # the door's part: its messages and idle deadline
            budget = state.memory_budget
            messages = Messages(MessageRoom(budget, 64 << 20, 2), state.offloader, 64 << 20)
            door = SimpleNamespace(messages=messages, idle_timeout=300.0, budget=budget)
            requests_in = Incoming(door, context, pb.ModelInferRequest.FromString)  # type: ignore[arg-type]
        started = time.process_time()
        await InferStream(servicer, context, servicer.stream_window).run(requests_in)  # type: ignore[arg-type]
        best = min(best, (time.process_time() - started) / requests * 1e6)
        if len(context.answers) != requests:
            raise RuntimeError(f"{len(context.answers)} answers to {requests} requests")
    return best


async def _main(args: argparse.Namespace) -> None:
    from service.main import create_app
    from service.settings import Settings

    # the access log on, as the service runs by default, its lines to /dev/null
    app = create_app(Settings(grpc_port=0))
    with open(os.devnull, "w") as devnull:
        sys.stdout, shown = devnull, sys.stdout
        try:
            figures = await _measure(app, args)
        finally:
            sys.stdout = shown
    for lane, us in figures.items():
        if lane.startswith("after "):
            print(f"plain code right after a {lane[6:]} request: {us:.2f}x its time")
        else:
            print(f"{lane:12} {us:6.1f} us")


async def _measure(app: object, args: argparse.Namespace) -> dict[str, float]:
    figures = {}
    async with app.router.lifespan_context(app):  # type: ignore[attr-defined]
        for lane in ("v1", "v2", "v2-binary"):
            path, body = LANES[lane]
            await _http(app, path, body, 300, 1)  # warm-up
            figures[lane] = await _http(app, path, body, args.calls, args.runs)
        for lane in ("v1", "v2", "v2-binary"):
            figures[f"after {lane}"] = await _aftermath(app, *LANES[lane])
        await _stream(app, 2000, 1)
        figures["grpc-stream"] = await _stream(app, args.requests, args.runs)
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--calls", type=int, default=3000)
    parser.add_argument("--requests", type=int, default=20000)
    parser.add_argument("--tree", type=Path, default=ROOT, help="the checkout to measure")
    args = parser.parse_args()
    sys.path.insert(0, str(args.tree.resolve()))
    os.environ.setdefault("OPSERVE_METRICS_DIR", tempfile.mkdtemp(prefix="bench-metrics-"))
    print(f"tree {args.tree}; best of {args.runs} runs; CPU us per request")
    import uvloop

    uvloop.run(_main(args))


if __name__ == "__main__":
    main()
