"""The floor of bench_http.py made as slow as the service: a raw ASGI app that does what
floor_app does and then burns BENCH_SPIN_US microseconds of CPU per request (a busy loop).

bench_http.py --twin starts it with the service's own CPU per request (less the floor's) from
the same round, so its latencies show what this machine gives any server that spends that much
per request at 16 connections: a p99 the service's code cannot be blamed for. Its p50 is about
the connections times the time per request (Little's law); its tail is the machine's noise at
that pace.
"""

import os
import time
from typing import Any

from pydantic_core import from_json

from bench.floor_app import HEADERS, RESPONSE, lifespan, read_body

SPIN_SECONDS = float(os.environ.get("BENCH_SPIN_US", "0")) / 1e6


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """floor_app's answer after SPIN_SECONDS of busy work."""
    if scope["type"] == "lifespan":
        await lifespan(receive, send)
        return
    from_json(await read_body(receive))
    until = time.perf_counter() + SPIN_SECONDS
    while time.perf_counter() < until:
        pass
    await send({"type": "http.response.start", "status": 200, "headers": HEADERS})
    await send({"type": "http.response.body", "body": RESPONSE})
