"""The `opserve` command line: flags for the settings set most often, and a --help that lists
every setting with its variable and default, read from `Settings` (its fields and docstrings)."""

import argparse
import os
import re
import textwrap
from collections.abc import Sequence
from typing import Any

from pydantic import SecretStr, ValidationError

from service import __version__
from service.settings import MiB, Settings

FLAGS = ("host", "port", "grpc_port", "workers", "model_repository", "log_level")
"""The settings that have a flag (`--model-repository` for `model_repository`)."""
WIDTH = 100


def variable(name: str) -> str:
    """The environment variable of setting `name`."""
    return f"OPSERVE_{name.upper()}"


def parser() -> argparse.ArgumentParser:
    """The argument parser: --version, a flag per name in FLAGS, every setting in the epilog."""
    fields = Settings.model_fields
    parse = argparse.ArgumentParser(
        prog="opserve",
        description=textwrap.fill(
            "Serve ONNX operators and models over HTTP (REST v1 and KServe V2) and gRPC (KServe "
            "V2, Triton's GRPCInferenceService). Every setting is an OPSERVE_* environment "
            "variable; a flag given sets its variable, and wins over it.",
            WIDTH,
        ),
        epilog=settings_help(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parse.add_argument("--version", action="version", version=f"opserve {__version__}")
    for name in FLAGS:
        first_sentence = _one_line(fields[name].description).split(". ")[0].rstrip(".")
        parse.add_argument(f"--{name.replace('_', '-')}", dest=name, metavar=name.upper(),
                           help=f"{first_sentence} ({variable(name)})")  # fmt: skip
    return parse


def settings_help() -> str:
    """Every setting: its variable, its default and its docstring, wrapped."""
    lines = ["settings (environment variables; each flag above sets its own):"]
    for name, field in Settings.model_fields.items():
        lines.append(f"  {variable(name)}  (default: {_shown(name, field.default)})")
        lines += textwrap.wrap(_one_line(field.description), WIDTH, initial_indent=" " * 6,
                               subsequent_indent=" " * 6)  # fmt: skip
    return "\n".join(lines)


def parse_settings(argv: Sequence[str] | None = None) -> Settings:
    """Parse the command line, put each flag given into its variable, and read the settings.

    The variables, not a Settings object, carry the flags to the server: uvicorn's workers read
    their settings from the environment. Invalid values exit 2 with argparse's message."""
    parse = parser()
    given = {
        name: value for name, value in vars(parse.parse_args(argv)).items() if value is not None
    }
    os.environ.update({variable(name): value for name, value in given.items()})
    try:
        return Settings()
    except ValidationError as error:
        problems = [f"{_source(str(e['loc'][0]), given)}: {e['msg']}" for e in error.errors()]
        parse.error("; ".join(problems))


def _source(name: str, given: dict[str, str]) -> str:
    if name in given:
        return f"--{name.replace('_', '-')} {given[name]}"
    return f"{variable(name)}={os.environ.get(variable(name), '')}"


def _shown(name: str, default: Any) -> str:
    """A default as one would write it in the variable (sizes in bytes also in MiB)."""
    if isinstance(default, SecretStr):
        default = default.get_secret_value()
    if isinstance(default, bool):
        return str(default).lower()
    if (
        name.endswith("_bytes")
        and isinstance(default, int)
        and default >= MiB
        and not default % MiB
    ):
        return f"{default} ({default // MiB} MiB)"
    return "none" if default is None else "empty" if default == "" else str(default)


def _one_line(text: str | None) -> str:
    return re.sub(r"\s+", " ", text or "").strip()
