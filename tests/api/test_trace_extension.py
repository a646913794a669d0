"""Triton's trace extension (core/tracing.py, core/trace_settings.py) through tritonclient.http
and tritonclient.grpc, unchanged, as Triton's qa/L0_trace/trace_endpoint_test.py drives it
(a server started as its test.sh starts one: trace file, TIMESTAMPS, rate 1); then the trace
file read back: which requests are traced (rate, count, a model's own setting), and their
timestamps against the client's own clock (the same monotonic clock of the host)."""

import json
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from google.protobuf import json_format
from tritonclient.utils import InferenceServerException

from tests.grpc.conftest import Served, repository, serve_grpc

STAMPS = ["REQUEST_START", "QUEUE_START", "COMPUTE_START", "COMPUTE_INPUT_END",
          "COMPUTE_OUTPUT_START", "COMPUTE_END", "REQUEST_END"]  # fmt: skip
FRONT = {"HTTP": (["HTTP_RECV_START", "HTTP_RECV_END"], ["HTTP_SEND_START", "HTTP_SEND_END"]),
         "GRPC": (["GRPC_WAITREAD_START", "GRPC_WAITREAD_END"],
                  ["GRPC_SEND_START", "GRPC_SEND_END"])}  # fmt: skip
CLEAR = {"trace_level": None, "trace_rate": None, "trace_count": None, "log_frequency": None}


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Served, Path]]:
    root = tmp_path_factory.mktemp("trace")
    trace_file = root / "global_unittest.log"
    with serve_grpc(trace_file=str(trace_file), trace_level="TIMESTAMPS", trace_rate="1",
                    **repository(root / "models")) as running:  # fmt: skip
        yield running, trace_file


@pytest.fixture
def clients(served: tuple[Served, Path]) -> Iterator[tuple[httpclient.InferenceServerClient,
                                                          grpcclient.InferenceServerClient]]:  # fmt: skip
    server = served[0]
    http = httpclient.InferenceServerClient(f"127.0.0.1:{server.http.port}")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        grpc_client = grpcclient.InferenceServerClient(server.target)
    yield http, grpc_client
    http.update_trace_settings(model_name="simple", settings=CLEAR)  # Triton's tearDown
    http.update_trace_settings(settings=CLEAR)
    http.close()
    grpc_client.close()


def initial(path: Path) -> dict[str, Any]:
    return {"trace_file": str(path), "trace_level": ["TIMESTAMPS"], "trace_rate": "1",
            "trace_count": "-1", "log_frequency": "0", "trace_mode": "triton"}  # fmt: skip


def _grpc_form(settings: dict[str, Any]) -> grpcclient.service_pb2.TraceSettingResponse:
    made = grpcclient.service_pb2.TraceSettingResponse()
    json_format.Parse(json.dumps({"settings": {
        key: {"value": value if isinstance(value, list) else [value]}
        for key, value in settings.items()}}), made)  # fmt: skip
    return made


def test_get_settings_as_tritons_test(clients, served) -> None:  # type: ignore[no-untyped-def]
    http, grpc_client = clients
    expected = initial(served[1])
    assert http.get_trace_settings(model_name="simple") == expected
    assert http.get_trace_settings() == expected
    assert grpc_client.get_trace_settings(model_name="simple") == _grpc_form(expected)
    assert grpc_client.get_trace_settings() == _grpc_form(expected)
    for client in clients:
        with pytest.raises(InferenceServerException,
                           match="Request for unknown model : does-not-exist"):  # fmt: skip
            client.get_trace_settings(model_name="does-not-exist")
    assert "trace" in http.get_server_metadata()["extensions"]


