"""The `$ curl ...` examples of a guide, run as written (from the project's folder, only the
guide's host and port pointed at a test server) and checked against what the guide shows."""

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import orjson
import pytest

ROOT = Path(__file__).parents[1]
EXAMPLE = re.compile(r"^\$ (curl -s [^\n]*)\n(.+)$", re.M)
"""A `$ curl -s ...` line and the line it prints (with `-w`, the status after the body)."""


def examples(guide: str) -> list[tuple[str, str]]:
    """(command, what it prints) for each example in the guide's text."""
    return EXAMPLE.findall(guide)


def need_curl() -> None:
    if shutil.which("curl") is None:
        pytest.skip("the guide's examples are curl commands: apt-get install curl")


def assert_prints_as_shown(command: str, shown: str, port: int, guide_address: str) -> None:
    """Run `command` with `guide_address` (localhost:8000) replaced by the server's address."""
    command = command.replace(guide_address, f"127.0.0.1:{port}")
    done = subprocess.run(command, shell=True, cwd=ROOT, capture_output=True, text=True,
                          timeout=60)  # fmt: skip
    assert done.returncode == 0, done.stderr
    printed = done.stdout.rstrip("\n")
    if "%{http_code}" in command:  # the status comes after the body
        printed, _, code = printed.rpartition(" ")
        shown, _, shown_code = shown.rpartition(" ")
        assert code == shown_code
    if printed or shown:
        assert _timeless(orjson.loads(printed)) == _timeless(orjson.loads(shown))


def _timeless(body: Any) -> Any:
    """A trace's node times differ from run to run."""
    for entry in body.get("trace") or [] if isinstance(body, dict) else []:
        entry.pop("microseconds")
    return body
