"""The reusable guards of issue 9 in-process: memory budget, body deadline, Content-Type,
API keys, the encoded-answer limit and streamed answers."""

import asyncio
import os
import re
import threading

import numpy as np
import orjson
import pytest
from fastapi.testclient import TestClient

from service.api.body_limit import ClientGone, read_body
from service.core.deadlines import within
from service.core.memory_budget import MemoryBudget, NeedMemory, Reservation
from service.errors import BadRequest, Overloaded, PayloadTooLarge, RequestTimeout
from service.main import create_app
from service.settings import Settings

SMALL = {"inputs": {"input": {"dtype": "float", "shape": [2], "data": [1, 2]},
                    "repeats": {"dtype": "int64", "data": [2]}}}  # fmt: skip


def _fill(count: int, fmt: str = "json", dtype: str = "float", value: object = 1.5) -> dict:
    return {"inputs": {"input": {"dtype": "int64", "data": [count]}},
            "attributes": {"value": {"dtype": dtype, "shape": [1], "data": [value]}},
            "output_format": fmt}  # fmt: skip


# --- memory budget -------------------------------------------------------------------------


def test_claims_take_free_memory_and_raise_need_memory_when_short() -> None:
    budget = MemoryBudget(100, wait_seconds=0)
    first, second = Reservation(budget), Reservation(budget)
    first.claim(60)
    with pytest.raises(NeedMemory) as need:
        second.claim(50)
    assert need.value.nbytes == 50 and budget.used == 60
    first.release()
    second.claim(50)
    assert budget.used == 50


def test_a_share_over_the_whole_budget_is_413_at_once() -> None:
    with pytest.raises(PayloadTooLarge, match="OPSERVE_MEMORY_BUDGET_BYTES"):
        Reservation(MemoryBudget(100, wait_seconds=5)).claim(101)


def test_run_waits_for_memory_then_runs_the_work_again() -> None:
    budget = MemoryBudget(100, wait_seconds=2)
    other = Reservation(budget)
    other.claim(80)
    held = Reservation(budget)
    attempts = []

    async def work() -> str:
        attempts.append(budget.used)
        held.claim(50)
        return "done"

    async def scenario() -> str:
        asyncio.get_running_loop().call_later(0.05, other.release)
        return await held.run(work)

    assert asyncio.run(scenario()) == "done"
    assert len(attempts) == 2 and held.held == 50 and budget.used == 50
    held.release()
    assert budget.used == 0


def test_run_gives_up_with_503_after_the_wait() -> None:
    budget = MemoryBudget(100, wait_seconds=0.05)
    Reservation(budget).claim(80)
    held = Reservation(budget)

    async def work() -> None:
        held.claim(50)

    with pytest.raises(Overloaded):
        asyncio.run(held.run(work))
    assert budget.used == 80


def test_an_overloaded_server_answers_503_with_retry_after() -> None:
    app = create_app(Settings(memory_budget_bytes=32 * 2**20, memory_wait_seconds=0.05))
    with TestClient(app) as client:
        answer = client.post("/v1/ops/ConstantOfShape/25", json=_fill(10 << 20))  # 40 MiB
        assert answer.status_code == 413  # more than the whole budget: never possible
        assert "OPSERVE_MEMORY_BUDGET_BYTES" in answer.json()["detail"]
        busy = Reservation(app.state.memory_budget)
        busy.claim(24 * 2**20)  # another request holds most of it
        answer = client.post("/v1/ops/ConstantOfShape/25", json=_fill(3 << 20))  # 12 MiB
        assert answer.status_code == 503 and answer.headers["retry-after"] == "1"
        assert client.post("/v1/ops/Tile/13", json=SMALL).status_code == 200  # small: no wait
        busy.release()
        assert client.post("/v1/ops/ConstantOfShape/25", json=_fill(3 << 20)).status_code == 200
        assert app.state.memory_budget.used == 0


