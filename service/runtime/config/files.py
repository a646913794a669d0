"""The files a model configuration names, read as untrusted input: `config.pbtxt` beside a
model, the model file (`default_model_filename`), outputs' label files (`label_filename`) and
warmup data files (`input_data_file`, config/warmup.py).

Only regular files are opened (never a FIFO, device or socket, which could block or have side
effects), with a size bound before reading; names from a config stay inside the model directory.
"""

import errno
import os
import stat
from pathlib import Path, PurePosixPath
from typing import Any

from google.protobuf import text_format

from service.errors import InvalidInput
from service.runtime.config.messages import ModelConfig, shown

CONFIG_FILE = "config.pbtxt"
DEFAULT_MODEL_FILE = "model.onnx"
MAX_CONFIG_BYTES = 1 << 20
_OPEN_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_KINDS = {stat.S_IFIFO: "a FIFO", stat.S_IFCHR: "a character device", stat.S_IFBLK: "a block "
          "device", stat.S_IFSOCK: "a socket", stat.S_IFDIR: "a directory"}  # fmt: skip


def read_config(model_dir: Path, max_bytes: int = MAX_CONFIG_BYTES) -> Any | None:
    """The ModelConfig in `<model_dir>/config.pbtxt`, or None when there is none."""
    data = read_regular(model_dir / CONFIG_FILE, CONFIG_FILE, max_bytes)
    if data is None:
        return None
    config = ModelConfig()
    try:
        text_format.Parse(data.decode("utf-8"), config)
    except UnicodeDecodeError as exc:
        raise InvalidInput(f"{CONFIG_FILE} is not UTF-8 text (byte {exc.start})") from None
    except (text_format.ParseError, ValueError, RecursionError) as exc:
        detail = str(exc) if len(str(exc)) <= 300 else str(exc)[:300] + "..."
        raise InvalidInput(f"{CONFIG_FILE} is not a text-format ModelConfig: {detail}") from None
    return config


def read_regular(path: Path, what: str, max_bytes: int, setting: str = "",
                 whole: bool = True) -> bytes | None:  # fmt: skip
    """The bytes of a regular file of at most `max_bytes` (not `whole`: its first `max_bytes`,
    however long it is); None when absent. A link, FIFO, device or directory is refused,
    before opening (lstat) and after (fstat: no race)."""
    try:
        _regular(os.lstat(path).st_mode, what)
        fd = os.open(path, _OPEN_FLAGS)
    except FileNotFoundError:
        return None
    except OSError as exc:
        if exc.errno == errno.ELOOP:  # O_NOFOLLOW met a link swapped in after lstat
            raise InvalidInput(f"{what} is a symbolic link; only a regular file is read") from None
        raise InvalidInput(f"{what} cannot be read: {exc.strerror or exc}") from None
    with open(fd, "rb", closefd=True) as file:
        info = os.fstat(fd)
        _regular(info.st_mode, what)
        if whole and info.st_size > max_bytes:
            named = f" ({setting})" if setting else ""
            raise InvalidInput(f"{what} has {info.st_size} bytes, over the limit of "
                               f"{max_bytes}{named}")  # fmt: skip
        data = file.read(max_bytes + 1 if whole else max_bytes)
    if len(data) > max_bytes:  # it grew after fstat
        raise InvalidInput(f"{what} is over the limit of {max_bytes} bytes")
    return data


def _regular(mode: int, what: str) -> None:
    if stat.S_ISLNK(mode):
        raise InvalidInput(f"{what} is a symbolic link; only a regular file is read")
    if not stat.S_ISREG(mode):
        kind = _KINDS.get(stat.S_IFMT(mode), "not a regular file")
        raise InvalidInput(f"{what} is {kind}; only a regular file is read")


def relative_name(name: str) -> bool:
    """Whether a name from a config is a plain relative path: not empty or absolute, no NUL,
    no '..' part (checked before anything touches the file system)."""
    path = PurePosixPath(name)
    return bool(name) and "\0" not in name and not path.is_absolute() and ".." not in path.parts


def inside(directory: Path, name: str) -> Path | None:
    """`directory/name` with every link resolved, or None when that leaves `directory`."""
    if not relative_name(name):
        return None
    try:
        root = directory.resolve()
        real = (root / name).resolve()
    except (OSError, RuntimeError):  # a link loop (RuntimeError before Python 3.13)
        return None
    return real if real.is_relative_to(root) and real != root else None


def model_file(config: Any) -> str:
    """The model's file name inside a version directory (`default_model_filename`)."""
    name = config.default_model_filename or DEFAULT_MODEL_FILE
    if not relative_name(name):
        raise InvalidInput(f"default_model_filename '{shown(name)}' for model "
                           f"'{shown(config.name)}' must be a relative path inside the version "
                           "directory (not absolute, no '..' part, no NUL)")  # fmt: skip
    return name


def check_label_files(config: Any, model_dir: Path) -> None:
    """Refuse a label file that resolves outside the model directory (Triton's text; the path
    is the config's, not joined to ours, so the server's layout is not disclosed)."""
    for output in config.output:
        name = output.label_filename
        if name and inside(model_dir, name) is None:
            raise InvalidInput(f"label file path '{shown(name)}' for output "
                               f"'{shown(output.name)}' in model '{shown(config.name)}' is "
                               "outside model directory")  # fmt: skip


def read_labels(model_dir: Path, filename: str, max_bytes: int) -> list[str]:
    """The lines of a label file inside `model_dir`: one label per line, as Triton splits them
    (no empty last label after a final newline)."""
    path = inside(model_dir, filename)
    if path is None:
        raise InvalidInput(f"label file path '{shown(filename)}' is outside model directory")
    data = read_regular(path, f"label file '{shown(filename)}'", max_bytes)
    if data is None:
        raise InvalidInput(f"label file '{shown(filename)}' is not in the model directory")
    # Undecodable bytes become U+FFFD rather than failing the model: labels are only shown.
    lines = data.decode("utf-8", errors="replace").split("\n")
    if lines[-1] == "":
        lines.pop()
    # Triton keeps a trailing "\r" (its getline splits on "\n" only); a label file saved on
    # Windows would then answer "VULTURE\r", so it is stripped here.
    return [line.removesuffix("\r") for line in lines]


def output_labels(model_dir: Path, config: Any, max_bytes: int) -> dict[str, list[str]]:
    """The labels of every output that names a label file."""
    return {
        output.name: read_labels(model_dir, output.label_filename, max_bytes)
        for output in config.output
        if output.label_filename
    }
