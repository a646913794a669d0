"""OPSERVE_CLUSTER_REDIS_URL checked at start-up against a real redis-server (one with
`requirepass`): a URL without a scheme, a wrong password or none stop `opserve` with one line
naming the setting and never the password; the right password serves; a Redis not answering
yet is one error line in the log, and the server starts (service/cluster/store_check.py)."""

import json
import os
import shutil
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.api.live_server import ROOT, free_port, serve
from tests.cluster.redis_server import RedisServer

SECRET = "right-Secret-42"


@pytest.fixture
def guarded(tmp_path: Path) -> Iterator[RedisServer]:
    if shutil.which("redis-server") is None:
        pytest.skip("needs Debian's redis-server (apt-get install redis-server)")
    server = RedisServer(tmp_path, None, "--requirepass", SECRET)
    server.start()
    try:
        yield server
    finally:
        server.stop()


def _start(url: str) -> subprocess.CompletedProcess[str]:
    """`opserve` with cluster mode on `url`, which is to exit by itself (60 s at most)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OPSERVE_HOST": "127.0.0.1",
           "OPSERVE_PORT": str(free_port()), "OPSERVE_CLUSTER_REDIS_URL": url}  # fmt: skip
    return subprocess.run([sys.executable, "-m", "service"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=60)  # fmt: skip


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("redis://:wrong-password@127.0.0.1:{port}/0", "refused the credentials"),
        ("redis://127.0.0.1:{port}/0", "refused the credentials"),  # no password: NOAUTH
        ("redis://someone:" + SECRET + "@127.0.0.1:{port}/0", "refused the credentials"),
        ("127.0.0.1:{port}", "not a Redis URL"),  # no scheme
        ("redis://:" + SECRET + "@127.0.0.1:port{port}/0", "not a Redis URL"),  # a port no number
    ],
)
def test_a_url_that_cannot_work_stops_the_start_in_one_line(
    guarded: RedisServer, url: str, says: str
) -> None:
    done = _start(url.format(port=guarded.port))
    assert done.returncode == 1, done.stderr
    (line,) = done.stderr.strip().splitlines()  # one line, no traceback
    assert line.startswith("opserve: OPSERVE_CLUSTER_REDIS_URL=") and says in line, line
    assert SECRET not in line and "wrong-password" not in line  # the password never shown
    assert str(guarded.port) in line  # where it went, to check the host


def test_the_right_password_serves(guarded: RedisServer) -> None:
    """The oracle of the cases above: the same Redis, the password it wants, a ready server."""
    url = f"redis://:{SECRET}@127.0.0.1:{guarded.port}/0"
    with (
        serve(cluster_redis_url=url) as server,
        urllib.request.urlopen(f"{server.url}/v2/health/ready", timeout=5) as answer,
    ):
        assert answer.status == 200


def test_a_redis_not_answering_at_start_is_one_loud_log_line(tmp_path: Path) -> None:
    port = free_port()  # nothing listens there
    log = tmp_path / "opserve.log"
    url = f"redis://:{SECRET}@127.0.0.1:{port}/0"
    with serve(cluster_redis_url=url, log_to=log, log_level="warning"):
        pass
    errors = [json.loads(line) for line in log.read_text().splitlines() if line.startswith("{")]
    loud = [e for e in errors if "OPSERVE_CLUSTER_REDIS_URL" in e["message"]]
    assert len(loud) == 1 and loud[0]["level"] == "error", errors
    assert "unreachable" in loud[0]["message"] and f"127.0.0.1:{port}" in loud[0]["message"]
    assert SECRET not in log.read_text()
