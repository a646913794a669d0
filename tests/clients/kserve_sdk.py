"""The KServe Python SDK (kserve 0.21) as the tests' client, in a virtual environment of its
own: its generated protobuf modules define the same message names as tritonclient's (one
process cannot import both), and it pulls in dependencies the service does not want. The
environment is made once per machine, in OPSERVE_TEST_CACHE (~/.cache/opserve-tests), from
PyPI; a script runs in it and prints JSON lines for the test to check."""

import json
import os
import subprocess
import venv
from pathlib import Path
from typing import Any

import pytest

VERSION = "0.21.0"
CACHE = Path(os.environ.get("OPSERVE_TEST_CACHE", Path.home() / ".cache" / "opserve-tests"))


def python() -> Path:
    """The kserve environment's interpreter, made on first use (skips when PyPI cannot be
    reached: the reason is printed)."""
    folder = CACHE / f"kserve-{VERSION}"
    interpreter = folder / "bin" / "python"
    if not (folder / "ready").exists():
        venv.create(folder, with_pip=True, clear=True)
        done = subprocess.run([str(interpreter), "-m", "pip", "install", "-q",
                               f"kserve=={VERSION}"], capture_output=True, text=True,
                              timeout=900, check=False)  # fmt: skip
        if done.returncode != 0:
            pytest.skip(f"kserve {VERSION} could not be installed: {done.stderr[-500:]}")
        (folder / "ready").write_text(VERSION)
    return interpreter


def run(script: str, *args: str) -> list[Any]:
    """Run `script` (Python source) in the kserve environment; its JSON lines, parsed."""
    done = subprocess.run([str(python()), "-c", script, *args], capture_output=True, text=True,
                          timeout=120, check=False, env={**os.environ, "PYTHONPATH": ""})  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return [json.loads(line) for line in done.stdout.splitlines() if line.startswith(("{", "["))]
