"""The floor of bench_v2.py: a raw ASGI app answering, byte for byte, what the service answered.

bench_v2.py records the service's responses into the folder named by OPSERVE_BENCH_FLOOR_DIR
(`<name>.body`, `<name>.json` with its headers); a request to `/floor/<name>` reads its body,
parses it with pydantic_core.from_json (as the service does; floor_app.py says why not
orjson) and answers the recorded bytes.
Serve it with `uvicorn bench.floor_v2_app:app`.
"""

import os
from pathlib import Path
from typing import Any

import orjson
from pydantic_core import from_json

from bench.floor_app import lifespan, read_body

_ANSWERS: dict[str, tuple[list[tuple[bytes, bytes]], bytes]] = {}


def _load() -> None:
    folder = Path(os.environ["OPSERVE_BENCH_FLOOR_DIR"])
    for path in folder.glob("*.body"):
        body = path.read_bytes()
        named = orjson.loads(path.with_suffix(".json").read_bytes())
        headers = [(k.encode(), v.encode()) for k, v in named.items()]
        headers.append((b"content-length", str(len(body)).encode()))
        _ANSWERS[path.stem] = (headers, body)


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """Raw ASGI: lifespan loads the answers, every HTTP request gets its recorded answer."""
    if scope["type"] == "lifespan":
        await lifespan(receive, send, _load)
        return
    from_json(await read_body(receive))
    headers, answer = _ANSWERS[scope["path"].rsplit("/", 1)[-1]]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": answer})
