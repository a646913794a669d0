"""The README's Quickstart: exactly two commands, each making and entering the same virtual
environment first (a system Python on Debian refuses `pip install` outside one, PEP 668), one
that starts the service and one that runs the whole suite, and the latter is what CI runs."""

import re
from pathlib import Path

ROOT = Path(__file__).parents[1]
README = (ROOT / "README.md").read_text()
VENV = "python3 -m venv .venv && . .venv/bin/activate && "


def _quickstart_commands() -> list[str]:
    section = README.split("## Quickstart\n", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```bash\n(.*?)\n```", section, re.S)


def test_two_commands_each_in_the_same_virtual_environment() -> None:
    commands = _quickstart_commands()
    assert len(commands) == 2, commands
    for command in commands:
        assert "\n" not in command and command.startswith(VENV), command
    serve, test = (command.removeprefix(VENV) for command in commands)
    assert serve == "pip install . && opserve"
    assert test == 'pip install ".[test]" && python -m pytest'


def test_ci_runs_the_readmes_test_command() -> None:
    ci = (ROOT / ".ci" / "run").read_text()
    _, test = _quickstart_commands()
    lines = [line for line in ci.splitlines() if line and not line.startswith("#")]
    assert lines[-1] == test  # the last thing CI does, so its status is CI's
    assert "export OPSERVE_TEST_CONTAINERS=1" in lines  # and the container test runs there
