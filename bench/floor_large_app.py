"""The floor of bench_memory.py: a raw ASGI app that answers every request with the bytes of
the file named by FLOOR_ANSWER_FILE (the service's own answer to the bench request), read once
at start-up. Serve it with `uvicorn bench.floor_large_app:app`."""

import os
from pathlib import Path
from typing import Any

from bench.floor_app import lifespan, read_body

ANSWER = Path(os.environ["FLOOR_ANSWER_FILE"]).read_bytes()
HEADERS = [(b"content-type", b"application/json"), (b"content-length", str(len(ANSWER)).encode())]


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """Raw ASGI: lifespan is acknowledged, every HTTP request gets ANSWER after its body."""
    if scope["type"] == "lifespan":
        await lifespan(receive, send)
        return
    await read_body(receive)
    await send({"type": "http.response.start", "status": 200, "headers": HEADERS})
    await send({"type": "http.response.body", "body": ANSWER})
