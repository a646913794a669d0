"""Lint and type checks run with the test suite, so one command checks everything."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]
CHECKS = {
    "ruff check": [sys.executable, "-m", "ruff", "check", "."],
    "ruff format": [sys.executable, "-m", "ruff", "format", "--check", "."],
    "mypy": [sys.executable, "-m", "mypy"],
}


@pytest.mark.parametrize("name", sorted(CHECKS))
def test_static_check(name: str) -> None:
    if shutil.which("ruff") is None and name.startswith("ruff"):
        pytest.skip("ruff is not installed (pip install '.[test]')")
    done = subprocess.run(CHECKS[name], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"{name} failed:\n{done.stdout}\n{done.stderr}"
