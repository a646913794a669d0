"""Real containers: the project's Dockerfile built with buildah, its docker-compose.yml brought
up with podman-compose (Redis, three replicas in cluster mode, nginx; only the published ports
overridden, and the replicas given Triton's example repository by compose-triton.yml), about
20 s of load through nginx, HTTP and gRPC at once, while one replica is SIGKILLed and another
stopped with SIGTERM: no request fails or comes back wrong. Cluster mode (one compose up for
every step): the replicas registered in Redis, statistics through nginx sum the three, and
Triton's example clients (EXAMPLES: stateless, sequences over HTTP and gRPC, sync and stream,
and model control) run through nginx during the kill and the stop, none failing. The load's
gRPC clients use the retry policy of docs/deployment.md ("gRPC retries"), run from the guide as
written: nginx cannot send a gRPC call again itself. The balancer's first answers are right
too (it starts once the replicas are ready). The replicas run as a non-root user and their
HEALTHCHECK reports healthy."""

import contextlib
import io
import json
import os
import random
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from http.client import HTTPConnection
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc
from tritonclient.utils import InferenceServerException

from service import __version__
from tests.api.live_server import ROOT, free_port
from tests.deploy import podman
from tests.triton_clients import MODEL_CONTROL_MODELS, REPLAYS
from tests.triton_examples import write_repository

pytestmark = [pytest.mark.skipif(bool(podman.missing()), reason=podman.missing() or ""),
              pytest.mark.slow]  # fmt: skip
IMAGE = f"opserve:{__version__}"  # the image docker-compose.yml uses (test_manifests checks)
GUIDE = (ROOT / "docs" / "deployment.md").read_text()
RETRY_EXAMPLE = re.search(r"### gRPC retries\n.*?```python\n(.*?)```\n```text retries\n(.*?)```",
                          GUIDE, re.S)  # fmt: skip
LOAD_SECONDS = 20
CLIENTS = 6
GRPC_CLIENTS = 3
OVERRIDE = "tests/deploy/compose-triton.yml"
# Triton's example clients (triton-inference-server/client, src/python/examples), run through
# nginx again and again during the kill and the stop, one after another: (script, door). The
# scripts are not part of this project: with OPSERVE_TRITON_EXAMPLES naming a checkout's
# examples folder the scripts themselves run, unchanged; without it, their replays
# (tests/triton_clients.py: the same calls and checks).
EXAMPLES = [
    ("simple_http_infer_client.py", "http"),
    ("simple_grpc_infer_client.py", "grpc"),
    ("simple_http_sequence_sync_infer_client.py", "http"),
    ("simple_grpc_sequence_sync_infer_client.py", "grpc"),
    ("simple_grpc_sequence_stream_infer_client.py", "grpc"),
    ("simple_http_model_control.py", "http"),
    ("simple_grpc_model_control.py", "grpc"),
]
EXAMPLES_DIR = Path(os.environ.get("OPSERVE_TRITON_EXAMPLES", "/nonexistent"))
STATS_CALLS = 12  # V2 calls of Shape-15 through nginx, spread over the replicas


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


class GrpcLoad(Load):
    """Clients that call ModelInfer (Tile-13) through nginx's gRPC port and check every answer
    and its request id (trailing metadata)."""

    def __init__(self, port: int, retry: dict[str, Any]) -> None:
        super().__init__(port)
        self.options = [("grpc.service_config", json.dumps(retry))]

    def client(self, seed: int) -> None:
        rng = random.Random(seed)
        with grpc.insecure_channel(f"127.0.0.1:{self.port}", options=self.options) as channel:
            stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
            while not self.stop.is_set():
                data = np.array([rng.randint(-1000, 1000) for _ in range(rng.randint(1, 6))])
                request = pb.ModelInferRequest(model_name="Tile", model_version="13")
                request.inputs.add(name="input", datatype="INT64", shape=[len(data)])
                request.inputs.add(name="repeats", datatype="INT64", shape=[1])
                request.raw_input_contents.extend([data.tobytes(), np.array([2]).tobytes()])
                rid = uuid.uuid4().hex
                try:
                    answer, call = stub.ModelInfer.with_call(
                        request, timeout=30, metadata=[("x-request-id", rid)])  # fmt: skip
                    got = np.frombuffer(answer.raw_output_contents[0], np.int64).tolist()
                    sent = dict(call.trailing_metadata() or ()).get("x-request-id")
                    outcome = "" if got == np.tile(data, 2).tolist() and sent == rid else (
                        f"gRPC: wrong answer {got} or request id {sent!r}, sent {rid!r}")  # fmt: skip
                except grpc.RpcError as error:
                    outcome = f"gRPC {error.code()}: {error.details()}"
                with self.lock:
                    self.answered += 1
                    if outcome:
                        self.failures.append(outcome)


