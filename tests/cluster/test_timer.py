"""Cluster mode's background loop (service/cluster/timer.py) outlives a failing step."""

import asyncio
import logging

import pytest

from service.cluster.store import ClusterUnreachable
from service.cluster.timer import repeat


def test_a_step_that_fails_never_ends_the_loop(caplog: pytest.LogCaptureFixture) -> None:
    ran: list[int] = []

    async def step() -> None:
        ran.append(len(ran))
        if len(ran) == 1:
            raise ValueError("a bug in one step")
        if len(ran) == 2:
            raise ClusterUnreachable("the cluster store (Redis) is unreachable")

    async def scenario() -> None:
        loop = asyncio.create_task(repeat(step, 0.01, "test step"))
        await asyncio.sleep(0.2)
        loop.cancel()
        await asyncio.gather(loop, return_exceptions=True)

    with caplog.at_level(logging.ERROR, logger="opserve"):
        asyncio.run(scenario())
    assert len(ran) >= 5
    (logged,) = caplog.records  # the bug, with its traceback; a store away is the step's
    assert "cluster test step failed" in logged.getMessage() and logged.exc_info
