"""One model of the repository, read from its folder: its configuration (config.pbtxt, or a
load request's override), the version folders its version policy picks, and each version's
model file loaded, its configuration completed and checked against the graph.

Everything here is untrusted input and nothing here raises for it: a model or a version that
cannot be read or loaded comes back with its reason, in one line. Names come only from the
folder listing (or, for overrides, from the load request's own files); only regular files are
opened, without blocking (config_files.py); a link that leaves the repository is refused
without saying where it leads. Runs on the repository's loader thread.
"""

import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from service.errors import InvalidInput, ServiceError
from service.runtime.config_files import (
    inside,
    model_file,
    output_labels,
    read_config,
    read_regular,
)
from service.runtime.config_io import RequestIO, request_io
from service.runtime.config_json import config_from_json
from service.runtime.engines import load_repository_model, record
from service.runtime.graph import LoadedModel
from service.runtime.model_config import complete_config
from service.runtime.sequence_plan import SequencePlan, sequence_plan
from service.settings import Settings

log = logging.getLogger("opserve")
MAX_FOLDER_ENTRIES = 10_000  # entries read from one folder: more is refused, not listed
MAX_LABEL_BYTES = 1 << 20


@dataclass
class RepositoryEntry:
    """One version of a repository model: loaded and ready, or not with its reason."""

    name: str
    version: int
    model: LoadedModel | None
    error: str | None  # why it is not ready
    config: Any = None  # the completed ModelConfig
    io: RequestIO | None = None
    labels: Mapping[str, list[str]] = field(default_factory=dict)
    plan: SequencePlan | None = None
    state: str = "READY"  # READY, UNLOADING (drained by its requests), UNAVAILABLE
    active: int = 0  # requests running on it

    @property
    def ready(self) -> bool:
        return self.model is not None and self.state == "READY"


@dataclass
class ModelVersions:
    """What one load of a model found: its versions, or why none could be looked at."""

    name: str
    versions: dict[int, RepositoryEntry]
    error: str | None = None  # the model as a whole could not be read


@dataclass(frozen=True)
class Overrides:
    """A load request's own configuration (JSON) and files (`<version>/<file>` -> bytes)."""

    config: str | None = None
    files: Mapping[str, bytes] = field(default_factory=dict)


def load_folder(root: Path, name: str, settings: Settings,
                overrides: Overrides | None = None) -> ModelVersions:  # fmt: skip
    """The model of `root/name` (a name from the folder listing), every version its policy
    picks loaded or refused with its reason."""
    try:
        folder = inside(root, name)
        if folder is None or not folder.is_dir():
            raise InvalidInput(f"{name}: the model folder is a link that leaves the repository, "
                               "a link loop or not a folder; refused")  # fmt: skip
        config = _config(folder, overrides)
        found = _version_files(folder, config, overrides)
    except ServiceError as exc:
        return ModelVersions(name, {}, str(exc))
    except OSError as exc:
        return ModelVersions(name, {}, f"{name}: the model folder cannot be read: "
                                       f"{exc.strerror or exc}")  # fmt: skip
    versions = {number: _entry(name, number, source, folder, config, settings)
                for number, source in sorted(found.items())}  # fmt: skip
    return ModelVersions(name, versions)


def load_bare(root: Path, file_name: str, settings: Settings) -> ModelVersions:
    """A bare `<name>.onnx` at the top of the repository: version 1 of model `name`, its
    configuration completed from the graph."""
    name = file_name.removesuffix(".onnx")
    path = inside(root, file_name)
    source: Path | bytes | str = path if path is not None else (
        f"{file_name} is a link that leaves the repository or a link loop; refused")  # fmt: skip
    return ModelVersions(name, {1: _entry(name, 1, source, root, None, settings)})


def _config(folder: Path, overrides: Overrides | None) -> Any:
    if overrides is not None and overrides.config is not None:
        return config_from_json(overrides.config)
    return read_config(folder)