def _run_retry_example(grpc_port: int) -> dict[str, Any]:
    """The guide's retry example, its address changed to nginx's published gRPC port: what it
    prints, checked, and its RETRY policy, for the load's channels."""
    assert RETRY_EXAMPLE is not None, "docs/deployment.md has no gRPC retries example"
    code, printed = RETRY_EXAMPLE.groups()
    namespace: dict[str, Any] = {}
    output = io.StringIO()
    with contextlib.redirect_stdout(output):
        exec(code.replace("localhost:8081", f"127.0.0.1:{grpc_port}"), namespace)
    namespace["client"].close()
    assert output.getvalue() == printed
    return namespace["RETRY"]


def _first_request(port: int, timeout: float = 120) -> tuple[int, bytes]:
    """The answer to the first request nginx accepts (it listens once the replicas are ready)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=2).close()
            break
        except OSError:
            if time.monotonic() > deadline:
                raise TimeoutError(f"nginx did not listen on {port} within {timeout} s") from None
            time.sleep(0.2)
    conn = HTTPConnection("127.0.0.1", port, timeout=30)
    conn.request("GET", "/v2/health/ready")
    answer = conn.getresponse()
    return answer.status, answer.read()


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


def _wait_for_shutdown(container: str, timeout: float = 60) -> None:
    """Until the replica in `container` has begun its shutdown: uvicorn logs "Shutting down"
    when the SIGTERM arrives (or the container has already ended)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        logs = podman.run("podman", "logs", "--tail", "20", container, check=False)
        if "Shutting down" in logs.stdout + logs.stderr or _state(container) != "running":
            return
        time.sleep(0.1)
    raise AssertionError(f"{container} did not begin to shut down within {timeout} s")


def _healthy(container: str, timeout: float = 60) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if podman.run("podman", "healthcheck", "run", container, check=False).returncode == 0:
            return True
        time.sleep(1)
    return False


def _print_logs(project: str) -> None:
    """Each container's last 60 lines but the access log's answered requests (thousands)."""
    answered = ('"status":200,', '"status":0,')  # HTTP's and gRPC's OK
    for service, name in _containers(project).items():
        logs = podman.run("podman", "logs", name, check=False)
        lines = [line for line in (logs.stdout + logs.stderr).splitlines()
                 if not any(ok in line for ok in answered)]  # fmt: skip
        print(f"--- {service} ({name}) ---", *lines[-60:], sep="\n")


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


class Examples:
    """Triton's example clients, each run again and again through nginx: the script as a
    program where a checkout is at hand (a run that exits with anything but 0 is a failure:
    the examples exit 1 on a wrong answer), else its replay. The model-control examples count
    the repository index (7 models over HTTP, 8 over gRPC: custom_identity_int32 is there for
    the gRPC one only) and leave `simple` unloaded; between runs the harness loads it again,
    through nginx, for the next example.

    `hold()` stops the examples at a call's boundary (a replay's next call: mid-sequence or
    mid-control; a script's next run) until `release()`: the test kills and stops replicas
    there. The scripts carry no retry policy, so a unary call in flight on a replica at the
    instant it is SIGKILLed would be lost whatever the server (nginx cannot send a gRPC call
    again); the load's clients, with the guide's retry policy, are the ones that meet that
    instant."""

    def __init__(self, port: int, grpc_port: int, models: Path) -> None:
        self.urls = {"http": f"127.0.0.1:{port}", "grpc": f"127.0.0.1:{grpc_port}"}
        self.models = models
        self.stop = threading.Event()
        self.runs = 0
        self.failures: list[str] = []
        self.held_in: list[str] = []  # the example each hold() stopped
        self._hold, self._holding, self._go = (threading.Event() for _ in range(3))
        self._script = ""

    def hold(self, timeout: float = 60) -> None:
        self._go.clear()
        self._hold.set()
        assert self._holding.wait(timeout), "the examples did not reach a call's boundary"
        self.held_in.append(self._script)

    def release(self) -> None:
        self._hold.clear()
        self._holding.clear()
        self._go.set()

    def _between(self) -> None:
        if self._hold.is_set():
            self._holding.set()
            self._go.wait(120)

    def once(self, script: str, door: str) -> str:
        url = self.urls[door]
        self._script = script
        if EXAMPLES_DIR.is_dir():
            self._between()
            done = subprocess.run([sys.executable, str(EXAMPLES_DIR / script), "-u", url],
                                  capture_output=True, text=True, timeout=120)  # fmt: skip
            return "" if done.returncode == 0 else f"{script}: {(done.stdout + done.stderr)[-400:]}"
        try:
            REPLAYS[script](url, between=self._between)
        except (AssertionError, InferenceServerException, OSError) as failed:
            return f"{script} (replayed): {type(failed).__name__}: {str(failed)[:400]}"
        return ""

    def client(self) -> None:
        while not self.stop.is_set():
            for script, door in EXAMPLES:
                extra = script == "simple_grpc_model_control.py"
                if extra:
                    _readable(write_repository(self.models, ["custom_identity_int32"]))
                failed = self.once(script, door)
                if extra:
                    shutil.rmtree(self.models / "custom_identity_int32")
                if "model_control" in script:  # the harness's step, not the script's
                    failed = failed or self._load_simple()
                self.runs += 1
                if failed:  # when, to place it among the kill, the stop and the logs
                    self.failures.append(f"{time.strftime('%H:%M:%S')} {failed}")

    def _load_simple(self) -> str:
        conn = HTTPConnection("127.0.0.1", int(self.urls["http"].rsplit(":", 1)[1]), timeout=60)
        conn.request("POST", "/v2/repository/models/simple/load", b"{}",
                     {"content-type": "application/json"})  # fmt: skip
        answer = conn.getresponse()
        body = answer.read()
        return "" if answer.status == 200 else f"loading simple again: {answer.status} {body!r}"