@pytest.mark.parametrize("door", [0, 1])
def test_update_settings_as_tritons_test(clients, served, door) -> None:  # type: ignore[no-untyped-def]
    client = clients[door]
    form = (lambda s: s) if door == 0 else _grpc_form
    with pytest.raises(InferenceServerException, match="trace file location can not be updated"):
        client.update_trace_settings(model_name="simple", settings={"trace_file": "model.log"})
    assert client.get_trace_settings(model_name="simple") == form(initial(served[1]))
    both = initial(served[1]) | {"trace_level": ["TIMESTAMPS", "TENSORS"]}
    assert client.update_trace_settings(settings={"trace_level": ["TIMESTAMPS", "TENSORS"]}) == (
        form(both))  # fmt: skip
    assert client.get_trace_settings(model_name="simple") == form(both)  # falls back to global
    with pytest.raises(InferenceServerException, match="Request for unknown model"):
        client.update_trace_settings(model_name="does-not-exist", settings={"trace_rate": "2"})


@pytest.mark.parametrize("door", [0, 1])
def test_clear_settings_as_tritons_test(clients, served, door) -> None:  # type: ignore[no-untyped-def]
    client = clients[door]
    form = (lambda s: s) if door == 0 else _grpc_form
    client.update_trace_settings(model_name="simple",
                                 settings={"trace_rate": "12", "log_frequency": "34"})  # fmt: skip
    client.update_trace_settings(settings={"trace_rate": "56", "trace_count": "78",
                                           "trace_level": ["OFF"]})  # fmt: skip
    off = initial(served[1]) | {"trace_level": ["OFF"]}
    assert client.update_trace_settings(settings={"trace_rate": None, "trace_count": None}) == (
        form(off))  # fmt: skip
    assert client.get_trace_settings(model_name="simple") == form(
        off | {"trace_rate": "12", "log_frequency": "34"})  # fmt: skip
    assert client.update_trace_settings(model_name="simple",
                                        settings={"trace_rate": None, "trace_level": None}) == (
        form(off | {"log_frequency": "34"}))  # fmt: skip
    assert client.get_trace_settings() == form(off)


@pytest.mark.parametrize(("change", "text"), [
    ({"trace_rate": "abc"}, "Unable to parse 'trace_rate', got: abc"),
    ({"trace_rate": "-1"}, "Unable to parse 'trace_rate', value is out of range"),
    ({"trace_count": "-2"}, "Unable to parse 'trace_count', value is out of range"),
    ({"log_frequency": str(2**32)}, "Unable to parse 'log_frequency', value is out of range"),
    ({"trace_level": ["OFF", "TIMESTAMPS"]}, "Expect only one trace level 'OFF' is specified"),
    ({"trace_level": ["LOUD"]}, "'trace_level': 'LOUD' is not OFF, TIMESTAMPS or TENSORS"),
])  # fmt: skip
def test_bad_values_are_refused_and_change_nothing(clients, served, change, text) -> None:  # type: ignore[no-untyped-def]
    http, grpc_client = clients
    with pytest.raises(InferenceServerException, match=text) as refused:
        http.update_trace_settings(settings={"trace_count": "5", **change})
    assert refused.value.status() == "400"
    with pytest.raises(InferenceServerException, match=text) as refused:
        grpc_client.update_trace_settings(settings={"trace_count": "5", **change})
    assert refused.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert http.get_trace_settings() == initial(served[1])


def _records(path: Path) -> dict[int, dict[str, Any]]:
    """The trace file's traces by id: the model's name and version, and its timestamps."""
    traces: dict[int, dict[str, Any]] = {}
    for entry in json.loads(path.read_bytes()) if path.exists() else []:
        trace = traces.setdefault(entry["id"], {"timestamps": {}})
        trace.update({k: v for k, v in entry.items() if k not in ("id", "timestamps")})
        for stamp in entry.get("timestamps", []):
            trace["timestamps"][stamp["name"]] = stamp["ns"]
    return traces


def _infer(client: Any, module: Any) -> None:
    inputs = [module.InferInput(name, [1, 16], "INT32") for name in ("INPUT0", "INPUT1")]
    for tensor in inputs:
        tensor.set_data_from_numpy(np.arange(16, dtype=np.int32).reshape(1, 16))
    client.infer("simple", inputs)


