"""Triton's logging extension (core/log_settings.py) through tritonclient.http and
tritonclient.grpc, unchanged, as Triton's qa/L0_logging/logging_endpoint_test.py drives it; and
the running server's log lines read back: levels switched off are not written, the format
changes."""

import json
import re
import time
import warnings
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from google.protobuf import json_format
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc
from tritonclient.utils import InferenceServerException

from tests.grpc.conftest import Served, repository, serve_grpc

INITIAL = {"log_file": "", "log_info": True, "log_warning": True, "log_error": True,
           "log_verbose_level": 0, "log_format": "default"}  # fmt: skip
ISO8601 = re.compile(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}Z (\w+) (\d+) (.+):(\d+)] (.*)")


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Served, Path]]:
    root = tmp_path_factory.mktemp("logging")
    log = root / "server.log"
    with serve_grpc(log_to=log, log_level="info", **repository(root / "models")) as running:
        yield running, log


@pytest.fixture
def clients(served: tuple[Served, Path]) -> Iterator[tuple[httpclient.InferenceServerClient,
                                                          grpcclient.InferenceServerClient]]:  # fmt: skip
    server = served[0]
    http = httpclient.InferenceServerClient(f"127.0.0.1:{server.http.port}")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        grpc_client = grpcclient.InferenceServerClient(server.target)
    yield http, grpc_client
    http.update_log_settings(INITIAL | {"log_file": None})  # Triton's tearDown
    http.close()
    grpc_client.close()


def _grpc_form(settings: dict[str, object]) -> pb.LogSettingsResponse:
    kinds = {bool: "boolParam", int: "uint32Param", str: "stringParam"}
    made = pb.LogSettingsResponse()
    json_format.Parse(json.dumps({"settings": {key: {kinds[type(value)]: value}
                                               for key, value in settings.items()}}), made)  # fmt: skip
    return made


def test_the_initial_settings_are_tritons(clients) -> None:  # type: ignore[no-untyped-def]
    http, grpc_client = clients
    assert http.get_log_settings() == INITIAL
    assert grpc_client.get_log_settings() == _grpc_form(INITIAL)
    assert "logging" in http.get_server_metadata()["extensions"]


STEPS = [
    {"log_info": False, "log_warning": True, "log_error": True, "log_verbose_level": 0,
     "log_format": "default"},
    {"log_info": False, "log_warning": False, "log_error": True, "log_verbose_level": 0,
     "log_format": "default"},
    {"log_info": False, "log_warning": False, "log_error": False, "log_verbose_level": 0,
     "log_format": "default"},
    {"log_info": False, "log_warning": False, "log_error": False, "log_verbose_level": 1,
     "log_format": "default"},
    {"log_info": False, "log_warning": False, "log_error": False, "log_verbose_level": 1,
     "log_format": "ISO8601"},
]  # fmt: skip


def test_http_updates_as_tritons_test(clients) -> None:  # type: ignore[no-untyped-def]
    http, _ = clients
    with pytest.raises(InferenceServerException, match="log file location can not be updated"):
        http.update_log_settings(INITIAL | {"log_file": "log_file.log"})
    for step in STEPS:
        assert http.update_log_settings(step) == step | {"log_file": ""}
    assert http.get_log_settings() == STEPS[-1] | {"log_file": ""}


def test_grpc_updates_as_tritons_test(clients) -> None:  # type: ignore[no-untyped-def]
    http, grpc_client = clients
    with pytest.raises(InferenceServerException, match="log file location can not be updated"):
        grpc_client.update_log_settings(INITIAL | {"log_file": "log_file.log"})
    for step in STEPS:
        assert grpc_client.update_log_settings(step) == _grpc_form(step | {"log_file": ""})
    assert http.get_log_settings() == STEPS[-1] | {"log_file": ""}  # one store for both doors


def test_a_null_leaves_a_setting_as_it_is(clients) -> None:  # type: ignore[no-untyped-def]
    http, grpc_client = clients
    http.update_log_settings({"log_warning": False})
    assert http.update_log_settings({"log_warning": None, "log_info": False}) == INITIAL | {
        "log_warning": False, "log_info": False}  # fmt: skip
    answer = grpc_client.update_log_settings({"log_info": None, "log_error": False}, as_json=True)
    assert answer["settings"]["log_info"] == {"bool_param": False}
    assert answer["settings"]["log_error"] == {"bool_param": False}


@pytest.mark.parametrize(("change", "named"), [
    ({"log_info": "yes"}, "log_info"), ({"log_error": 1}, "log_error"),
    ({"log_verbose_level": -1}, "log_verbose_level"),
    ({"log_verbose_level": True}, "log_verbose_level"),
    ({"log_verbose_level": 2**32}, "log_verbose_level"),
    ({"log_format": "xml"}, "log_format"), ({"log_format": 3}, "log_format"),
])  # fmt: skip
def test_bad_values_are_refused_naming_the_setting(clients, served, change, named) -> None:  # type: ignore[no-untyped-def]
    http, _ = clients
    before = http.get_log_settings()
    with pytest.raises(InferenceServerException, match=named) as refused:
        http.update_log_settings(change | {"log_info": False} if named != "log_info" else change)
    assert refused.value.status() == "400"
    assert http.get_log_settings() == before  # all or nothing: log_info was not changed
    # gRPC: a value of the wrong kind only a raw message can send, and a bad format
    key, value = next(iter(change.items()))
    request = pb.LogSettingsRequest()
    if key == "log_verbose_level" or isinstance(value, str):
        request.settings[key].string_param = str(value)
    else:
        request.settings[key].uint32_param = int(value)
    with grpc.insecure_channel(served[0].target) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        with pytest.raises(grpc.RpcError) as status:
            stub.LogSettings(request)
    assert status.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert named in status.value.details()


def _lines_after(log: Path, mark: int, wanted: str, timeout: float = 10.0) -> list[str]:
    """The log's lines written after byte `mark`, once one holds `wanted` (or the timeout)."""
    deadline = time.monotonic() + timeout
    while True:
        lines = log.read_bytes()[mark:].decode(errors="replace").splitlines()
        if any(wanted in line for line in lines) or time.monotonic() > deadline:
            return lines
        time.sleep(0.05)


def _refused_load(http: httpclient.InferenceServerClient) -> None:
    """A load refused by the repository: it logs a warning with the model's name."""
    with pytest.raises(InferenceServerException):
        http.load_model("simple", config=json.dumps({"max_batch_size": 8, "input": [
            {"name": "INPUT0", "data_type": "TYPE_FP64", "dims": [16]}]}))  # fmt: skip


def test_the_running_servers_lines_follow_the_settings(clients, served) -> None:  # type: ignore[no-untyped-def]
    http, _ = clients
    log = served[1]
    mark = log.stat().st_size
    _refused_load(http)  # on by default: a JSON line
    lines = [line for line in _lines_after(log, mark, "refused") if "refused" in line]
    assert lines, "the warning was not written"
    assert json.loads(lines[0])["level"] == "warning"

    http.update_log_settings({"log_warning": False})
    mark = log.stat().st_size
    _refused_load(http)
    http.update_log_settings({"log_warning": True, "log_format": "ISO8601"})
    _refused_load(http)  # written again, in Triton's ISO8601 form: only this one
    lines = [line for line in _lines_after(log, mark, "refused") if "refused" in line]
    assert len(lines) == 1, lines
    found = ISO8601.fullmatch(lines[0])
    assert found is not None, lines[0]
    assert found[1] == "W" and int(found[2]) > 0 and "simple" in found[5]