def test_small_requests_never_touch_the_budget() -> None:
    app = create_app(Settings(memory_budget_bytes=16 * 2**20, memory_wait_seconds=0))
    with TestClient(app) as client:
        assert client.post("/v1/ops/Tile/13", json=SMALL).status_code == 200


# --- body deadline ---------------------------------------------------------------------------


def test_read_body_times_out_with_408() -> None:
    async def stalled() -> dict:
        await asyncio.sleep(10)
        return {}

    with pytest.raises(RequestTimeout, match=r"did not all arrive within 0\.05 s"):
        asyncio.run(read_body(stalled, 1000, 0.05))


def test_within_raises_its_own_error_past_the_deadline_and_passes_other_cancellations() -> None:
    """body_limit.within (gRPC's answer writes): `late()` past the deadline; a step that ends
    in time returns its value; a cancellation by anyone else stays a cancellation."""

    class Late(Exception):
        pass

    async def scenario() -> tuple[object, ...]:
        quick = await within(asyncio.sleep(0, "done"), 5, Late)
        started = asyncio.get_running_loop().time()
        with pytest.raises(Late):
            await within(asyncio.sleep(30), 0.05, Late)
        took = asyncio.get_running_loop().time() - started
        other = asyncio.create_task(within(asyncio.sleep(30), 5, Late))
        await asyncio.sleep(0.01)
        other.cancel()
        with pytest.raises(asyncio.CancelledError):
            await other
        return quick, took, asyncio.current_task().cancelling()  # type: ignore[union-attr]

    quick, took, cancelling = asyncio.run(scenario())
    assert quick == "done" and took < 1.0 and cancelling == 0


def test_reads_one_after_another_share_one_deadline_ticker() -> None:
    """A request's read that waits registers its deadline; the next request's, a loop turn
    later, finds the same ticker still running (a ticker made per request cost a task each)."""
    from service.core.deadlines import DEADLINES

    async def receive() -> dict:
        await asyncio.sleep(0)  # the body is not there yet: the read waits, under its deadline
        return {"type": "http.request", "body": b"ab", "more_body": False}

    async def scenario() -> set[int]:
        tickers = set()
        for _ in range(5):
            assert await read_body(receive, 1000, 5) == b"ab"
            tickers.add(id(DEADLINES.ticker))
            await asyncio.sleep(0)  # the loop turns between requests, as a server's does
            await asyncio.sleep(0)
        return tickers

    tickers = asyncio.run(scenario())
    assert len(tickers) == 1 and id(None) not in tickers


