"""The command line: --help lists every setting, each flag sets its setting and wins over the
variable, the variables still work for the rest, and mistakes exit 2 with argparse's message."""

import os
import socket
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from service import __version__
from service.cli import FLAGS, parse_settings, variable
from service.settings import Settings
from tests.api.live_server import free_port, serve

ROOT = Path(__file__).parents[1]


def _run(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "service", *argv], capture_output=True,
                          text=True, timeout=60, cwd=ROOT)  # fmt: skip


@pytest.fixture(autouse=True)
def _clean_environment() -> Iterator[None]:
    """parse_settings writes the flags into os.environ: the environment is put back whole
    afterwards. (monkeypatch.delenv of a variable that is not set records nothing to undo, so
    a flag's variable outlived its test: the next live servers of the process were started
    with OPSERVE_MODEL_REPOSITORY or OPSERVE_PORT set.)"""
    saved = dict(os.environ)
    for name in Settings.model_fields:
        os.environ.pop(variable(name), None)
    os.environ["OPSERVE_GRPC_PORT"] = "0"  # the servers these tests start: no port 8001
    yield
    os.environ.clear()
    os.environ.update(saved)


def test_help_lists_every_setting_with_its_variable_and_default() -> None:
    done = _run("--help")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    for name, field in Settings.model_fields.items():
        # a setting's own line is indented by two; its description, wrapped, by more
        (line,) = [line for line in lines if line.startswith(f"  {variable(name)} ")]
        assert "(default: " in line
        first_words = " ".join((field.description or "").split()[:4])
        assert first_words in " ".join(done.stdout.split()), name
    for name in FLAGS:
        assert f"--{name.replace('_', '-')}" in done.stdout
    assert "(default: 8000)" in done.stdout and "(default: none)" in done.stdout
    # sizes in bytes are shown in MiB too; counts of other things are not
    assert "OPSERVE_MAX_REQUEST_BYTES  (default: 67108864 (64 MiB))" in done.stdout
    assert "OPSERVE_MAX_ELEMENTS  (default: 67108864)\n" in done.stdout


def test_version_prints_the_package_version() -> None:
    done = _run("--version")
    assert (done.returncode, done.stdout.strip()) == (0, f"opserve {__version__}")


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--bogus"], "opserve: error: unrecognized arguments: --bogus"),
        (["--port", "70000"], "opserve: error: --port 70000: Input should be less than or equal"),
        (["--workers", "many"], "opserve: error: --workers many: Input should be a valid integer"),
        (["--port"], "opserve: error: argument --port: expected one argument"),
    ],
)
def test_a_bad_flag_exits_2_with_argparses_message(argv: list[str], message: str) -> None:
    done = _run(*argv)
    assert done.returncode == 2
    assert message in done.stderr and done.stderr.startswith("usage: opserve")


@pytest.mark.parametrize(
    ("argv", "name", "expected"),
    [
        (["--host", "127.0.0.2"], "host", "127.0.0.2"),
        (["--port", "9001"], "port", 9001),
        (["--grpc-port", "9002"], "grpc_port", 9002),
        (["--workers", "3"], "workers", 3),
        (["--model-repository", "examples/model_repository"], "model_repository",
         Path("examples/model_repository")),
        (["--log-level", "debug"], "log_level", "debug"),
    ],
)  # fmt: skip
def test_each_flag_sets_its_setting(argv: list[str], name: str, expected: object) -> None:
    assert getattr(Settings(), name) != expected
    assert getattr(parse_settings(argv), name) == expected
    assert getattr(Settings(), name) == expected  # through the variable, as the workers read it


def test_every_flag_is_tested() -> None:
    assert len(FLAGS) == 6 and set(FLAGS) <= set(Settings.model_fields)


def test_a_flag_wins_over_its_variable_and_the_others_still_count(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OPSERVE_PORT", "1234")
    monkeypatch.setenv("OPSERVE_MAX_ELEMENTS", "77")
    settings = parse_settings(["--port", "4321"])
    assert (settings.port, settings.max_elements) == (4321, 77)
    assert parse_settings([]).port == 4321  # the variable now holds the flag's value


def test_the_server_listens_on_the_port_flag_not_the_variable() -> None:
    port, other = free_port(), free_port()
    with serve("--port", str(port), port=str(other)) as server:  # OPSERVE_PORT=other
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/health/live") as answer:
            assert answer.status == 200
        assert server.port == port
        with socket.socket() as probe:
            assert probe.connect_ex(("127.0.0.1", other)) != 0  # nothing listens there
