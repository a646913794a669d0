"""The KServe Python SDK (kserve 0.21) as the tests' client, in a virtual environment of its
own: its generated protobuf modules define the same message names as tritonclient's (one
process cannot import both), and it pulls in dependencies the service does not want. The
environment is made once per machine and Python, in OPSERVE_TEST_CACHE (~/.cache/opserve-tests),
from PyPI; a script runs in it and prints JSON lines for the test to check.

This module is the environment's only maker (tests/clients and tests/grpc/test_docs.py): two
makers with different completion marks in one folder wiped each other's environment, so every
full run installed kserve twice (~100 s each) and could delete it under the other's test."""

import json
import os
import subprocess
import sys
import venv
from pathlib import Path
from typing import Any

import pytest

from tests.cache_folder import CACHE, locked

VERSION = "0.21.0"
# the environment is tied to the Python it was made with
FOLDER = CACHE / f"kserve-{VERSION}-py{sys.version_info.major}{sys.version_info.minor}"


def python() -> Path:
    """The kserve environment's interpreter, made on first use; a lock keeps parallel test
    processes from making it twice (skips when PyPI cannot be reached: the reason is printed)."""
    interpreter = FOLDER / "bin" / "python"
    with locked(f"kserve-{VERSION}"):
        if not (FOLDER / "ready").exists():
            venv.create(FOLDER, with_pip=True, clear=True)
            done = subprocess.run([str(interpreter), "-m", "pip", "install", "-q",
                                   "--disable-pip-version-check", f"kserve=={VERSION}"],
                                  capture_output=True, text=True, timeout=900, check=False)  # fmt: skip
            if done.returncode != 0:
                pytest.skip(f"kserve {VERSION} could not be installed: {done.stderr[-500:]}")
            (FOLDER / "ready").write_text(VERSION)
    return interpreter


def run(script: str, *args: str) -> list[Any]:
    """Run `script` (Python source) in the kserve environment; its JSON lines, parsed."""
    done = subprocess.run([str(python()), "-c", script, *args], capture_output=True, text=True,
                          timeout=120, check=False, env={**os.environ, "PYTHONPATH": ""})  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return [json.loads(line) for line in done.stdout.splitlines() if line.startswith(("{", "["))]
