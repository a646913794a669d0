"""The curl examples in the README, docs/api.md and docs/v2.md run against the app and answer
what the docs show, and the Python examples of docs/v2.md run against a real server and print
what the docs show, so the docs cannot drift from the service."""

import re
import shlex
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path

import orjson
import pytest
from fastapi.testclient import TestClient

from service.main import create_app
from tests.grpc.conftest import Served, serve_grpc

ROOT = Path(__file__).parents[1]
# README: a ```bash block with one curl, then a ```json block with its answer.
_README = re.compile(r"```bash\n(curl .*?)\n```\n```json\n(.*?)\n```", re.S)
# docs/api.md: "$ curl ..." lines, each followed by its answer (and " <status>" with -w).
_GUIDE = re.compile(r"^\$ (curl -s [^|\n]*)\n(\{.*)$", re.M)


def _examples() -> list[tuple[str, str, str]]:
    readme = [("README", c, a) for c, a in _README.findall((ROOT / "README.md").read_text())]
    guide = [("api.md", c, a) for c, a in _GUIDE.findall((ROOT / "docs/api.md").read_text())]
    v2 = [("v2.md", c, a) for c, a in _GUIDE.findall((ROOT / "docs/v2.md").read_text())]
    return readme + guide + v2


def _call(client: TestClient, command: str) -> tuple[int, bytes]:
    words = shlex.split(command)
    url = next(w for w in words if w.startswith("localhost:8000")).removeprefix("localhost:8000")
    # the headers curl sends: each -H, and for -d its default Content-Type unless one is given
    given = [words[i + 1] for i, word in enumerate(words) if word == "-H"]
    headers = dict(line.split(": ", 1) for line in given)
    if "-d" not in words:
        answer = client.get(url, headers=headers)
    else:
        if not any(name.lower() == "content-type" for name in headers):
            headers["content-type"] = "application/x-www-form-urlencoded"
        answer = client.post(url, content=words[words.index("-d") + 1], headers=headers)
    return answer.status_code, answer.content


def test_the_docs_have_examples() -> None:
    sources = [source for source, _, _ in _examples()]
    assert sources.count("README") >= 4 and sources.count("api.md") >= 12
    assert sources.count("v2.md") >= 6


@pytest.mark.parametrize(("source", "command", "shown"), _examples())
def test_example_answers_as_documented(source: str, command: str, shown: str) -> None:
    with TestClient(create_app()) as client:
        status, body = _call(client, command)
    if "%{http_code}" in command:  # the doc shows the status after the body
        shown, _, code = shown.rpartition(" ")
        assert status == int(code)
    assert orjson.loads(body) == orjson.loads(shown)


def test_readme_lists_every_setting() -> None:
    from service.settings import Settings

    text = (ROOT / "README.md").read_text()
    for name in Settings.model_fields:
        assert f"`OPSERVE_{name.upper()}`" in text, f"README's settings table lacks {name}"


# docs/v2.md: a ```python block, then a ```text block with what it prints.
_PYTHON = re.compile(r"```python\n(.*?)```\n```text\n(.*?)```", re.S)
PYTHON_EXAMPLES = _PYTHON.findall((ROOT / "docs/v2.md").read_text())


def test_the_v2_guide_has_a_python_example() -> None:
    assert any("tritonclient" in code for code, _ in PYTHON_EXAMPLES)


def server_line(code: str) -> tuple[list[str], dict[str, str]]:
    """The flags and OPSERVE_ settings of an example's first line, `# server: VAR=value ...
    opserve --flag value` (how its server is started; none: the defaults)."""
    first = code.splitlines()[0]
    if not first.startswith("# server:"):
        return [], {}
    words = shlex.split(first.removeprefix("# server:"))
    settings = {w.split("=", 1)[0].removeprefix("OPSERVE_").lower(): w.split("=", 1)[1]
                for w in words[: words.index("opserve")]}  # fmt: skip
    return words[words.index("opserve") + 1 :], settings


@pytest.fixture(scope="module")
def example_servers() -> Iterator[Callable[[str], Served]]:
    """The server for an example: one per distinct first line, shared by the examples that
    give it, as a reader running the guide's examples in turn would share it (none of them
    depends on what another did: each prints only what it asked for), with a gRPC port of its
    own for the gRPC section's examples."""
    started: dict[str, Served] = {}
    with ExitStack() as stack:

        def server_for(code: str) -> Served:
            flags, settings = server_line(code)
            key = repr((flags, sorted(settings.items())))
            if key not in started:
                started[key] = stack.enter_context(serve_grpc(*flags, **settings))
            return started[key]

        yield server_for


@pytest.mark.parametrize(("code", "shown"), PYTHON_EXAMPLES)
def test_python_example_prints_as_documented(
    code: str, shown: str, example_servers: Callable[[str], Served],
) -> None:  # fmt: skip
    server = example_servers(code)
    code = code.replace("localhost:8000", f"127.0.0.1:{server.http.port}")
    code = code.replace("localhost:8001", f"127.0.0.1:{server.grpc_port}")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, cwd=ROOT)  # fmt: skip
    # what it printed and its stderr's end in full: a failure in CI shows only this message
    said = f"printed:\n{done.stdout}\nstderr (end):\n{done.stderr[-3000:]}"
    assert done.returncode == 0, said
    assert done.stdout == shown, said
