"""The access log: one JSON line per request (request id, route, operator, status, bytes),
written in batches, a client unable to forge a line; the request id round trip."""

import asyncio
import contextlib
import io
import json
import logging
from pathlib import Path

import httpx
import onnx
import pytest
from onnx import TensorProto, helper
from starlette.applications import Starlette
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from service.api.observe import observe, observed
from service.log_format import JsonFormatter
from service.main import create_app
from service.settings import Settings
from service.telemetry import access_log, recorder
from service.telemetry.access_log import AccessLog
from service.telemetry.metrics import Metrics
from service.telemetry.recorder import Telemetry

TILE = {"inputs": {"input": {"dtype": "float", "shape": [2], "data": [1, 2]},
                   "repeats": {"dtype": "int64", "shape": [1], "data": [2]}}}  # fmt: skip


async def _ok(request):  # type: ignore[no-untyped-def]
    await request.body()
    return PlainTextResponse("ok", status_code=201)


async def _boom(request):  # type: ignore[no-untyped-def]
    raise RuntimeError("unexpected")


def _observed(stream: io.StringIO) -> tuple[Telemetry, object]:
    routes = [Route("/ok", _ok, methods=["POST"]), Route("/boom", _boom)]
    observer = Telemetry(AccessLog(stream), Metrics(None, lambda: 0))
    return observer, observed(observer, Starlette(routes=routes), routes)


async def _send(app: object, *requests: tuple[str, str], **kwargs: object) -> list[httpx.Response]:
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)  # type: ignore[arg-type]
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
        return [await client.request(m, url, **kwargs) for m, url in requests]  # type: ignore[arg-type]


