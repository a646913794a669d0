"""docs/models.md as a user meets it: the server started with the guide's own command on the
repository the project ships (examples/model_repository), and each curl command run as written,
from the project's folder, printing what the guide shows (times in a trace left out)."""

import base64
import re
import shlex
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from api_schemas.models import EXAMPLE_MODEL
from tests.api.live_server import Server, serve

ROOT = Path(__file__).parents[2]
GUIDE = (ROOT / "docs" / "models.md").read_text()
EXAMPLE_FILE = ROOT / "examples" / "model_repository" / "tile_shape" / "1" / "model.onnx"
_EXAMPLE = re.compile(r"^\$ (curl -s [^\n]*)\n(\{.*)$", re.M)
EXAMPLES = _EXAMPLE.findall(GUIDE)
(START,) = re.findall(r"```bash\n(opserve [^\n]*)\n```", GUIDE)


def test_the_example_model_file_is_the_openapi_example() -> None:
    assert EXAMPLE_FILE.read_bytes() == base64.b64decode(EXAMPLE_MODEL)


def test_the_guide_has_examples() -> None:
    commands = [command for command, _ in EXAMPLES]
    assert len(commands) >= 6
    assert any(" -F " in c for c in commands) and any(" -d " in c for c in commands)
    assert "docs/models.md" in (ROOT / "README.md").read_text()
    assert START == "opserve --model-repository examples/model_repository"


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    if shutil.which("curl") is None:
        pytest.skip("the guide's examples are curl commands: apt-get install curl")
    words = shlex.split(START)
    with serve(*words[1:]) as running:  # `python -m service` takes the same flags as `opserve`
        yield running


def _timeless(body: Any) -> Any:
    for entry in body.get("trace") or []:
        entry.pop("microseconds")
    return body


@pytest.mark.parametrize(("command", "shown"), EXAMPLES)
def test_example_prints_as_documented(server: Server, command: str, shown: str) -> None:
    command = command.replace("localhost:8000", f"127.0.0.1:{server.port}")
    done = subprocess.run(command, shell=True, cwd=ROOT, capture_output=True, text=True,
                          timeout=60)  # fmt: skip
    assert done.returncode == 0, done.stderr
    printed = done.stdout
    if "%{http_code}" in command:  # the guide shows the status after the body
        printed, _, code = printed.rpartition(" ")
        shown, _, shown_code = shown.rpartition(" ")
        assert code == shown_code
    assert _timeless(orjson.loads(printed)) == _timeless(orjson.loads(shown))