def _version_files(folder: Path, config: Any,
                   overrides: Overrides | None) -> dict[int, Path | bytes | str]:  # fmt: skip
    """Each version the policy picks, with its model file (a path, the override's bytes, or
    why there is none)."""
    file_name = model_file(config) if config is not None else "model.onnx"
    if overrides is not None and overrides.files:
        available: dict[int, Path | bytes | str] = {}
        for path, data in overrides.files.items():
            folder_name, _, inner = path.partition("/")
            given = _version_number(folder_name)
            if given is None or inner != file_name:
                raise InvalidInput(f"load file '{path[:100]}' is not '<version>/{file_name}'")
            available[given] = data
    else:
        available = {}
        for entry in _listing(folder):
            number = _version_number(entry.name)
            if number is not None and entry.is_dir():
                model = inside(folder, f"{entry.name}/{file_name}")
                available[number] = model if model is not None else (
                    f"its {file_name} is a link that leaves the model folder, or a link loop; "
                    "refused")  # fmt: skip
    return {n: available.get(n, f"version folder {n} is not in the repository")
            for n in _policy(config, sorted(available))}  # fmt: skip


def _listing(folder: Path) -> list[os.DirEntry[str]]:
    with os.scandir(folder) as listing:
        entries = []
        for entry in listing:
            entries.append(entry)
            if len(entries) > MAX_FOLDER_ENTRIES:
                raise InvalidInput(f"the folder holds over {MAX_FOLDER_ENTRIES} entries")
    return entries


def _version_number(name: str) -> int | None:
    if name.isascii() and name.isdigit() and len(name) <= 9 and int(name) > 0:
        return int(name)
    return None


def _policy(config: Any, available: list[int]) -> list[int]:
    """The versions the configuration's version_policy picks (Triton's default: the newest)."""
    policy = config.version_policy if config is not None else None
    choice = policy.WhichOneof("policy_choice") if policy is not None else None
    if choice == "all":
        return available
    if choice == "specific":
        return sorted(set(policy.specific.versions))  # type: ignore[union-attr]
    count = policy.latest.num_versions if choice == "latest" else 1  # type: ignore[union-attr]
    return available[-max(count, 1) :]


def _entry(name: str, number: int, source: Path | bytes | str, folder: Path, config: Any,
           settings: Settings) -> RepositoryEntry:  # fmt: skip
    """One version loaded, or refused with its reason; never raises."""
    try:
        if isinstance(source, str):
            raise InvalidInput(source)
        return _loaded(name, number, source, folder, config, settings)
    except ServiceError as exc:
        error = str(exc)
    except OSError as exc:
        error = f"cannot be read: {exc.strerror or exc}"
    except Exception as exc:  # one broken model must not stop the others
        log.exception("model %s version %d failed to load", name, number)
        error = f"failed to load: {type(exc).__name__}"
    log.error("model %s version %d is not ready: %s", name, number, error)
    return RepositoryEntry(name, number, None, error, state="UNAVAILABLE")


def _loaded(name: str, number: int, source: Path | bytes, folder: Path, config: Any,
            settings: Settings) -> RepositoryEntry:  # fmt: skip
    data = source
    if isinstance(source, Path):
        what = f"version {number}'s {source.name}"
        data = read_regular(source, what, settings.max_model_bytes,  # type: ignore[assignment]
                            "OPSERVE_MAX_MODEL_BYTES")  # fmt: skip
        if data is None:
            raise InvalidInput(f"version {number} has no model file {source.name}")
    assert isinstance(data, bytes)
    model = load_repository_model(data, config, settings)  # the engine its config names
    done = complete_config(config, name, model.inputs, model.outputs, folder,
                           initialized=model.initializers.keys(),
                           default_max_batch_size=settings.default_max_batch_size)  # fmt: skip
    record(done, model)
    plan = None
    if done.HasField("sequence_batching"):
        instances = sum(group.count for group in done.instance_group)
        plan = sequence_plan(done.sequence_batching, name, done.max_batch_size, instances)
    labels = output_labels(folder, done, MAX_LABEL_BYTES)
    io = request_io(done, model.inputs, model.outputs)
    return RepositoryEntry(name, number, model, None, done, io, labels, plan)
