"""What one load of the model repository extension may ask, checked before any work, once for
both doors (HTTP's POST /v2/repository/models/{name}/load, gRPC's RepositoryModelLoad): the
model's name, the `config` override's size, the `file:` parameters (how many, their paths,
their bytes together), and what the load will hold of the memory budget while it runs.

The doors only turn their wire form into a LoadRequest: gRPC's files are bytes already, HTTP's
base64 texts stay encoded (Base64) until the load decodes them, once their memory is claimed.
The texts refusing a load are the same whichever door it came through.
"""

from collections.abc import Mapping
from dataclasses import dataclass, field

import pybase64

from service.codecs.json_tensor import json_body_memory
from service.errors import BadRequest, PayloadTooLarge, PollFailed
from service.runtime.config.files import MAX_CONFIG_BYTES, relative_name
from service.runtime.config.messages import shown
from service.runtime.plan import LOAD_MEMORY_FACTOR
from service.settings import Settings

NAME_MAX = 255
"""Bytes of one path component the file system takes (Linux's NAME_MAX)."""
FILE_PREFIX = "file:"


class Base64:
    """A file sent as base64 text (HTTP's JSON body): its size is known before it is decoded,
    and it is decoded only by the load, after the memory it takes is claimed."""

    __slots__ = ("key", "text")

    def __init__(self, key: str, text: str) -> None:
        # a cheap look first (padded, ASCII: what validate=True needs); the decoder checks the rest
        if len(text) % 4 or not text.isascii():
            raise not_base64(key)
        self.key, self.text = key, text

    def __len__(self) -> int:
        """Bytes it decodes to, at most."""
        return len(self.text) // 4 * 3

    def decode(self) -> bytes:
        try:
            return pybase64.b64decode(self.text, validate=True)
        except ValueError:
            raise not_base64(self.key) from None


def not_base64(key: str) -> BadRequest:
    return BadRequest(f"load parameter '{shown(key)}' is not base64")


FileData = bytes | Base64


@dataclass(frozen=True)
class Overrides:
    """A load request's own configuration (JSON) and files (`<version>/<file>` -> bytes, or
    base64 text decoded when the load reads it)."""

    config: str | None = None
    files: Mapping[str, FileData] = field(default_factory=dict)

    def file_bytes(self, path: str) -> bytes:
        """The bytes of the file at `path`, decoded if they were sent as base64."""
        data = self.files[path]
        return data.decode() if isinstance(data, Base64) else data


@dataclass(frozen=True)
class LoadRequest:
    """One load's model name and overrides, checked; `memory` is what it may hold while it
    runs (its decoded files and config, and what loading them takes)."""

    name: str
    overrides: Overrides
    memory: int


def load_request(name: str, config: str | None, files: Mapping[str, FileData],
                 settings: Settings) -> LoadRequest:  # fmt: skip
    """Check a load before anything is decoded or read: its name, its config's size, its
    files' count, paths and total bytes (keys without the `file:` prefix)."""
    check_model_name(name)
    if files and config is None:
        raise BadRequest("load parameters with files need a 'config' too")
    if config is not None and (len(config) > MAX_CONFIG_BYTES or
                               len(config.encode("utf-8", "replace")) > MAX_CONFIG_BYTES):  # fmt: skip
        raise PayloadTooLarge(f"load parameter 'config' is over {MAX_CONFIG_BYTES} bytes, the "
                              "limit of a model configuration")  # fmt: skip
    if len(files) > settings.max_load_files:
        raise BadRequest(f"the load of '{shown(name)}' has {len(files)} file parameters, over "
                         f"the limit of {settings.max_load_files} (OPSERVE_MAX_LOAD_FILES)")  # fmt: skip
    for path in files:
        check_file_path(name, path)
    total = sum(len(data) for data in files.values())
    if total > settings.max_model_bytes:
        raise PayloadTooLarge(f"the files of the load of '{shown(name)}' hold {total} bytes, "
                              f"over the limit of {settings.max_model_bytes} "
                              "(OPSERVE_MAX_MODEL_BYTES)")  # fmt: skip
    parsed = json_body_memory(config.encode("utf-8", "replace")) if config else 0
    return LoadRequest(name, Overrides(config, dict(files)),
                       (1 + LOAD_MEMORY_FACTOR) * total + parsed)  # fmt: skip


def check_model_name(name: str) -> None:
    """Refuse a name no model folder could have (Triton's texts where it has them): empty,
    a path, a NUL or a byte that is not UTF-8, or over NAME_MAX bytes."""
    if not name.strip():
        raise BadRequest("Model name cannot be empty. Please enter a valid name to deploy.")
    if name.strip() == ".." or "/" in name:
        raise BadRequest(f"invalid model name '{shown(name)}', model name must not contain "
                         "path traversal characters")  # fmt: skip
    if "\0" in name:
        raise BadRequest(f"invalid model name {shown(name)!r}: a NUL byte is in no file name")
    length = _utf8_length(name)
    if length is None:
        raise BadRequest(f"invalid model name {shown(name)!r}: it is not UTF-8 text")
    if length > NAME_MAX:
        raise BadRequest(f"invalid model name '{shown(name)}': over {NAME_MAX} bytes, the "
                         "longest file name")  # fmt: skip


def check_file_path(name: str, path: str) -> None:
    """Refuse a `file:` path before anything is written or read: one with a component over
    NAME_MAX bytes as Triton does (its file system refuses it while it polls the model, so
    it answers INTERNAL "failed to poll", which its example client checks), and one that is
    not a plain relative path (400)."""
    parts = path.split("/")
    if any((_utf8_length(part) or 0) > NAME_MAX for part in parts):
        raise PollFailed(f"failed to load '{shown(name)}', failed to poll from model "
                         f"repository: file parameter '{FILE_PREFIX}{shown(path)}' has a path "
                         f"component over {NAME_MAX} bytes")  # fmt: skip
    if _utf8_length(path) is None or not relative_name(path) or "" in parts or "." in parts:
        raise BadRequest(f"load file '{shown(path)}' must be a relative path inside the model "
                         "folder: not empty or absolute, no '.' or '..' part, no NUL byte")  # fmt: skip


def _utf8_length(text: str) -> int | None:
    """Bytes of `text` as UTF-8; None for a text that has none (a lone surrogate)."""
    try:
        return len(text.encode("utf-8"))
    except UnicodeEncodeError:
        return None