def _redis_cli(containers: dict[str, str], *command: str) -> list[str]:
    return podman.run("podman", "exec", containers["redis"], "redis-cli", *command).stdout.split()


def _shape_stats(port: int) -> dict[str, Any]:
    conn = HTTPConnection("127.0.0.1", port, timeout=10)
    conn.request("GET", "/v2/models/Shape/versions/15/stats")
    answer = conn.getresponse()
    assert answer.status == 200, answer.read()[:300]
    (stats,) = json.loads(answer.read())["model_stats"]
    return stats  # type: ignore[no-any-return]


def _check_cluster(port: int, grpc_port: int, containers: dict[str, str]) -> None:
    """Redis answers in compose, the three replicas are registered in it, and statistics
    through nginx (any replica answers) are the sum over the three, HTTP and gRPC."""
    assert _redis_cli(containers, "PING") == ["PONG"]
    assert _redis_cli(containers, "CONFIG", "GET", "appendonly") == ["appendonly", "yes"]
    members = _redis_cli(containers, "ZRANGE", "opserve:opserve:members", "0", "-1")
    assert len(members) == 3, members
    body = json.dumps({"inputs": [{"name": "data", "shape": [2, 3], "datatype": "FP32",
                                   "data": [0.0] * 6}]})  # fmt: skip
    for _ in range(STATS_CALLS):
        conn = HTTPConnection("127.0.0.1", port, timeout=10)
        conn.request("POST", "/v2/models/Shape/versions/15/infer", body,
                     {"content-type": "application/json"})  # fmt: skip
        answer = conn.getresponse()
        assert answer.status == 200, answer.read()[:300]
        answer.read()
    # each replica writes its counts a few times a second, later on a loaded host: a replica
    # whose last calls are not written yet answers the sum at once (its own counts are read
    # from memory), the others only after its write; so wait until three reads in a row (one
    # per replica, nginx's round robin) agree
    deadline, agreeing = time.monotonic() + 30, 0
    while agreeing < 3:
        count = _shape_stats(port)["execution_count"]
        assert count <= STATS_CALLS, count  # never more than were made
        agreeing = agreeing + 1 if count == STATS_CALLS else 0
        assert time.monotonic() < deadline, f"the replicas' sums did not agree: {count}"
        time.sleep(0.05 if agreeing else 0.2)
    for _ in range(6):  # and then they stay the sum, whichever replica answers
        assert _shape_stats(port)["execution_count"] == STATS_CALLS
    with grpc.insecure_channel(f"127.0.0.1:{grpc_port}") as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        for _ in range(3):
            answer = stub.ModelStatistics(pb.ModelStatisticsRequest(name="Shape", version="15"))
            assert answer.model_stats[0].execution_count == STATS_CALLS


