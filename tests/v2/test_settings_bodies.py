"""Settings and repository requests are small (service/core/settings_requests.py): their
bodies are refused past SETTINGS_BODY_BYTES, declared or streamed in chunks, before they are
parsed; a load, which carries a model's files, takes any body within the request limit and
is parsed on a kernel thread when large (a 60 MiB body of numbers held the event loop
280-437 ms when these routes parsed every body there). The gRPC methods of the same names:
tests/grpc/test_bounds.py."""

import base64
import threading
import warnings
from collections.abc import Iterator
from typing import Any

import orjson
import pytest

from service.api import v2_routes
from service.core.settings_requests import SETTINGS_BODY_BYTES
from service.main import create_app
from service.settings import Settings
from tests.runtime.models import tiler

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from starlette.testclient import TestClient

ROUTES = ["/v2/repository/index", "/v2/repository/models/tiler/unload",
          "/v2/systemsharedmemory/region/r0/register", "/v2/logging", "/v2/trace/setting",
          "/v2/models/tiler/trace/setting"]  # fmt: skip


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestClient]:
    root = tmp_path_factory.mktemp("repository")
    (root / "tiler" / "1").mkdir(parents=True)
    (root / "tiler" / "1" / "model.onnx").write_bytes(tiler([1, 1]))
    settings = Settings(model_repository=root, model_control_mode="explicit",
                        load_models="tiler", allow_client_shm=True, access_log=False)  # fmt: skip
    with TestClient(create_app(settings)) as test_client:
        yield test_client


def _padded(size: int) -> bytes:
    """A JSON object of exactly `size` bytes."""
    head, tail = b'{"pad": "', b'"}'
    return head + b"x" * (size - len(head) - len(tail)) + tail


@pytest.mark.parametrize("path", ROUTES)
def test_a_settings_body_past_its_limit_is_413(client: TestClient, path: str) -> None:
    over = _padded(SETTINGS_BODY_BYTES + 1)
    for sent in (over, iter([over[:1000], over[1000:]])):  # declared; streamed in chunks
        answer = client.post(path, content=sent)
        assert answer.status_code == 413, answer.text
        assert f"over the limit of {SETTINGS_BODY_BYTES} bytes for a settings or repository " \
               "request" in answer.json()["error"]  # fmt: skip
    at_limit = client.post(path, content=_padded(SETTINGS_BODY_BYTES))
    assert at_limit.status_code != 413, at_limit.text  # the route's own answer to "pad"


def test_a_large_load_body_is_parsed_on_a_kernel_thread(
    client: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A load's body over INLINE_BODY_BYTES (a text of 100,000 bytes beside the model) is
    parsed on a kernel thread, a small one on the loop; both load the model."""
    parsed_on: list[str] = []
    parse = v2_routes._object

    def recorded(body: bytes) -> Any:
        parsed_on.append(threading.current_thread().name)
        return parse(body)

    monkeypatch.setattr(v2_routes, "_object", recorded)
    files = {"config": "{}", "file:1/model.onnx": base64.b64encode(tiler([2, 1])).decode()}
    for name, extra in (("sent_small", {}), ("sent_large", {"x": "x" * 100_000})):
        body = orjson.dumps({"parameters": files, **extra})
        answer = client.post(f"/v2/repository/models/{name}/load", content=body)
        assert answer.status_code == 200, answer.text
        assert client.get(f"/v2/models/{name}/ready").status_code == 200
    assert [on.startswith("opserve-kernel") for on in parsed_on] == [False, True], parsed_on


def test_an_unload_body_is_a_settings_body(client: TestClient) -> None:
    """An unload names no files: its body is held to the settings limit, and its
    `unload_dependents` is still read."""
    answer = client.post("/v2/repository/models/tiler/unload",
                         json={"parameters": {"unload_dependents": "yes"}})  # fmt: skip
    assert answer.status_code == 400 and "unload_dependents" in answer.json()["error"]


def test_a_load_body_of_too_many_items_is_refused_before_it_is_parsed(
    client: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A load's members and elements are bounded (LOAD_CONFIG_ITEMS, and 4 per file the
    repository takes): a body of numbers past it is 413 unparsed (orjson holds the GIL, and so
    the loop, while it parses, on a thread or not); at the bound it loads."""
    parsed: list[bytes] = []
    monkeypatch.setattr(v2_routes, "_object", lambda body: parsed.append(body) or {})
    most = v2_routes.LOAD_CONFIG_ITEMS + 4 * 256  # OPSERVE_MAX_LOAD_FILES' default
    # parsed as {} (no files): the repository has no such model, 404
    for count, status in ((most, 404), (most + 1, 413)):
        numbers = b"[" + b",".join([b"1"] * count) + b"]"  # with the colon: `count` items
        answer = client.post("/v2/repository/models/many/load", content=b'{"x":' + numbers + b"}")
        assert answer.status_code == status, answer.text
    assert len(parsed) == 1
    assert f"holds {most + 1} JSON members and elements" in answer.json()["error"]
