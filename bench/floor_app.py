"""The floor of bench_http.py: the least an ASGI app can do for one POST of the bench.

It reads the whole body, parses it with pydantic_core.from_json (as the service does), and
answers fixed bytes: the service's own response to the bench request, so both send the same
number of bytes. Not orjson.loads: on a CPU with AVX-512 (this project's VM) orjson makes
string values with AVX-512 instructions, after which the core runs about 15% slower for a few
hundred microseconds: a floor parsing with it measured lower than the least a server can do
(service/codecs/json_tensor.common_json, docs/api.md).
Serve it with `uvicorn bench.floor_app:app`.
"""

from typing import Any

import orjson
from pydantic_core import from_json

RESPONSE = orjson.dumps({
    "op_type": "Tile",
    "version": 13,
    "outputs": {"output": {"dtype": "float", "shape": [4, 6],
                           "data": [1.0, 2.0, 3.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 4.0, 5.0, 6.0] * 2}},
})  # fmt: skip
HEADERS = [(b"content-type", b"application/json"), (b"content-length", str(len(RESPONSE)).encode())]


async def lifespan(receive: Any, send: Any, on_startup: Any = None) -> None:
    """Acknowledge uvicorn's lifespan messages (the floors of the other benches share this)."""
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            if on_startup is not None:
                on_startup()
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return


async def read_body(receive: Any) -> bytes:
    """The whole request body, its chunks joined once (adding each chunk to the body so far
    would copy a large body's front again for every chunk)."""
    chunks = []
    more = True
    while more:
        message = await receive()
        chunks.append(message.get("body", b""))
        more = message.get("more_body", False)
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """Raw ASGI: lifespan is acknowledged, every HTTP request gets RESPONSE."""
    if scope["type"] == "lifespan":
        await lifespan(receive, send)
        return
    from_json(await read_body(receive))
    await send({"type": "http.response.start", "status": 200, "headers": HEADERS})
    await send({"type": "http.response.body", "body": RESPONSE})
