"""A shared memory region is the registering client's own (issue 25), on a real server with
client shared memory and the reference fallback on: another local user who watches /dev/shm
and registers every new file while a victim's 1 MiB inputs go through a fallback worker (its
model asks for the exact engine, whose Identity runs on onnx.reference) never reads the
victim's values back; keys with the server's prefix are refused; a known client
registers only objects it owns; a proxy header does not lend a client another's identity."""

import contextlib
import http.client
import json
import os
import select
import socket
import threading
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import numpy as np
import pytest
import tritonclient.http as triton
from tritonclient.utils import InferenceServerException

from tests.api.live_server import Server, serve
from tests.triton_examples import write_repository

NOBODY = 65534
ELEMENTS = 300_000  # 1.2 MB of INT32: through the fallback's shared memory files
SENTINEL = 0x5EC0_0000  # the victim's values start here
VICTIM = "custom_identity_int32"
EXACT = 'parameters { key: "engine" value { string_value: "exact" } }\n'
"""The victim's engine: onnxruntime runs it in process, where no transport file is made."""
pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="runs a client as another user")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    root = write_repository(tmp_path_factory.mktemp("models"), [VICTIM])
    config = root / VICTIM / "config.pbtxt"
    config.write_text(config.read_text() + EXACT)
    with serve(model_repository=str(root), reference_fallback="true",
               allow_client_shm="true") as running:  # fmt: skip
        yield running


@pytest.fixture
def client(server: Server) -> Iterator[triton.InferenceServerClient]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        made = triton.InferenceServerClient(f"127.0.0.1:{server.port}")
    yield made
    made.unregister_system_shared_memory()
    made.close()


