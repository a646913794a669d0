"""Apps built by the tests keep no access log: its lines would only clutter the test output
(tests/api/test_access_log.py tests the log itself); and serve no gRPC unless a test gives
them a port (two apps of parallel tests would both bind 8001). And httpx makes one TLS context
per test process, not one per client (below). And the project's modules are compiled once
before the tests start servers (below)."""

import compileall
import functools
import json
import os
import sys
from collections import Counter
from pathlib import Path

import httpx._transports.default as httpx_transport
import pytest

from tests.file_seconds import FILE_SECONDS

# Where PYTHONDONTWRITEBYTECODE is set (CI's machines set it), pytest would rewrite the asserts
# of every test module anew in each xdist worker, and keep nothing: 10 s of each worker's
# collection. The bytecode goes to __pycache__ folders, which git ignores.
sys.dont_write_bytecode = False

os.environ.setdefault("OPSERVE_ACCESS_LOG", "false")
os.environ.setdefault("OPSERVE_GRPC_PORT", "0")
# in-process apps share this process: freezing its objects at each app's start-up would make
# every test after an unload pay a full collection of pytest's own (the live servers freeze:
# live_server.py)
os.environ.setdefault("OPSERVE_GC_FREEZE", "false")

# httpx makes a TLS context for every client, loading the system's CA bundle: 56 ms of CPU each,
# half a second on a busy machine. The tests speak plain HTTP to their own servers and make
# thousands of clients (httpx.get in polls, a client per call in helpers), so the contexts,
# never changed once made, are made once per set of arguments and shared.
# An httpx internal: where a release lacks it, the tests only run slower.
if callable(getattr(httpx_transport, "create_ssl_context", None)):
    httpx_transport.create_ssl_context = functools.cache(httpx_transport.create_ssl_context)


def pytest_configure(config: pytest.Config) -> None:
    """The service's and the wire models' bytecode, written once by the main pytest process
    (not per xdist worker). The suite starts hundreds of server processes, each importing
    every module of service/ and api_schemas/; where PYTHONDONTWRITEBYTECODE is set (CI's
    machines set it) or a clone is fresh, each would compile them all from source again:
    0.7 s of CPU per start. compileall writes the files whatever that variable says, and
    Python reads them whatever it says."""
    if hasattr(config, "workerinput"):  # an xdist worker: the main process has done it
        return
    root = Path(__file__).parents[1]
    for package in ("service", "api_schemas"):
        compileall.compile_dir(root / package, quiet=1)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The files in the order that ends the run soonest: longest first (a worker takes a whole
    file, `--dist loadfile`, and a long one handed out last would leave the other worker idle
    at the end), then those with slow tests (most first), then the rest as collected. Each
    xdist worker computes the same order."""
    seconds = json.loads(FILE_SECONDS.read_text())  # tests/file_seconds.py says what it holds
    slow = Counter(_file(item) for item in items if item.get_closest_marker("slow"))

    def rank(item: pytest.Item) -> tuple[int, int]:
        name = _file(item)
        return (-seconds.get(name, 0), -slow[name])

    items.sort(key=rank)  # stable: each file's tests keep their order


def _file(item: pytest.Item) -> str:
    """The test's file, as its node id names it (from the project's root)."""
    return item.nodeid.split("::", 1)[0]
