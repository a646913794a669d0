"""Real containers: the project's Dockerfile built with buildah, its docker-compose.yml brought
up with podman-compose (only the published port overridden), about 20 s of load through nginx
while one replica is SIGKILLed and another stopped with SIGTERM: no request fails or comes back
wrong. The replicas run as a non-root user and their HEALTHCHECK reports healthy."""

import json
import random
import re
import threading
import time
import uuid
from http.client import HTTPConnection
from typing import Any

import numpy as np
import pytest

from service import __version__
from tests.api.live_server import free_port
from tests.deploy import podman

pytestmark = pytest.mark.skipif(bool(podman.missing()), reason=podman.missing() or "")
IMAGE = f"opserve:{__version__}"  # the image docker-compose.yml uses (test_manifests checks)
LOAD_SECONDS = 20
FAIL_TIMEOUT = int(
    re.findall(r"fail_timeout=(\d+)s", (podman.ROOT / "deploy/nginx/nginx.conf").read_text())[0]
)
CLIENTS = 6


class Load:
    """Clients that POST Tile requests with random data and check every answer."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.stop = threading.Event()
        self.answered = 0
        self.failures: list[str] = []
        self.lock = threading.Lock()

    def client(self, seed: int) -> None:
        rng = random.Random(seed)
        conn = HTTPConnection("127.0.0.1", self.port, timeout=30)
        while not self.stop.is_set():
            data = [rng.randint(-1000, 1000) for _ in range(rng.randint(1, 6))]
            repeats = rng.randint(1, 4)
            body = json.dumps({"inputs": {
                "input": {"dtype": "int64", "shape": [len(data)], "data": data},
                "repeats": {"dtype": "int64", "shape": [1], "data": [repeats]}}})  # fmt: skip
            rid = uuid.uuid4().hex
            try:
                conn.request("POST", "/v1/ops/Tile/13", body,
                             {"content-type": "application/json", "x-request-id": rid})  # fmt: skip
                answer = conn.getresponse()
                payload = answer.read()
                outcome = self.check(answer.status, payload, answer.getheader("x-request-id"),
                                     rid, np.tile(data, repeats).tolist())  # fmt: skip
            except (OSError, ValueError) as error:  # the client's connection to nginx broke
                outcome = f"{type(error).__name__}: {error}"
                conn.close()
                conn = HTTPConnection("127.0.0.1", self.port, timeout=30)
            with self.lock:
                self.answered += 1
                if outcome:
                    self.failures.append(outcome)
        conn.close()

    @staticmethod
    def check(status: int, payload: bytes, got_id: str | None, rid: str, expected: Any) -> str:
        if status != 200:
            return f"{status}: {payload[:200]!r}"
        if got_id != rid:
            return f"request id {got_id!r}, sent {rid!r}"
        if json.loads(payload)["outputs"]["output"]["data"] != expected:
            return f"wrong answer {payload[:200]!r}"
        return ""


def _wait_for(port: int, path: str, timeout: float = 90) -> bytes:
    deadline = time.monotonic() + timeout
    while True:
        try:
            conn = HTTPConnection("127.0.0.1", port, timeout=5)
            conn.request("GET", path)
            answer = conn.getresponse()
            if answer.status == 200:
                return answer.read()
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path} through nginx was not 200 within {timeout} s")
        time.sleep(0.5)


def _containers(project: str) -> dict[str, str]:
    """Service name: container name, for the containers of one compose project."""
    listed = podman.run("podman", "ps", "-a", "--filter",
                        f"label=io.podman.compose.project={project}", "--format",
                        '{{.Names}} {{index .Labels "com.docker.compose.service"}}').stdout  # fmt: skip
    return {service: name for name, service in (line.split() for line in listed.splitlines())}


def _state(container: str) -> str:
    return podman.run(
        "podman", "inspect", "--format", "{{.State.Status}}", container
    ).stdout.strip()


def _healthy(container: str, timeout: float = 60) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if podman.run("podman", "healthcheck", "run", container, check=False).returncode == 0:
            return True
        time.sleep(1)
    return False


def _clean(project: str) -> None:
    """Everything the compose project made, by name, whatever state the test left it in."""
    podman.run("podman-compose", "-p", project, "down", "-t", "2", check=False, timeout=120)
    for name in _containers(project).values():
        podman.run("podman", "rm", "-f", "-t", "0", name, check=False)
    podman.run("podman", "pod", "rm", "-f", f"pod_{project}", check=False)
    podman.run("podman", "network", "rm", "-f", f"{project}_default", check=False)
    for volume in podman.run("podman", "volume", "ls", "-q", "--filter",
                             f"label=io.podman.compose.project={project}").stdout.split():  # fmt: skip
        podman.run("podman", "volume", "rm", "-f", volume, check=False)


def test_replicas_behind_nginx_answer_everything_through_a_kill_and_a_stop() -> None:
    podman.ensure_stand_ins()
    podman.build(IMAGE)
    project = f"opservetest{uuid.uuid4().hex[:8]}"
    port = free_port()
    try:
        podman.run("podman-compose", "-p", project, "-f", "docker-compose.yml", "up", "-d",
                   "--no-build", timeout=180, env={"OPSERVE_HTTP_PORT": str(port)})  # fmt: skip
        assert b"swagger-ui" in _wait_for(port, "/docs")  # Swagger UI through the balancer
        containers = _containers(project)
        for service in ("app1", "app2", "app3"):
            user = podman.run("podman", "exec", containers[service], "id", "-u").stdout.strip()
            assert user == "10001", f"{service} runs as uid {user}"
            assert _healthy(containers[service]), f"{service}'s HEALTHCHECK is not healthy"
        # nginx took the replicas out of rotation for fail_timeout when its first tries found them
        # still starting: load sent before that ends gets "no live upstreams" 502s
        time.sleep(FAIL_TIMEOUT + 1)

        load = Load(port)
        clients = [threading.Thread(target=load.client, args=(n,)) for n in range(CLIENTS)]
        for client in clients:
            client.start()
        time.sleep(LOAD_SECONDS / 3)
        podman.run("podman", "kill", "--signal", "KILL", containers["app2"])
        time.sleep(LOAD_SECONDS / 3)
        before_stop = load.answered
        podman.run("podman", "stop", "-t", "10", containers["app3"], timeout=60)
        assert _state(containers["app3"]) == "exited"  # stopped by hand: not restarted
        time.sleep(LOAD_SECONDS / 3)
        load.stop.set()
        for client in clients:
            client.join(timeout=60)
        assert load.failures == [], f"{len(load.failures)} of {load.answered}: {load.failures[:5]}"
        assert load.answered >= 2000, f"only {load.answered} requests in {LOAD_SECONDS} s"
        assert load.answered > before_stop + 500  # the last replica carried the load alone
        print(f"{load.answered} requests through nginx in {LOAD_SECONDS} s, none failed")
    finally:
        _clean(project)