@pytest.fixture
def owned_object() -> Iterator[Callable[[int, int], str]]:
    """Makes a 64-byte object in /dev/shm owned by `uid` with `mode`, returns its key."""
    made: list[str] = []

    def make(uid: int, mode: int) -> str:
        key = f"/opserve_test_{os.getpid()}_owner_{len(made)}"
        fd = os.open(f"/dev/shm{key}", os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        made.append(key)
        os.write(fd, bytes(64))
        os.fchown(fd, uid, -1)
        os.fchmod(fd, mode)
        os.close(fd)
        return key

    yield make
    for key in made:
        os.unlink(f"/dev/shm{key}")


@pytest.fixture(autouse=True)
def forget_stolen(server: Server) -> Iterator[None]:
    """The region the raw requests here register, unregistered after each test."""
    yield
    _post(server.port, "/v2/systemsharedmemory/region/stolen/unregister", {})


def _post(port: int, path: str, body: dict[str, Any],
          headers: dict[str, str] | None = None) -> tuple[int, dict[str, Any]]:  # fmt: skip
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        connection.request("POST", path, json.dumps(body), {"content-type": "application/json",
                                                            **(headers or {})})  # fmt: skip
        answer = connection.getresponse()
        text = answer.read()
        return answer.status, json.loads(text) if text else {}
    finally:
        connection.close()


def _register(port: int, key: str, size: int, **headers: str) -> tuple[int, dict[str, Any]]:
    return _post(port, "/v2/systemsharedmemory/region/stolen/register",
                 {"key": key, "offset": 0, "byte_size": size}, headers)  # fmt: skip


# ---- the attack: a watcher of /dev/shm against a victim of the fallback ----------------------


def _watch(port: int, go: int, report: int) -> None:
    """The watcher, in a child process run as nobody: until `go` closes, register every new
    name in /dev/shm (and what a private directory's names could be) and read each region
    that registers back through Tile/13; write what happened to `report` as JSON."""
    # the server's names are tried even if made before (its directory, by an earlier run)
    seen = {name for name in os.listdir("/dev/shm") if not name.startswith("opserve-")}
    found: dict[str, Any] = {"tried": 0, "statuses": {}, "accepted": [], "leaked": 0,
                             "directories": [], "listed": []}  # fmt: skip

    def attempt(key: str, size: int) -> None:
        status, _body = _register(port, key, max(size, 4))
        found["tried"] += 1
        found["statuses"][str(status)] = found["statuses"].get(str(status), 0) + 1
        if status != 200:
            return
        found["accepted"].append(key)
        count = max(size, 4) // 4
        _code, answer = _post(port, "/v2/models/Tile/versions/13/infer", {"inputs": [
            {"name": "input", "datatype": "INT32", "shape": [count], "parameters": {
                "shared_memory_region": "stolen", "shared_memory_byte_size": count * 4}},
            {"name": "repeats", "datatype": "INT64", "shape": [1], "data": [1]}]})  # fmt: skip
        values = np.asarray(answer.get("outputs", [{}])[0].get("data", []), np.int64)
        found["leaked"] += int(np.count_nonzero((values >= SENTINEL)
                                                & (values < SENTINEL + ELEMENTS)))  # fmt: skip
        _post(port, "/v2/systemsharedmemory/region/stolen/unregister", {})

    while not select.select([go], [], [], 0)[0]:
        for name in sorted(set(os.listdir("/dev/shm")) - seen):
            seen.add(name)
            try:
                info = os.stat(f"/dev/shm/{name}")
            except OSError:
                continue
            if os.path.isdir(f"/dev/shm/{name}"):
                found["directories"].append(name)
                with contextlib.suppress(OSError):
                    found["listed"].append(os.listdir(f"/dev/shm/{name}"))
                attempt(f"{name}/{name}", 64)  # a file inside, by any name: not a key
            attempt(name, info.st_size)
    os.write(report, json.dumps(found).encode())


@contextlib.contextmanager
def watcher(port: int) -> Iterator[dict[str, Any]]:
    """The watcher running as nobody while the block runs; then its report."""
    go_r, go_w = os.pipe()
    report_r, report_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: nobody from here on
        code = 1
        try:
            os.close(go_w)
            os.close(report_r)
            os.setgroups([])
            os.setgid(NOBODY)
            os.setuid(NOBODY)
            _watch(port, go_r, report_w)
            code = 0
        finally:
            os._exit(code)
    os.close(go_r)
    os.close(report_w)
    result: dict[str, Any] = {}
    try:
        yield result
    finally:
        os.close(go_w)
        chunks = []
        while chunk := os.read(report_r, 1 << 16):
            chunks.append(chunk)
        os.close(report_r)
        _pid, status = os.waitpid(pid, 0)
        assert status == 0, "the watcher failed"
        result.update(json.loads(b"".join(chunks)))


def test_a_watcher_of_dev_shm_never_reads_a_victims_inputs(server: Server) -> None:
    done = threading.Event()
    answered: list[bool] = []

    def victim() -> None:
        client = triton.InferenceServerClient(f"127.0.0.1:{server.port}")
        turn = 0
        while not done.is_set() or turn < 10:
            data = (SENTINEL + np.arange(ELEMENTS, dtype=np.int64)).astype(np.int32)[None]
            given = triton.InferInput("INPUT0", [1, ELEMENTS], "INT32")
            given.set_data_from_numpy(data)
            result = client.infer(VICTIM, [given])
            answered.append(bool(np.array_equal(result.as_numpy("OUTPUT0"), data)))
            turn += 1
        client.close()

    config = httpx.get(f"{server.url}/v2/models/{VICTIM}/config").json()
    assert config["parameters"]["engine"] == {"string_value": "exact"}  # the fallback's way
    with watcher(server.port) as report:
        sent = threading.Thread(target=victim)
        sent.start()
        threading.Event().wait(4)
        done.set()
        sent.join(120)
    assert len(answered) >= 10 and all(answered)
    assert report["leaked"] == 0 and report["accepted"] == [], report
    assert report["tried"] and set(report["statuses"]) == {"400"}, report
    # the fallback's private directory was made while the watcher looked, and it could not
    # list it; any other directory other test runs made is no more open
    assert any(name.startswith("opserve-transport-") for name in report["directories"])
    assert report["listed"] == [], report


# ---- the rule at the door -------------------------------------------------------------------


@pytest.mark.parametrize("key", ["/opserve-1-00ff", "opserve-transport-abc"])
def test_a_key_with_the_servers_prefix_is_400(server: Server, key: str) -> None:
    status, body = _register(server.port, key, 8)
    assert status == 400
    assert body["error"] == (f"cannot register shared memory region 'stolen' - shm key '{key}' "
                             "names the server's own files (its names begin with 'opserve-')")  # fmt: skip


def test_a_known_client_registers_its_own_objects_only(
    client: triton.InferenceServerClient, owned_object: Callable[[int, int], str]
) -> None:
    theirs = owned_object(NOBODY, 0o666)
    with pytest.raises(InferenceServerException, match="owned by uid 65534, not by the "
                       r"registering client's user \(uid 0\)") as caught:  # fmt: skip
        client.register_system_shared_memory("r", theirs, 64)
    assert caught.value.status() == "400"
    mine = owned_object(0, 0o600)
    client.register_system_shared_memory("r", mine, 64)
    assert [region["key"] for region in client.get_system_shared_memory_status()] == [mine]


def test_a_proxy_header_lends_no_identity(server: Server,
                                          owned_object: Callable[[int, int], str]) -> None:  # fmt: skip
    """uvicorn takes a client's address and port from X-Forwarded-For when the peer is
    127.0.0.1: naming another open connection of root's there must not make the request
    root's. Such a request's user is unknown: root's own object is refused."""
    mine = owned_object(0, 0o600)
    with socket.create_connection(("127.0.0.1", server.port)) as other:  # root's, held open
        named = f"127.0.0.1:{other.getsockname()[1]}"
        for header in ("X-Forwarded-For", "Forwarded", "X-Real-IP"):
            status, body = _register(server.port, mine, 64, **{header: named})
            assert status == 400, (header, body)
            assert "it is owned by the server's user and the registering client's user could " \
                   "not be told" in body["error"]  # fmt: skip
    status, _body = _register(server.port, mine, 64)  # without: told, and its own
    assert status == 200
    _post(server.port, "/v2/systemsharedmemory/region/stolen/unregister", {})


def test_an_unknown_client_may_use_an_object_open_to_everyone(
    server: Server, owned_object: Callable[[int, int], str]
) -> None:
    shared = owned_object(NOBODY, 0o666)
    status, body = _register(server.port, shared, 64, **{"X-Forwarded-For": "10.0.0.1"})
    assert status == 200, body
    _post(server.port, "/v2/systemsharedmemory/region/stolen/unregister", {})