def _triton_repository() -> Path:
    """The models of Triton's example repository its model-control examples count (7), in a
    folder the replicas' user (uid 10001) can read."""
    return _readable(write_repository(Path(tempfile.mkdtemp(prefix="opserve-triton-")),
                                      MODEL_CONTROL_MODELS))  # fmt: skip


def _readable(root: Path) -> Path:
    for path in [root, *root.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    return root


def test_replicas_behind_nginx_answer_everything_through_a_kill_and_a_stop() -> None:
    podman.ensure_stand_ins()
    podman.build(IMAGE)
    project = f"opservetest{uuid.uuid4().hex[:8]}"
    port, grpc_port = free_port(), free_port()
    models = _triton_repository()
    try:
        podman.run("podman-compose", "-p", project, "-f", "docker-compose.yml", "-f", OVERRIDE,
                   "up", "-d", "--no-build", timeout=240, env={"OPSERVE_HTTP_PORT": str(port),
                   "OPSERVE_GRPC_PUBLISHED_PORT": str(grpc_port),
                   "OPSERVE_MODELS_DIR": str(models)})  # fmt: skip
        # the first request nginx takes is answered: it started once the replicas were ready
        assert _first_request(port) == (200, b'{"ready":true}')
        assert b"swagger-ui" in _wait_for(port, "/docs")  # Swagger UI through the balancer
        containers = _containers(project)
        for service in ("app1", "app2", "app3"):
            user = podman.run("podman", "exec", containers[service], "id", "-u").stdout.strip()
            assert user == "10001", f"{service} runs as uid {user}"
            assert _healthy(containers[service]), f"{service}'s HEALTHCHECK is not healthy"
        _check_cluster(port, grpc_port, containers)
        load, grpc_load = Load(port), GrpcLoad(grpc_port, _run_retry_example(grpc_port))
        examples = Examples(port, grpc_port, models)
        clients = [threading.Thread(target=load.client, args=(n,)) for n in range(CLIENTS)]
        clients += [threading.Thread(target=grpc_load.client, args=(n,))
                    for n in range(GRPC_CLIENTS)]  # fmt: skip
        clients.append(threading.Thread(target=examples.client))
        for client in clients:
            client.start()
        time.sleep(LOAD_SECONDS / 3)
        examples.hold()
        podman.run("podman", "kill", "--signal", "KILL", containers["app2"])
        examples.release()
        time.sleep(LOAD_SECONDS / 3)
        before_stop = load.answered
        examples.hold()
        stopping = threading.Thread(target=podman.run, args=(
            "podman", "stop", "-t", "10", containers["app3"]), kwargs={"timeout": 60})  # fmt: skip
        stopping.start()
        # the examples go on once app3 has its SIGTERM, while it drains and exits (a sleep of
        # 0.5 s here let them go on before a loaded host's podman had sent it: a call then
        # met the signal on its way in, and nginx answered it CANCELLED)
        _wait_for_shutdown(containers["app3"])
        examples.release()
        stopping.join(timeout=60)
        assert _state(containers["app3"]) == "exited"  # stopped by hand: not restarted
        time.sleep(LOAD_SECONDS / 3)
        load.stop.set()
        grpc_load.stop.set()
        examples.stop.set()
        for client in clients:
            client.join(timeout=120)
        assert examples.failures == [], (
            f"{len(examples.failures)} of {examples.runs} runs: {examples.failures[:3]}"
        )
        assert examples.runs >= len(EXAMPLES), f"only {examples.runs} example runs"
        assert _shape_stats(port)["execution_count"] <= STATS_CALLS  # the live replicas' sum
        assert load.failures == [], f"{len(load.failures)} of {load.answered}: {load.failures[:5]}"
        assert grpc_load.failures == [], (
            f"{len(grpc_load.failures)} of {grpc_load.answered}: {grpc_load.failures[:5]}")  # fmt: skip
        assert grpc_load.answered >= 500, f"only {grpc_load.answered} gRPC calls"
        assert load.answered >= 2000, f"only {load.answered} requests in {LOAD_SECONDS} s"
        assert load.answered > before_stop + 500  # the last replica carried the load alone
        print(f"{load.answered} HTTP requests, {grpc_load.answered} gRPC calls and "
              f"{examples.runs} example client runs through nginx in {LOAD_SECONDS} s, none "
              f"failed; the kill and the stop came in {examples.held_in}")  # fmt: skip
    except BaseException:
        _print_logs(project)  # what the replicas said, in the failure's report
        raise
    finally:
        _clean(project)
        subprocess.run(["rm", "-rf", str(models)], check=False)