def test_lines_are_json_and_written_after_the_flush_interval(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # half a second, not 50 ms: a busy host's pause between the three requests would flush
    # the first lines before the test reads that nothing was written yet
    monkeypatch.setattr(recorder, "FLUSH_SECONDS", 0.5)
    stream = io.StringIO()
    _, app = _observed(stream)

    async def scenario() -> tuple[str, str]:
        await _send(app, ("POST", "/ok?x=1"), ("GET", "/missing"), ("GET", "/boom"), content=b"abc")
        before = stream.getvalue()
        await asyncio.sleep(recorder.FLUSH_SECONDS * 3)
        return before, stream.getvalue()

    before, after = asyncio.run(scenario())
    assert before == ""  # buffered, not written per request
    lines = [json.loads(line) for line in after.splitlines()]
    assert [(x["method"], x["path"], x["route"], x["status"]) for x in lines] == [
        ("POST", "/ok?x=1", "/ok", 201), ("GET", "/missing", "unmatched", 404),
        ("GET", "/boom", "/boom", 500)]  # fmt: skip
    assert (lines[0]["bytes_in"], lines[0]["bytes_out"]) == (3, 2)
    assert set(lines[0]) == {"time", "request_id", "client", "method", "path", "route", "model",
                             "operator", "version", "status", "duration_ms", "bytes_in",
                             "bytes_out"}  # fmt: skip
    assert all(x["time"].endswith("Z") and x["duration_ms"] >= 0 for x in lines)


def test_a_full_buffer_is_written_at_once() -> None:
    stream = io.StringIO()
    _, app = _observed(stream)
    asyncio.run(_send(app, *[("POST", "/ok")] * access_log.FLUSH_LINES))
    assert len(stream.getvalue().splitlines()) == access_log.FLUSH_LINES


def test_a_path_or_request_id_cannot_forge_a_line() -> None:
    stream = io.StringIO()
    observer, app = _observed(stream)
    forged = '/ok%0A{"status":%20200}'
    headers = {"x-request-id": 'a"}\n{"b'}

    async def scenario() -> None:
        await _send(app, ("POST", forged), headers=headers)
        observer.flush()

    asyncio.run(scenario())
    (line,) = stream.getvalue().splitlines()  # one request, one line
    entry = json.loads(line)
    assert entry["path"].startswith("/ok%0A")
    assert entry["request_id"] != headers["x-request-id"]  # not a sane id: a new one is made


def test_the_request_id_is_the_clients_or_a_new_one_and_comes_back() -> None:
    stream = io.StringIO()
    observer, app = _observed(stream)

    async def scenario() -> list[httpx.Response]:
        answers = await _send(app, ("POST", "/ok"), headers={"x-request-id": "req-42"})
        answers += await _send(app, ("POST", "/ok"), ("POST", "/ok"))
        observer.flush()
        return answers

    answers = asyncio.run(scenario())
    ids = [a.headers["x-request-id"] for a in answers]
    assert ids[0] == "req-42"
    assert len(ids[1]) == 32 and ids[1] != ids[2] and int(ids[1], 16) >= 0
    assert [json.loads(x)["request_id"] for x in stream.getvalue().splitlines()] == ids


def _line_of_unanswered(method: str, raw_path: bytes) -> dict:  # type: ignore[type-arg]
    """The log line of a request the app left unanswered, sent with this raw target."""
    stream = io.StringIO()
    observer = Telemetry(AccessLog(stream), Metrics(None, lambda: 0))

    async def gone(scope, receive, send):  # type: ignore[no-untyped-def]
        return None  # the client went away: nothing was answered

    scope = {"type": "http", "method": method, "path": "/", "raw_path": raw_path, "headers": [],
             "query_string": b"", "http_version": "1.1", "client": ("127.0.0.1", 5)}  # fmt: skip

    async def scenario() -> None:
        await observe(observer, gone, scope, None, None, "/x")  # type: ignore[arg-type]
        observer.flush()

    asyncio.run(scenario())
    return json.loads(stream.getvalue())  # type: ignore[no-any-return]


def test_control_characters_are_escaped() -> None:
    stream = io.StringIO()
    log = AccessLog(stream)
    scope = {"method": "GET", "path": "/", "raw_path": b'/a\n"b\\', "client": ("1.2.3.4", 5)}
    log.record(scope, b"id", "/x", "", "", "", 200, 0.001, 0, 0)
    log.flush()
    assert '"path":"/a\\n\\"b\\\\"' in stream.getvalue()
    assert stream.getvalue().count("\n") == 1


def test_a_request_left_unanswered_is_logged_as_499() -> None:
    entry = _line_of_unanswered("POST", b"/v1/ops/Tile/13")
    assert (entry["path"], entry["status"]) == ("/v1/ops/Tile/13", 499)


def test_operator_requests_are_logged_with_operator_and_version() -> None:
    app = create_app(Settings(access_log=True))
    stream = io.StringIO()

    async def scenario() -> list[httpx.Response]:
        answers = await _send(app, ("POST", "/v1/ops/Tile/6"), ("POST", "/v1/ops/Nope/1"),
                              json=TILE)  # fmt: skip
        await asyncio.sleep(recorder.FLUSH_SECONDS * 3)
        return answers

    with contextlib.redirect_stdout(stream):  # the access log writes to sys.stdout
        answers = asyncio.run(scenario())
    assert [a.status_code for a in answers] == [200, 404]
    lines = [json.loads(x) for x in stream.getvalue().splitlines()]
    assert [(x["route"], x["operator"], x["version"], x["status"]) for x in lines] == [
        ("/v1/ops/{op_type}/{version}", "Tile", "6", 200),
        ("/v1/ops/{op_type}/{version}", "unknown", "unknown", 404)]  # fmt: skip
    assert [x["request_id"] for x in lines] == [a.headers["x-request-id"] for a in answers]


def test_v2_requests_are_logged_with_their_model(tmp_path: Path) -> None:
    """V2 traffic on an operator carries its operator and version; on a repository model, its
    name and version; on a name that is no model, nothing the client chose."""
    folder = tmp_path / "shaper" / "1"
    folder.mkdir(parents=True)
    graph = helper.make_graph([helper.make_node("Shape", ["x"], ["s"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                              [helper.make_tensor_value_info("s", TensorProto.INT64, [1])])  # fmt: skip
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)],
                                ir_version=10), folder / "model.onnx")  # fmt: skip
    app = create_app(Settings(access_log=True, model_repository=tmp_path))
    stream = io.StringIO()
    v2 = {
        "inputs": [
            {"name": "input", "shape": [1], "datatype": "INT64", "data": [3]},
            {"name": "repeats", "shape": [1], "datatype": "INT64", "data": [2]},
        ]
    }
    shape = {"inputs": [{"name": "x", "shape": [2], "datatype": "FP32", "data": [1, 2]}]}

    async def scenario() -> list[httpx.Response]:
        await app.state.repository.start()  # httpx's ASGI transport runs no lifespan
        answers = [*await _send(app, ("POST", "/v2/models/Tile/versions/13/infer"), json=v2),
                   *await _send(app, ("POST", "/v2/models/shaper/infer"), json=shape),
                   *await _send(app, ("GET", "/v2/models/no_such_thing_at_all"))]  # fmt: skip
        await asyncio.sleep(recorder.FLUSH_SECONDS * 3)
        return answers

    with contextlib.redirect_stdout(stream):
        answers = asyncio.run(scenario())
    assert [a.status_code for a in answers] == [200, 200, 404]
    lines = [json.loads(x) for x in stream.getvalue().splitlines()]
    assert [(x["route"], x["model"], x["operator"], x["version"]) for x in lines] == [
        ("/v2/models/{name}/versions/{version}/infer", "Tile", "Tile", "13"),
        ("/v2/models/{name}/infer", "shaper", "", "1"),
        ("/v2/models/{name}", "", "", "")]  # fmt: skip


def test_other_logs_are_json_lines() -> None:
    record = logging.LogRecord("opserve", logging.WARNING, __file__, 1, 'odd "%s"\n', ("x",), None)
    line = JsonFormatter().format(record)
    assert "\n" not in line
    entry = json.loads(line)
    assert (entry["level"], entry["logger"], entry["message"]) == (
        "warning",
        "opserve",
        'odd "x"\n',
    )
