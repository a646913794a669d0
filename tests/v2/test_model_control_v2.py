"""The model repository extension and model configuration against a live server: versions
added and removed while requests run (poll mode), explicit loads with configuration and file
overrides, unloading under load, and hostile configurations: none of them fails a request
that should pass, and each refusal says why."""

import base64
import json
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from service.engines.onnxruntime.session import SPINNING
from tests.api.live_server import Server, free_port, serve
from tests.runtime.models import tiler

X = np.arange(6, dtype=np.float32).reshape(2, 3)


def _version(root: Path, number: int, repeats: list[int]) -> None:
    folder = root / "tiler" / str(number)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "model.onnx.tmp").write_bytes(tiler(repeats))
    os.replace(folder / "model.onnx.tmp", folder / "model.onnx")  # never seen half written


def _infer(client: httpclient.InferenceServerClient, version: str = "",
           model: str = "tiler") -> np.ndarray:  # fmt: skip
    given = httpclient.InferInput("x", [2, 3], "FP32")
    given.set_data_from_numpy(X)
    return client.infer(model, [given], model_version=version).as_numpy("y")


class Traffic:
    """Requests without a version, from a thread, until stopped: every answer must be one of
    the versions' (a shape it may have), none a failure."""

    def __init__(self, port: int) -> None:
        self.client = httpclient.InferenceServerClient(f"127.0.0.1:{port}")
        self.shapes: set[tuple[int, ...]] = set()
        self.failures: list[str] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self.stop.is_set():
            try:
                self.shapes.add(_infer(self.client).shape)
            except Exception as exc:
                self.failures.append(str(exc))

    def __enter__(self) -> "Traffic":
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(10)
        self.client.close()


