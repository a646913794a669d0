"""The request-body limit end to end, against a real uvicorn server on 127.0.0.1: a 200 MB
body gets 413 whether it declares its length or streams in chunks, and the server's memory
stays bounded by the limit, never by what the client sends."""

import json
import socket
import time
import urllib.request
from collections.abc import Iterator

import pytest

from .cases import request_body
from .live_server import Server, serve

MiB = 1024 * 1024
LIMIT = 64 * MiB
SENT = 200 * MiB


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    with serve(max_request_bytes=str(LIMIT), access_log="false") as running:
        yield running


def _read_response(sock: socket.socket, timeout: float) -> tuple[int, dict[str, str], dict]:
    """Status, headers and JSON body of one HTTP/1.1 response with a Content-Length."""
    sock.settimeout(timeout)
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            break
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    status_line, *lines = head.decode("latin-1").split("\r\n")
    headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines)}
    while len(body) < int(headers.get("content-length", 0)):
        body += sock.recv(65536)
    return int(status_line.split()[1]), headers, json.loads(body)


def _request_head(server: Server, framing: str) -> bytes:
    return (f"POST /v1/ops/Tile/13 HTTP/1.1\r\nHost: 127.0.0.1:{server.port}\r\n"
            f"Content-Type: application/json\r\n{framing}\r\n\r\n").encode()  # fmt: skip


def test_chunked_200_mb_gets_413_and_memory_stays_bounded(server: Server) -> None:
    baseline = server.rss_bytes()
    peak = baseline
    chunk = b"%x\r\n" % MiB + b" " * MiB + b"\r\n"  # JSON whitespace: parsing would not fail early
    with socket.create_connection(("127.0.0.1", server.port)) as sock:
        sock.sendall(_request_head(server, "Transfer-Encoding: chunked"))
        sent = 0
        try:
            # Keep streaming after the server has answered, as a careless client would.
            while sent < SENT:
                sock.sendall(chunk)
                sent += MiB
                peak = max(peak, server.rss_bytes())
            sock.sendall(b"0\r\n\r\n")
        except (BrokenPipeError, ConnectionResetError):
            pass  # the server may close the connection instead of draining it
        status, _, body = _read_response(sock, timeout=10)
    assert status == 413
    assert f"over the limit of {LIMIT} bytes" in body["detail"]
    grown = max(peak, server.rss_bytes("VmHWM")) - baseline
    # The body is held only up to the limit (64 MiB), never the 200 MB the client sent.
    assert grown < LIMIT + 40 * MiB, f"grew {grown / MiB:.0f} MiB for {sent / MiB:.0f} MiB sent"


def test_content_length_200_mb_gets_413_at_once(server: Server) -> None:
    with socket.create_connection(("127.0.0.1", server.port)) as sock:
        started = time.monotonic()
        sock.sendall(_request_head(server, f"Content-Length: {SENT}"))  # and not one body byte
        status, headers, body = _read_response(sock, timeout=5)
        elapsed = time.monotonic() - started
    assert status == 413
    assert elapsed < 1.0
    assert headers["connection"] == "close"
    assert body["detail"] == (  # the operator lane names the version the request was for
        f"Tile-13: request body of {SENT} bytes (Content-Length) is over the limit of {LIMIT} "
        "bytes (OPSERVE_MAX_REQUEST_BYTES)"
    )


def test_server_still_serves_after_refusals(server: Server) -> None:
    request = urllib.request.Request(
        f"{server.url}/v1/ops/Tile/13",
        data=json.dumps(request_body("Tile", 13)).encode(),
        headers={"content-type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=5) as answer:
        assert answer.status == 200
        assert json.load(answer)["outputs"]["output"]["shape"] == [4, 9]
