"""The floor of bench_engines.py's throughput rows: the least an ASGI app can do for one
tritonclient.http call with binary data.

It reads the whole body, parses its JSON header (the Inference-Header-Content-Length bytes)
with pydantic_core.from_json, as the service does (floor_app.py says why not orjson), and
answers the bytes of FLOOR_ANSWER (the service's own answer to the same call, as JSON), so
both send the same number of bytes. Serve it with `uvicorn bench.floor_binary_app:app`.
"""

import os
from typing import Any

from pydantic_core import from_json

from bench.floor_app import lifespan, read_body

ANSWER = os.environ["FLOOR_ANSWER"].encode()
HEADERS = [(b"content-type", b"application/json"), (b"content-length", str(len(ANSWER)).encode())]
HEADER_LENGTH = b"inference-header-content-length"


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """Raw ASGI: lifespan is acknowledged, every HTTP request gets ANSWER after its body."""
    if scope["type"] == "lifespan":
        await lifespan(receive, send)
        return
    body = await read_body(receive)
    length = next((int(v) for k, v in scope["headers"] if k == HEADER_LENGTH), len(body))
    from_json(body[:length])
    await send({"type": "http.response.start", "status": 200, "headers": HEADERS})
    await send({"type": "http.response.body", "body": ANSWER})