def _until(predicate: Callable[[], bool], timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "not within the time"
        time.sleep(0.05)


def test_poll_mode_serves_a_new_version_and_drops_a_removed_one(tmp_path: Path) -> None:
    _version(tmp_path, 1, [1, 1])
    with serve(model_repository=str(tmp_path), model_control_mode="poll",
               repository_poll_seconds="0.2", default_max_batch_size="0") as server:  # fmt: skip
        client = httpclient.InferenceServerClient(f"127.0.0.1:{server.port}")
        with Traffic(server.port) as traffic:
            time.sleep(0.3)
            _version(tmp_path, 2, [2, 1])  # newer: Triton's policy serves the newest only
            _until(lambda: _infer(client).shape == (4, 3))
            index = {(r["version"], r["state"]) for r in client.get_model_repository_index()}
            assert index == {("1", "UNAVAILABLE"), ("2", "READY")}
            time.sleep(0.3)
            for path in (tmp_path / "tiler" / "2").iterdir():
                path.unlink()
            (tmp_path / "tiler" / "2").rmdir()
            _until(lambda: _infer(client).shape == (2, 3))
            time.sleep(0.3)
        assert traffic.failures == []
        assert traffic.shapes == {(2, 3), (4, 3)}
        client.close()


def test_poll_mode_keeps_serving_while_a_new_version_folder_has_no_model_yet(
    tmp_path: Path,
) -> None:
    """A version folder seen before its model file is in it (a copy in progress) fails to
    load; as a failed reload in Triton, it changes nothing that serves: version 1 answers
    throughout, version 2 is listed with its reason, then serves once its file is there
    (in CI, a poll between the folder and the file once made every request 404)."""
    _version(tmp_path, 1, [1, 1])
    with serve(model_repository=str(tmp_path), model_control_mode="poll",
               repository_poll_seconds="0.1", default_max_batch_size="0") as server:  # fmt: skip
        client = httpclient.InferenceServerClient(f"127.0.0.1:{server.port}")
        with Traffic(server.port) as traffic:
            (tmp_path / "tiler" / "2").mkdir()

            def states() -> set[tuple[str, str]]:
                return {(r["version"], r["state"]) for r in client.get_model_repository_index()}

            _until(lambda: ("2", "UNAVAILABLE") in states())
            assert states() == {("1", "READY"), ("2", "UNAVAILABLE")}
            (row,) = [r for r in client.get_model_repository_index() if r["version"] == "2"]
            assert "no model file" in row["reason"], row
            assert _infer(client).shape == (2, 3)
            _version(tmp_path, 2, [2, 1])
            _until(lambda: _infer(client).shape == (4, 3))
            assert states() == {("1", "UNAVAILABLE"), ("2", "READY")}
        assert traffic.failures == []
        assert traffic.shapes == {(2, 3), (4, 3)}
        client.close()


@pytest.fixture
def explicit(tmp_path: Path) -> Iterator[tuple[Server, Path]]:
    _version(tmp_path, 1, [1, 1])
    (tmp_path / "other").mkdir()  # a folder never loaded: listed by name alone
    with serve(model_repository=str(tmp_path), model_control_mode="explicit",
               load_models="tiler", default_max_batch_size="0") as server:  # fmt: skip
        yield server, tmp_path


def test_explicit_loads_with_overrides_and_a_failed_load_keeps_serving(
    explicit: tuple[Server, Path],
) -> None:
    server, _root = explicit
    client = httpclient.InferenceServerClient(f"127.0.0.1:{server.port}")
    assert client.get_model_repository_index() == [
        {"name": "other"}, {"name": "tiler", "version": "1", "state": "READY"}]  # fmt: skip
    # a model sent whole: a config and its file, as Triton's load takes them
    config = '{"name": "tiler", "version_policy": {"specific": {"versions": [3]}}}'
    client.load_model("tiler", config=config, files={"file:3/model.onnx": tiler([3, 1])})
    assert _infer(client, "3").shape == (6, 3)
    with pytest.raises(InferenceServerException, match="load failed for model 'tiler': version 3 "
                       "is at UNAVAILABLE state: the model is not a serialized"):  # fmt: skip
        client.load_model("tiler", config=config, files={"file:3/model.onnx": b"garbage"})
    assert _infer(client, "3").shape == (6, 3)  # the version that was loaded keeps serving
    with pytest.raises(InferenceServerException, match="Invalid config override"):
        client.load_model("tiler", config="{not json")
    assert _infer(client).shape == (6, 3)
    client.close()


def test_unloading_under_load_fails_no_request_in_flight(explicit: tuple[Server, Path]) -> None:
    server, _root = explicit
    client = httpclient.InferenceServerClient(f"127.0.0.1:{server.port}")
    with Traffic(server.port) as traffic:
        time.sleep(0.3)
        client.unload_model("tiler")
        _until(lambda: not client.is_model_ready("tiler"))
        time.sleep(0.2)
    unavailable = [f for f in traffic.failures if "has no available versions" in f]
    assert traffic.failures == unavailable  # refused cleanly once unloaded, nothing else
    assert client.get_model_repository_index()[1] == {
        "name": "tiler", "version": "1", "state": "UNAVAILABLE", "reason": "unloaded"}  # fmt: skip
    client.load_model("tiler")
    assert _infer(client).shape == (2, 3)
    client.close()


BODY = (b'{"inputs": [{"name": "x", "datatype": "FP32", "shape": [2, 3], '
        b'"data": [0, 1, 2, 3, 4, 5]}]}')  # fmt: skip


def _answer_around(server: Server, path: str, control: str) -> bytes:
    """The answer to a POST of BODY to `path` sent in two parts, Triton's `control` ("load" or
    "unload") of the tiler between them: once the model was found and its body is awaited."""
    head = (f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(BODY)}\r\n\r\n").encode()  # fmt: skip
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        sock.sendall(head + BODY[:20])
        time.sleep(0.3)  # the model is found; its body is awaited
        client = httpclient.InferenceServerClient(f"127.0.0.1:{server.port}")
        getattr(client, f"{control}_model")("tiler")
        client.close()
        sock.sendall(BODY[20:])
        return _whole_answer(sock)


def test_a_request_read_while_its_version_is_unloaded_is_refused(
    explicit: tuple[Server, Path],
) -> None:  # fmt: skip
    """The version was ready when the request's headers came, and was unloaded (and freed)
    before its body had all arrived: 503 saying so, not a failure of the server."""
    server, _root = explicit
    answer = _answer_around(server, "/v2/models/tiler/infer", "unload")
    assert answer.startswith(b"HTTP/1.1 503"), answer
    assert b"was unloaded while the request arrived" in answer


def _whole_answer(sock: socket.socket) -> bytes:
    """One HTTP answer read whole (its head, then Content-Length bytes of body), however the
    server's writes arrive."""
    answer = b""
    while b"\r\n\r\n" not in answer:
        answer += sock.recv(65536)
    head, _, body = answer.partition(b"\r\n\r\n")
    length = int(next(line.split(b":")[1] for line in head.split(b"\r\n")
                      if line.lower().startswith(b"content-length:")))  # fmt: skip
    while len(body) < length:
        body += sock.recv(65536)
    return head + b"\r\n\r\n" + body


def test_a_request_read_while_its_model_is_reloaded_runs_on_the_new_version(
    explicit: tuple[Server, Path],
) -> None:  # fmt: skip
    """A reload (a load of a model that serves) replaces its versions while a request's body
    is still arriving: a request that named no version runs on what serves now (found by a
    review: 503 'was unloaded'); one that named the version is refused as before."""
    server, _root = explicit
    answers = [_answer_around(server, path, "load")  # a reload: version 1 again, a new entry
               for path in ("/v2/models/tiler/infer", "/v2/models/tiler/versions/1/infer")]  # fmt: skip
    assert answers[0].startswith(b"HTTP/1.1 200"), answers[0]
    assert (
        b'"model_version":"1","outputs":[{"name":"y","datatype":"FP32","shape":[2,3]' in answers[0]
    )
    assert answers[1].startswith(b"HTTP/1.1 503"), answers[1]
    assert b"was unloaded while the request arrived" in answers[1]


def test_control_outside_explicit_mode_is_refused(tmp_path: Path) -> None:
    _version(tmp_path, 1, [1, 1])
    with serve(model_repository=str(tmp_path)) as server:
        client = httpclient.InferenceServerClient(f"127.0.0.1:{server.port}")
        with pytest.raises(InferenceServerException, match="explicit model load / unload is "
                           "not allowed if polling is enabled") as caught:  # fmt: skip
            client.load_model("tiler")
        assert caught.value.status() == "503"
        client.close()


HOSTILE = {
    "not_text": (b"\x00\x01 binary { ]", "config.pbtxt is not a text-format ModelConfig"),
    "labels_out": (b'output [ { name: "y" data_type: TYPE_FP32 dims: [ -1, -1 ] '
                   b'label_filename: "../../etc/passwd" } ]', "is outside model directory"),
    "file_out": (b'default_model_filename: "../../etc/passwd"', "must be a relative path"),
    "huge_dims": (b'input [ { name: "x" data_type: TYPE_FP32 dims: [ 9999999999, 3 ] } ]',
                  "the model expects"),
    "wrong_name": (b'name: "someone_else"', "unexpected directory name 'wrong_name'"),
    "wrong_type": (b'input [ { name: "x" data_type: TYPE_INT8 dims: [ 2, 3 ] } ]',
                   "configuration expects datatype TYPE_INT8 for input 'x'"),
}  # fmt: skip


def test_hostile_configurations_make_the_model_not_ready_with_a_reason(tmp_path: Path) -> None:
    for name, (config, _) in HOSTILE.items():
        (tmp_path / name / "1").mkdir(parents=True)
        (tmp_path / name / "1" / "model.onnx").write_bytes(tiler([1, 1]))
        (tmp_path / name / "config.pbtxt").write_bytes(config)
    (tmp_path / "good" / "1").mkdir(parents=True)
    (tmp_path / "good" / "1" / "model.onnx").write_bytes(tiler([1, 1]))
    with serve(model_repository=str(tmp_path), strict_readiness="false",
               default_max_batch_size="0") as server:  # fmt: skip
        client = httpclient.InferenceServerClient(f"127.0.0.1:{server.port}")
        index = {r["name"]: r for r in client.get_model_repository_index()}
        for name, (_, words) in HOSTILE.items():
            row = index[name]
            assert row["state"] == "UNAVAILABLE" and words in row["reason"], row
            with pytest.raises(InferenceServerException, match="has no available versions"):
                _ = client.infer(name, [httpclient.InferInput("x", [2, 3], "FP32")
                                        .set_data_from_numpy(X)])  # fmt: skip
        assert index["good"]["state"] == "READY" and _infer_model(client, "good").shape == (2, 3)
        client.close()
    with serve(model_repository=str(tmp_path), default_max_batch_size="0",
               strict_readiness="false") as server:  # the same again: starts, serves "good"  # fmt: skip
        assert httpclient.InferenceServerClient(f"127.0.0.1:{server.port}").is_model_ready("good")


def _infer_model(client: httpclient.InferenceServerClient, name: str) -> np.ndarray:
    given = httpclient.InferInput("x", [2, 3], "FP32")
    given.set_data_from_numpy(X)
    return client.infer(name, [given]).as_numpy("y")


def test_strict_readiness_follows_the_models(tmp_path: Path) -> None:
    """Strict (the default): not ready while a model failed; ready again once it is fixed and
    loaded; not ready after the last model is unloaded."""
    _version(tmp_path, 1, [1, 1])
    (tmp_path / "broken" / "1").mkdir(parents=True)
    (tmp_path / "broken" / "1" / "model.onnx").write_bytes(b"garbage")
    with serve(model_repository=str(tmp_path), model_control_mode="explicit", load_models="*",
               default_max_batch_size="0", strict_readiness="true",
               wait_path="/v2/health/live") as server:  # fmt: skip
        client = httpclient.InferenceServerClient(f"127.0.0.1:{server.port}")
        assert not client.is_server_ready()
        (tmp_path / "broken" / "1" / "model.onnx").write_bytes(tiler([2, 2]))
        client.load_model("broken")
        assert client.is_server_ready()
        client.unload_model("broken")
        assert client.is_server_ready()  # an unloaded model is no failure
        client.unload_model("tiler")
        assert not client.is_server_ready()  # no model is ready
        client.close()


def test_readiness_is_about_the_models_that_should_be_serving(tmp_path: Path) -> None:
    """A model that failed at start-up keeps a strict server unready until it loads or is
    unloaded (it was stuck after unload before); a client's failed load, of a new model, of
    the failed one or of a serving one, changes nothing, readiness included."""
    _version(tmp_path, 1, [1, 1])
    (tmp_path / "broken" / "2").mkdir(parents=True)
    (tmp_path / "broken" / "2" / "model.onnx").write_bytes(b"\x08\x01junk")
    with serve(model_repository=str(tmp_path), model_control_mode="explicit", load_models="*",
               default_max_batch_size="0", wait_path="/v2/health/live") as server:  # fmt: skip
        client = httpclient.InferenceServerClient(f"127.0.0.1:{server.port}")
        assert not client.is_server_ready()
        with pytest.raises(InferenceServerException, match="version 1 is at UNAVAILABLE"):
            client.load_model("ghost", config="{}", files={"file:1/model.onnx": b"junk"})
        assert not client.is_server_ready()  # still the start-up failure's doing
        client.unload_model("broken")
        assert client.is_server_ready()
        assert client.get_model_repository_index()[0] == {
            "name": "broken", "version": "2", "state": "UNAVAILABLE", "reason": "unloaded"}  # fmt: skip
        with pytest.raises(InferenceServerException, match="version 2 is at UNAVAILABLE"):
            client.load_model("broken")
        with pytest.raises(InferenceServerException, match="version folder 7 is not in"):
            client.load_model("tiler", config='{"version_policy": {"specific": '
                              '{"versions": [7, 1]}}}')  # fmt: skip
        assert client.is_server_ready() and _infer(client, "1").shape == (2, 3)
        assert [r.get("state") for r in client.get_model_repository_index()] == [
            "UNAVAILABLE", "READY"]  # fmt: skip
        client.close()


def test_a_file_override_is_base64_and_needs_a_config(explicit: tuple[Server, Path]) -> None:
    server, _root = explicit
    client = httpclient.InferenceServerClient(f"127.0.0.1:{server.port}")
    post = client._client_stub.post  # tritonclient encodes files itself; these are raw bodies
    answer = post("/v2/repository/models/tiler/load",
                  body='{"parameters": {"file:1/model.onnx": "not base64!"}}')  # fmt: skip
    assert answer.status_code == 400 and "is not base64" in answer.read().decode()
    data = base64.b64encode(tiler([1, 1])).decode()
    answer = post("/v2/repository/models/tiler/load",
                  body=f'{{"parameters": {{"file:1/model.onnx": "{data}"}}}}')  # fmt: skip
    assert answer.status_code == 400 and "need a 'config' too" in answer.read().decode()
    client.close()


GUARDED = 'parameters { key: "isolated" value { string_value: "true" } }\n'
SPINNER = 'parameters { key: "session.intra_op.allow_spinning" value { string_value: "1" } }\n'


def _override(name: str, **parameters: str) -> str:
    return json.dumps({"name": name, "backend": "onnxruntime", "parameters": {
        key: {"string_value": value} for key, value in parameters.items()}})  # fmt: skip


@contextmanager
def _both_doors(
    root: Path,
) -> Iterator[tuple[httpclient.InferenceServerClient, grpcclient.InferenceServerClient]]:
    """A server in explicit mode on `root`, with an HTTP and a gRPC client."""
    grpc_port = free_port()
    with serve(model_repository=str(root), model_control_mode="explicit",
               default_max_batch_size="0", grpc_port=str(grpc_port),
               wait_path="/v2/health/live") as server:  # fmt: skip
        http = httpclient.InferenceServerClient(f"127.0.0.1:{server.port}")
        grpc = grpcclient.InferenceServerClient(f"127.0.0.1:{grpc_port}")
        try:
            yield http, grpc
        finally:
            http.close()
            grpc.close()


def test_a_load_requests_config_keeps_the_operators_choices(tmp_path: Path) -> None:
    """Repository control is open to any client (as Triton's): a load request's configuration
    may not take a model out of the isolated workers that its config.pbtxt put it in, nor ask
    for a spinning pool its config.pbtxt does not, nor replace a config.pbtxt that cannot be
    read (whose choices are unknown); it may repeat the operator's choices, as a
    configuration read back from the server carries them. Over HTTP and gRPC: the rule lives
    below both doors (the model loader)."""
    broken = GUARDED + "a_field_from_a_newer_triton: 1\n"
    for name, config in (("guarded", GUARDED), ("spinner", SPINNER), ("tiler", ""),
                         ("broken", broken)):  # fmt: skip
        (tmp_path / name / "1").mkdir(parents=True)
        (tmp_path / name / "1" / "model.onnx").write_bytes(tiler([1, 1]))
        if config:
            (tmp_path / name / "config.pbtxt").write_text(config)
    with _both_doors(tmp_path) as (http, grpc):
        for client in (http, grpc):
            for name, parameters, refused in (
                ("guarded", {"isolated": "false"}, "may not take it out"),
                ("guarded", {}, "may not take it out"),
                ("tiler", {SPINNING: "1"}, "a spinning pool is the operator's choice"),
                ("guarded", {SPINNING: "1", "isolated": "true"}, "the operator's choice"),
                ("broken", {"isolated": "true"}, "own config.pbtxt cannot be read .* must be "
                                                 "mended first"),
            ):  # fmt: skip
                with pytest.raises(InferenceServerException, match=refused):
                    client.load_model(name, config=_override(name, **parameters))
                assert not http.is_model_ready(name)
            for name, parameters in (("guarded", {"isolated": "true"}),
                                     ("spinner", {SPINNING: "1"}), ("spinner", {}),
                                     ("tiler", {"isolated": "true"}), ("tiler", {SPINNING: "0"})):  # fmt: skip
                client.load_model(name, config=_override(name, **parameters))
                assert http.is_model_ready(name), (name, parameters)
                http.unload_model(name)


def test_a_bare_models_load_takes_the_requests_config_and_files(tmp_path: Path) -> None:
    """A bare `<name>.onnx` is a folder with no config.pbtxt to a load request: its config is
    the file's configuration, its files replace the model (they were ignored before, and the
    load answered success)."""
    (tmp_path / "bare.onnx").write_bytes(tiler([1, 1]))
    with _both_doors(tmp_path) as (http, grpc):
        http.load_model("bare")
        assert http.get_model_config("bare")["parameters"]["engine"] == {
            "string_value": "onnxruntime"}  # fmt: skip
        exact = json.dumps({"name": "bare", "parameters": {"engine": {"string_value": "exact"}}})
        for client in (http, grpc):
            http.load_model("bare")
            client.load_model("bare", config=exact)
            assert http.get_model_config("bare")["parameters"]["engine"] == {
                "string_value": "exact"}  # fmt: skip
        assert _infer(http, model="bare").shape == (2, 3)
        second = '{"name": "bare", "version_policy": {"specific": {"versions": [2]}}}'
        with pytest.raises(InferenceServerException, match=r"bare\.onnx is version 1 only"):
            http.load_model("bare", config=second)
        http.load_model("bare", config=second, files={"file:2/model.onnx": tiler([3, 1])})
        assert _infer(http, "2", "bare").shape == (6, 3)