def _since(path: Path, start: int) -> dict[int, dict[str, Any]]:
    """The file's traces whose first stamp comes at or after `start` (the server stamps with
    the tests' monotonic clock). A trace is written once its answer has been sent, so the
    last trace of the test before may land after this test began: counting the file's traces
    at the start would miss it, and take it for one of this test's."""
    return {key: trace for key, trace in _records(path).items()
            if trace["timestamps"] and min(trace["timestamps"].values()) >= start}  # fmt: skip


def _wait_for(path: Path, count: int, since: int = 0,
              timeout: float = 10.0) -> dict[int, dict[str, Any]]:  # fmt: skip
    """The file's traces from `since` on once they are `count` (written by the server's own
    thread)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            found = _since(path, since)
        except ValueError:  # caught between the write of its two parts
            found = {}
        if len(found) >= count or time.monotonic() > deadline:
            return found
        time.sleep(0.05)


def test_traces_written_with_their_timestamps_in_order(clients, served) -> None:  # type: ignore[no-untyped-def]
    http, grpc_client = clients
    path = served[1]
    began = time.monotonic_ns()
    spans = []
    for client, module in ((http, httpclient), (grpc_client, grpcclient)) * 2:
        start = time.monotonic_ns()
        _infer(client, module)
        spans.append((start, time.monotonic_ns()))
    traces = _wait_for(path, 4, since=began)
    new = [traces[key] for key in sorted(traces)]
    assert len(new) == 4
    for trace, (start, end), door in zip(new, spans, ["HTTP", "GRPC"] * 2, strict=True):
        assert (trace["model_name"], trace["model_version"]) == ("simple", 1)
        stamps = trace["timestamps"]
        receive, send = FRONT[door]
        assert list(stamps) == [*receive, *STAMPS, *send]
        times = list(stamps.values())
        assert times == sorted(times)
        # the server's stamps lie within the client's call (one monotonic clock), to the
        # answer sent (gRPC's send ends when the call is done: after the client has it)
        assert start <= times[0] and stamps["REQUEST_END"] <= end


def test_rate_count_and_a_models_own_setting_decide_what_is_traced(clients, served) -> None:  # type: ignore[no-untyped-def]
    http, grpc_client = clients
    path = served[1]
    began = time.monotonic_ns()
    http.update_trace_settings(settings={"trace_rate": "3"})
    for _ in range(7):
        _infer(http, httpclient)  # the 3rd and 6th
    assert len(_wait_for(path, 2, since=began)) == 2
    http.update_trace_settings(model_name="simple", settings={"trace_rate": "1",
                                                              "trace_count": "2"})  # fmt: skip
    for _ in range(4):
        _infer(grpc_client, grpcclient)  # the first two, then the count is spent
    traced = _wait_for(path, 4, since=began)
    time.sleep(0.3)  # nothing more comes
    assert len(_since(path, began)) == len(traced) == 4
    assert http.get_trace_settings(model_name="simple")["trace_count"] == "0"
    assert http.get_trace_settings()["trace_count"] == "-1"
    http.update_trace_settings(model_name="simple", settings={"trace_level": ["OFF"],
                                                              "trace_count": None})  # fmt: skip
    _infer(http, httpclient)
    time.sleep(0.3)
    assert len(_since(path, began)) == 4


def test_log_frequency_writes_groups_to_numbered_files(clients, served) -> None:  # type: ignore[no-untyped-def]
    http, _ = clients
    path = served[1]
    http.update_trace_settings(settings={"log_frequency": "2"})
    for _ in range(5):
        _infer(http, httpclient)
    groups = [path.with_name(f"{path.name}.{n}") for n in range(3)]
    # written by the server's thread once each group's last answer is sent
    first = [_wait_for(group, 2) for group in groups[:2]]
    assert [len(found) for found in first] == [2, 2]
    assert not groups[2].exists()  # the fifth is kept until its group is full, or the setting
    http.update_trace_settings(settings={"log_frequency": None})  # changes: then written
    assert len(_wait_for(groups[2], 1)) == 1
