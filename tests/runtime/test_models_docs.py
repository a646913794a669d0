"""docs/models.md as a user meets it: the server started with the guide's own command on the
repository the project ships (examples/model_repository), and each curl command run as written,
from the project's folder, printing what the guide shows (times in a trace left out)."""

import base64
import re
import shlex
from collections.abc import Iterator
from pathlib import Path

import pytest

from api_schemas.models import EXAMPLE_MODEL
from tests.api.live_server import Server, serve
from tests.curl_examples import assert_prints_as_shown, examples, need_curl

ROOT = Path(__file__).parents[2]
GUIDE = (ROOT / "docs" / "models.md").read_text()
EXAMPLE_FILE = ROOT / "examples" / "model_repository" / "tile_shape" / "1" / "model.onnx"
EXAMPLES = examples(GUIDE)
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
    need_curl()
    with serve(*shlex.split(START)[1:]) as running:  # python -m service takes opserve's flags
        yield running


@pytest.mark.parametrize(("command", "shown"), EXAMPLES)
def test_example_prints_as_documented(server: Server, command: str, shown: str) -> None:
    assert_prints_as_shown(command, shown, server.port, "localhost:8000")
