"""The README's curl examples run against the app and answer what the README shows."""

import re
import shlex
from pathlib import Path

import orjson
import pytest
from fastapi.testclient import TestClient

from service.main import create_app

README = Path(__file__).parents[1] / "README.md"
_EXAMPLE = re.compile(r"```bash\n(curl .*?)\n```\n```json\n(.*?)\n```", re.S)


def _examples() -> list[tuple[str, str]]:
    return _EXAMPLE.findall(README.read_text())


def test_readme_has_examples() -> None:
    assert len(_examples()) >= 4


@pytest.mark.parametrize(("command", "shown"), _examples())
def test_readme_example_runs(command: str, shown: str) -> None:
    words = shlex.split(command)
    url = next(w for w in words if w.startswith("localhost:8000"))
    body = words[words.index("-d") + 1]
    with TestClient(create_app()) as client:
        response = client.post(url.removeprefix("localhost:8000"), content=body,
                               headers={"content-type": "application/json"})  # fmt: skip
    assert orjson.loads(response.content) == orjson.loads(shown)


def test_readme_lists_every_setting() -> None:
    from service.settings import Settings

    text = README.read_text()
    for name in Settings.model_fields:
        assert f"`OPSERVE_{name.upper()}`" in text, f"README's settings table lacks {name}"
