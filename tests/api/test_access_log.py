"""The access log: one line per request, status and path included, written in batches."""

import asyncio
import io

import httpx
from starlette.applications import Starlette
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from service.api import access_log
from service.api.access_log import AccessLogMiddleware


async def _ok(request):  # type: ignore[no-untyped-def]
    return PlainTextResponse("ok", status_code=201)


async def _boom(request):  # type: ignore[no-untyped-def]
    raise RuntimeError("unexpected")


def _app(stream: io.StringIO) -> AccessLogMiddleware:
    inner = Starlette(routes=[Route("/ok", _ok, methods=["POST"]), Route("/boom", _boom)])
    return AccessLogMiddleware(inner, stream=stream)


async def _send(app: AccessLogMiddleware, *requests: tuple[str, str]) -> None:
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
        for method, url in requests:
            await client.request(method, url)


def test_lines_are_written_after_the_flush_interval() -> None:
    stream = io.StringIO()
    app = _app(stream)

    async def scenario() -> tuple[str, str]:
        await _send(app, ("POST", "/ok?x=1"), ("GET", "/missing"), ("GET", "/boom"))
        before = stream.getvalue()
        await asyncio.sleep(access_log.FLUSH_SECONDS * 3)
        return before, stream.getvalue()

    before, after = asyncio.run(scenario())
    assert before == ""  # buffered, not written per request
    lines = after.splitlines()
    assert len(lines) == 3
    assert '"POST /ok?x=1 HTTP/1.1" 201 ' in lines[0]
    assert '"GET /missing HTTP/1.1" 404 ' in lines[1]
    assert '"GET /boom HTTP/1.1" 500 ' in lines[2]
    assert all(line.endswith("ms") and line[:4].isdigit() for line in lines)


def test_a_full_buffer_is_written_at_once() -> None:
    stream = io.StringIO()
    app = _app(stream)
    asyncio.run(_send(app, *[("POST", "/ok")] * access_log.FLUSH_LINES))
    assert len(stream.getvalue().splitlines()) == access_log.FLUSH_LINES


def test_a_path_cannot_forge_a_line() -> None:
    stream = io.StringIO()
    app = _app(stream)
    forged = '/ok%0A2026-01-01T00:00:00Z 10.0.0.1:1 "GET /admin HTTP/1.1" 200'

    async def scenario() -> None:
        await _send(app, ("POST", forged))
        app.flush()

    asyncio.run(scenario())
    (line,) = stream.getvalue().splitlines()  # one request, one line
    assert "/ok%0A2026" in line


async def _gone(scope, receive, send):  # type: ignore[no-untyped-def]
    return None  # the client went away: nothing was answered


def _line_of_unanswered(method: str, raw_path: bytes) -> str:
    """The log line of a request the app left unanswered, sent with this raw target."""
    stream = io.StringIO()
    app = AccessLogMiddleware(_gone, stream=stream)
    scope = {"type": "http", "method": method, "path": "/", "raw_path": raw_path,
             "query_string": b"", "http_version": "1.1", "client": ("127.0.0.1", 5)}  # fmt: skip

    async def scenario() -> None:
        await app(scope, None, None)  # type: ignore[arg-type]
        app.flush()

    asyncio.run(scenario())
    return stream.getvalue()


def test_control_characters_are_escaped() -> None:
    assert '"GET /a\\x0a\\x22b\\x5c HTTP/1.1" 499' in _line_of_unanswered("GET", b'/a\n"b\\')


def test_a_request_left_unanswered_is_logged_as_499() -> None:
    line = _line_of_unanswered("POST", b"/v1/ops/Tile/13")
    assert '"POST /v1/ops/Tile/13 HTTP/1.1" 499 ' in line
