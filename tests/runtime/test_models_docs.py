"""The curl examples of docs/models.md run against the app (with a repository holding the
example model) and answer what the guide shows; times in a trace are left out of the match."""

import base64
import re
import shlex
from pathlib import Path
from typing import Any

import orjson
import pytest
from starlette.testclient import TestClient

from api_schemas.models import EXAMPLE_MODEL
from service.main import create_app
from service.settings import Settings

ROOT = Path(__file__).parents[2]
GUIDE = ROOT / "docs" / "models.md"
_EXAMPLE = re.compile(r"^\$ (curl -s [^\n]*)\n(\{.*)$", re.M)
EXAMPLES = _EXAMPLE.findall(GUIDE.read_text())


def test_the_example_model_file_is_the_openapi_example() -> None:
    assert (ROOT / "docs" / "tile_shape.onnx").read_bytes() == base64.b64decode(EXAMPLE_MODEL)


def test_the_guide_has_examples() -> None:
    commands = [command for command, _ in EXAMPLES]
    assert len(commands) >= 6
    assert any(" -F " in c for c in commands) and any(" -d " in c for c in commands)
    assert "docs/models.md" in (ROOT / "README.md").read_text()


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Any:
    repository = tmp_path_factory.mktemp("repository")
    (repository / "tile_shape" / "1").mkdir(parents=True)
    (repository / "tile_shape" / "1" / "model.onnx").write_bytes(base64.b64decode(EXAMPLE_MODEL))
    with TestClient(create_app(Settings(model_repository=repository, access_log=False))) as c:
        yield c


def _call(client: TestClient, command: str) -> tuple[int, Any]:
    words = shlex.split(command)
    url = next(w for w in words if w.startswith("localhost:8000")).removeprefix("localhost:8000")
    if "-F" in words:
        fields = [words[i + 1].partition("=") for i, w in enumerate(words) if w == "-F"]
        files = {k: (v[1:], (ROOT / v[1:]).read_bytes()) for k, _, v in fields if v[:1] == "@"}
        data = {k: v for k, _, v in fields if v[:1] != "@"}
        answer = client.post(url, data=data, files=files)
    elif "-d" in words:
        answer = client.post(url, content=words[words.index("-d") + 1],
                             headers={"content-type": "application/json"})  # fmt: skip
    else:
        answer = client.get(url)
    return answer.status_code, orjson.loads(answer.content)


def _timeless(body: Any) -> Any:
    for entry in body.get("trace") or []:
        entry.pop("microseconds")
    return body


@pytest.mark.parametrize(("command", "shown"), EXAMPLES)
def test_example_answers_as_documented(client: TestClient, command: str, shown: str) -> None:
    status, body = _call(client, command)
    if "%{http_code}" in command:
        shown, _, code = shown.rpartition(" ")
        assert status == int(code)
    assert _timeless(body) == _timeless(orjson.loads(shown))