def _deadlines_started(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """The timeouts of the deadlines read_body registers from now on."""
    from service.core.deadlines import DEADLINES

    started: list[float] = []
    start = DEADLINES.start
    monkeypatch.setattr(
        DEADLINES, "start", lambda timeout: started.append(timeout) or start(timeout)
    )
    return started


def _messages(*steps: tuple[bool, dict]) -> object:
    """A receive giving each message, after a loop turn when its flag says it waits."""
    pending = list(steps)

    async def receive() -> dict:
        waits, message = pending.pop(0)
        if waits:
            await asyncio.sleep(0)
        return message

    return receive


def _part(body: bytes, more: bool = False) -> dict:
    return {"type": "http.request", "body": body, "more_body": more}


def test_a_body_that_arrived_with_its_headers_is_read_without_a_deadline(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    started = _deadlines_started(monkeypatch)
    receive = _messages((False, _part(b"abc")))
    assert asyncio.run(read_body(receive, 1000, 5)) == b"abc"
    assert started == []
    with pytest.raises(PayloadTooLarge):  # the limit holds at once
        asyncio.run(read_body(_messages((False, _part(b"x" * 11))), 10, 5))
    with pytest.raises(ClientGone):
        asyncio.run(read_body(_messages((False, {"type": "http.disconnect"})), 10, 5))
    assert started == []


@pytest.mark.parametrize("waits", [(True,), (False, True), (True, False), (True, True)])
def test_a_read_that_waits_keeps_its_deadline_from_the_first_wait(
    monkeypatch: pytest.MonkeyPatch, waits: tuple[bool, ...]
) -> None:
    """Each part after a loop turn or at once: the body is whole, and the deadline is
    registered once, when the read first waits."""
    started = _deadlines_started(monkeypatch)
    parts = [_part(b"%d" % i, more=i < len(waits) - 1) for i in range(len(waits))]
    receive = _messages(*zip(waits, parts, strict=True))
    body = asyncio.run(read_body(receive, 1000, 5))
    assert body == b"".join(b"%d" % i for i in range(len(waits)))
    assert started == [5]
    from service.core.deadlines import DEADLINES

    assert not DEADLINES.steps  # unregistered once read


class _NextOnly:
    """An awaitable whose __await__ is a plain iterator (__next__ only), as ASGI allows and
    granian's receive gives: `turns` bare yields (loop turns), then the message."""

    def __init__(self, message: dict, turns: int) -> None:
        self.message, self.turns = message, turns

    def __await__(self) -> "_NextOnly":
        return self

    def __iter__(self) -> "_NextOnly":
        return self

    def __next__(self) -> None:
        if self.turns:
            self.turns -= 1
            return None
        raise StopIteration(self.message)


@pytest.mark.parametrize("turns", [0, 2])
def test_a_receive_of_a_plain_iterator_is_read_as_await_reads_it(
    monkeypatch: pytest.MonkeyPatch, turns: int
) -> None:
    started = _deadlines_started(monkeypatch)
    parts = iter([_part(b"ab", more=True), _part(b"cd")])
    body = asyncio.run(read_body(lambda: _NextOnly(next(parts), turns), 1000, 5))
    assert body == b"abcd"
    assert started == ([5] if turns else [])
    stalled = _NextOnly(_part(b"never"), turns=10**9)
    with pytest.raises(RequestTimeout):  # the deadline still cancels it (at its bare yields)
        asyncio.run(read_body(lambda: stalled, 1000, 0.05))


def test_a_read_cancelled_while_it_waits_stays_cancelled_and_its_receive_sees_it() -> None:
    """A cancellation that is not the deadline's (a shutdown) reaches the waiting receive,
    which may answer it (here with a disconnect: ClientGone), or let it through."""
    seen: list[str] = []

    async def scenario(answers: bool) -> None:
        arrived = asyncio.Event()

        async def receive() -> dict:
            try:
                await arrived.wait()
            except asyncio.CancelledError:
                seen.append("cancelled")
                if answers:
                    return {"type": "http.disconnect"}
                raise
            return _part(b"late")

        reading = asyncio.create_task(read_body(receive, 1000, 5))
        await asyncio.sleep(0.01)
        reading.cancel()
        await reading

    with pytest.raises(asyncio.CancelledError):
        asyncio.run(scenario(answers=False))
    with pytest.raises(ClientGone):
        asyncio.run(scenario(answers=True))
    assert seen == ["cancelled", "cancelled"]


def test_read_body_reserves_what_arrives() -> None:
    budget = MemoryBudget(1000, wait_seconds=0)
    held = Reservation(budget)
    messages = iter([{"type": "http.request", "body": b"ab", "more_body": True},
                     {"type": "http.request", "body": b"cd", "more_body": False}])  # fmt: skip

    async def receive() -> dict:
        return next(messages)

    assert asyncio.run(read_body(receive, 1000, 1, held)) == b"abcd"
    assert held.held == 4


def _open_descriptors() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.mark.skipif(not hasattr(os, "memfd_create"), reason="memory files are Linux's")
def test_a_large_body_is_copied_out_of_its_memory_file_off_the_event_loop(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A body declared MAPPED_BODY_BYTES or longer is gathered as it arrives and read out
    whole on a thread, with the GIL released (os.pread): copied on the event loop, 64 MB held
    every other request 45-88 ms. The body is exact, and its memory file is closed."""
    from service.api import body_limit

    read_on: list[str] = []
    pread = os.pread

    def recorded(fd: int, length: int, offset: int) -> bytes:
        read_on.append(threading.current_thread().name)
        return pread(fd, length, offset)

    monkeypatch.setattr(os, "pread", recorded)
    rng = np.random.default_rng(5)
    body = rng.integers(0, 256, body_limit.MAPPED_BODY_BYTES * 3 + 7, dtype=np.uint8).tobytes()
    cuts = sorted(rng.choice(len(body), 40, replace=False))
    parts = [body[a:b] for a, b in zip([0, *cuts], [*cuts, len(body)], strict=True)]
    before = _open_descriptors()

    async def scenario() -> tuple[bytes, str]:
        receive = _messages(*((i % 3 == 0, _part(p, more=i < len(parts) - 1))
                              for i, p in enumerate(parts)))  # fmt: skip
        read = await read_body(receive, len(body), 5, None, len(body))  # type: ignore[arg-type]
        return read, threading.current_thread().name

    read, loop_thread = asyncio.run(scenario())
    assert read == body
    assert read_on and loop_thread not in read_on, (read_on, loop_thread)
    assert _open_descriptors() == before
    longer = _messages((False, _part(body[:100], more=True)), (True, _part(body)))
    with pytest.raises(BadRequest, match="longer than its Content-Length"):
        asyncio.run(read_body(longer, 10 * len(body), 5, None, len(body)))  # type: ignore[arg-type]
    assert _open_descriptors() == before


# --- Content-Type ----------------------------------------------------------------------------


@pytest.mark.parametrize("content_type", [None, "text/plain", "application/x-www-form-urlencoded",
                                          "multipart/form-data; boundary=x", "application/xml"])  # fmt: skip
def test_operator_posts_refuse_other_content_types(content_type: str | None) -> None:
    headers = {"content-type": content_type} if content_type else {}
    with TestClient(create_app()) as client:
        answer = client.post("/v1/ops/Tile/13", content=orjson.dumps(SMALL), headers=headers)
    assert answer.status_code == 415
    assert "application/json" in answer.json()["detail"]


@pytest.mark.parametrize("content_type", ["application/json", "Application/JSON; charset=utf-8"])
def test_operator_posts_take_json(content_type: str) -> None:
    with TestClient(create_app()) as client:
        answer = client.post("/v1/ops/Tile/13", content=orjson.dumps(SMALL),
                             headers={"content-type": content_type})  # fmt: skip
    assert answer.status_code == 200


# --- API keys --------------------------------------------------------------------------------


def test_api_keys_guard_every_route_but_health_metrics_and_docs() -> None:
    with TestClient(create_app(Settings(api_keys="k1, k2"))) as client:
        assert client.post("/v1/ops/Tile/13", json=SMALL).status_code == 401
        assert client.get("/v1/ops").status_code == 401
        assert client.get("/v1/models").status_code == 401
        assert client.get("/docsx").status_code == 401  # the docs' paths are exact, not prefixes
        wrong = client.get("/v1/ops", headers={"authorization": "Bearer k3"})
        assert wrong.status_code == 401 and wrong.headers["www-authenticate"].startswith("Bearer")
        assert client.get("/v1/ops", headers={"authorization": "Basic k1"}).status_code == 401
        refused = client.post("/v2/models/Tile/infer", headers={"x-request-id": "no-key-1"})
        assert refused.status_code == 401 and refused.headers["x-request-id"] == "no-key-1"
        scrape = client.get("/metrics").text  # refusals are counted under their own label
        assert re.search(r'opserve_requests_total\{[^}]*route="unauthorized"[^}]*\} [1-9]', scrape)
        assert client.get("/v2/health/ready").status_code == 200
        for key in ("k1", "k2"):
            headers = {"authorization": f"Bearer {key}"}
            assert client.post("/v1/ops/Tile/13", json=SMALL, headers=headers).status_code == 200


def test_no_api_keys_by_default() -> None:
    with TestClient(create_app()) as client:
        assert client.get("/v1/ops").status_code == 200
        document = client.get("/openapi.json").json()
    assert "security" not in document and "securitySchemes" not in document["components"]


def test_with_api_keys_the_docs_open_and_declare_the_bearer_scheme() -> None:
    """A browser cannot send a key to load Swagger UI; the document then tells Swagger UI to
    offer Authorize and send the key with every call but the open ones."""
    with TestClient(create_app(Settings(api_keys="k1"))) as client:
        for page in (
            "/docs",
            "/redoc",
            "/static/docs/swagger-ui.css",
            "/static/docs/redoc.offline.js",
        ):
            assert client.get(page).status_code == 200, page
        answer = client.get("/openapi.json")
        assert answer.status_code == 200
        document = answer.json()
        assert client.post("/v1/ops/Tile/13", json=SMALL).status_code == 401
        headers = {"authorization": "Bearer k1"}
        assert client.post("/v1/ops/Tile/13", json=SMALL, headers=headers).status_code == 200
    (scheme,) = document["components"]["securitySchemes"].values()
    assert (scheme["type"], scheme["scheme"]) == ("http", "bearer")
    assert document["security"] == [
        {name: []} for name in document["components"]["securitySchemes"]
    ]
    for path, operations in document["paths"].items():
        for operation in operations.values():
            open_route = path.startswith(("/v2/health/", "/metrics"))
            assert ("security" in operation) == open_route and operation.get("security", []) == []


# --- encoded answers -------------------------------------------------------------------------


def test_answers_over_the_answer_limit_are_413_before_the_work() -> None:
    with TestClient(create_app(Settings(max_answer_bytes=1 << 20))) as client:
        answer = client.post("/v1/ops/ConstantOfShape/25", json=_fill(1 << 17, dtype="double"))
        assert answer.status_code == 413
        assert "OPSERVE_MAX_ANSWER_BYTES" in answer.json()["detail"]
        # the same tensor as base64 (4/3 of 1 MiB) passes
        answer = client.post(
            "/v1/ops/ConstantOfShape/25", json=_fill(1 << 16, "tensor_proto", "double")
        )
        assert answer.status_code == 200


@pytest.mark.parametrize("fmt", ["json", "tensor_proto"])
@pytest.mark.parametrize(("dtype", "value"), [("float", 1.5), ("float", "NaN"), ("double", -0.1),
                                               ("bfloat16", "-Infinity"), ("int8", -7),
                                               ("bool", True), ("float8e4m3fn", 0.5),
                                               ("int4", -3)])  # fmt: skip
def test_streamed_answers_equal_the_whole_ones(fmt: str, dtype: str, value: object) -> None:
    """A large answer (streamed, off the event loop) decodes to what a small one (whole,
    inline) says, element for element."""
    count = (1 << 20) + 5  # over INLINE_OUTPUT_BYTES and STREAM_BYTES for every type here
    with TestClient(create_app()) as client:
        small = client.post("/v1/ops/ConstantOfShape/25", json=_fill(3, fmt, dtype, value))
        large = client.post("/v1/ops/ConstantOfShape/25", json=_fill(count, fmt, dtype, value))
    assert small.status_code == large.status_code == 200, large.text[:300]
    if fmt == "tensor_proto":
        assert "content-length" in large.headers
        from service.codecs.limits import Limits
        from service.codecs.tensor_proto import decode_tensor_proto

        one = decode_tensor_proto(small.json()["outputs"]["output"]["tensor_proto"], Limits())
        many = decode_tensor_proto(large.json()["outputs"]["output"]["tensor_proto"], Limits())
        assert many.shape == (count,) and many.dtype == one.dtype
        assert np.array_equal(many[:3].view(np.uint8), one.view(np.uint8))
        assert np.array_equal(
            many.view(np.uint8).reshape(count, -1)[-1], one.view(np.uint8).reshape(3, -1)[0]
        )
    else:
        one, many = small.json()["outputs"]["output"], large.json()["outputs"]["output"]
        assert many["shape"] == [count] and many["dtype"] == one["dtype"]
        assert len(many["data"]) == count
        assert many["data"][:3] == one["data"] and many["data"][-1] == one["data"][0]
