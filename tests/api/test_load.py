"""Load at 64 connections, small and large requests mixed, on a live server under its default
settings: no errors, and memory that does not creep.

Creep is judged where it can be told from the allocator's steps: RSS at its lowest in a quiet
pause after each phase of load, once the server's own heap trim (OPSERVE_HEAP_TRIM_SECONDS, 1 s
after the last large request) has given back what is free. Under load, RSS rises in steps each
time more large requests than ever before are in flight at once (+11 to +24 MiB on ~145 MiB),
and stays there until a trim: sampled under load with the trim off (this test's earlier form),
two such steps in a row failed it in clean-clone runs (139 -> 145 -> 151 MiB), and a 90 s run
of the same load rose 136 -> 155 MiB in steps on the tree before that day's change as after
it, then fell. After each trim the lowest RSS was flat to 0.3 MiB (103.1 -> 103.4 MiB over four
8 s phases, on both trees); memory that leaks is not free, and no trim gives it back."""

import asyncio
import math
import time
from collections.abc import Callable

import httpx
import pytest

from tests.api.live_server import serve
from tests.api.resilience import SMALL

CONNECTIONS = 64
PHASES = 3
PHASE_SECONDS = 8.0
QUIET_SECONDS = (2.5, 10.0)
"""A pause's least and most: it ends once RSS made no new low for 1.5 s (the trim has run)."""


def _fill(count: int, fmt: str) -> dict:
    return {"inputs": {"input": {"dtype": "int64", "data": [count]}},
            "attributes": {"value": {"dtype": "float", "shape": [1], "data": [1.5]}},
            "output_format": fmt}  # fmt: skip


REQUESTS = [("/v1/ops/Tile/13", SMALL)] * 6 + [
    ("/v1/ops/ConstantOfShape/25", _fill(1 << 20, "tensor_proto")),  # 4 MiB, streamed
    ("/v1/ops/ConstantOfShape/25", _fill(1 << 19, "json")),  # 2 MiB, streamed as JSON
]


async def _warm_up(client: httpx.AsyncClient) -> None:
    """Every kind of request on every connection once, before the clock starts: connections,
    kernel threads and the allocator's kept blocks reach their working size here, not inside
    the measured windows (on a loaded 2-core machine that took longer than 10 s)."""
    answers = await asyncio.gather(*(client.post(path, json=body) for path, body in REQUESTS
                                     for _ in range(CONNECTIONS // len(REQUESTS))))  # fmt: skip
    # Then every connection with a large request at once, twice: four times the most the load
    # has in flight (16), so the heap's high-water mark is set here, not by a record number of
    # large requests at once during the load (RSS rose in such steps, +11 to +24 MiB, up to
    # 30 s in, and failed the test on a loaded machine).
    # A round with 503s (a loaded machine: kernel threads or memory budget short) may set no
    # mark; a CI run saw RSS step from 129 to 154 MiB during the load (inferred to be such a
    # round), so a round with 503s is sent again, up to five times.
    large = [request for request in REQUESTS if request[0].endswith("ConstantOfShape/25")]
    for _ in range(2):
        for _attempt in range(5):
            batch = await asyncio.gather(*(client.post(*large[i % len(large)][:1],
                                                       json=large[i % len(large)][1])
                                           for i in range(CONNECTIONS)))  # fmt: skip
            answers += batch
            if all(a.status_code == 200 for a in batch):
                break
    assert all(a.status_code in (200, 503) for a in answers), {a.status_code for a in answers}


async def _load(url: str, rss: Callable[[], int]) -> tuple[int, list, list[int]]:
    """The load in PHASES phases, each followed by a quiet pause: the requests done, the
    errors, and the lowest RSS of each pause (the first after the warm-up)."""
    done, errors, lows = 0, [], []
    # A connection left idle for the server's keep-alive time is closed just as httpx may send
    # on it: a ReadError, no answer. The client drops idle connections after 2 s, and the server
    # keeps them 60 s here (OPSERVE_KEEP_ALIVE_SECONDS), not 5 s: the server's clock starts when
    # it sent an answer, the client's when it read it, and on a machine with every core busy the
    # client may read an answer over 3 s late (the likely cause of a Tile call's ReadError('')
    # seen once beside a CPU hog).
    limits = httpx.Limits(max_connections=CONNECTIONS, keepalive_expiry=2.0)
    async with httpx.AsyncClient(base_url=url, timeout=30, limits=limits) as client:
        await _warm_up(client)
        lows.append(await _quiet_low(rss))
        for _ in range(PHASES):
            stop_at = time.monotonic() + PHASE_SECONDS

            async def worker(index: int, stop_at: float = stop_at) -> None:
                nonlocal done
                turn = index
                while time.monotonic() < stop_at:
                    path, body = REQUESTS[turn % len(REQUESTS)]
                    turn += 1
                    try:
                        answer = await client.post(path, json=body)
                        if answer.status_code != 200:
                            errors.append((path, answer.status_code, answer.text[:200]))
                    except httpx.HTTPError as exc:
                        errors.append((path, repr(exc)))
                    done += 1

            await asyncio.gather(*(worker(i) for i in range(CONNECTIONS)))
            lows.append(await _quiet_low(rss))
    return done, errors, lows


async def _quiet_low(rss: Callable[[], int]) -> int:
    """The lowest RSS in a pause with no requests: sampled every 100 ms for QUIET_SECONDS[0]
    at least, until 1.5 s passed with no new low (or QUIET_SECONDS[1])."""
    start = last_low = time.monotonic()
    low = math.inf
    while (now := time.monotonic()) - start < QUIET_SECONDS[1]:
        value = rss()
        if value < low:
            low, last_low = value, now
        if now - start >= QUIET_SECONDS[0] and now - last_low >= 1.5:
            break
        await asyncio.sleep(0.1)
    return int(low)


@pytest.mark.slow  # a 40 s soak
def test_mixed_load_without_errors_or_creeping_memory() -> None:
    """After each phase of load, the heap trimmed, RSS is back within 2% of where it was
    after the warm-up (a leak of 1 KiB a request would add 2-8 MiB over the phases'
    2,000-8,000 requests here)."""
    with serve(access_log="false", keep_alive_seconds="60") as server:
        done, errors, lows = asyncio.run(_load(server.url, server.rss_bytes))
    assert not errors, errors[:5]
    assert done > 100, done  # thousands on a quiet machine; a few hundred on a loaded one
    shown = [round(low / 2**20, 1) for low in lows]
    assert max(lows[1:]) - lows[0] <= 0.02 * lows[0], shown
