"""One model of the repository, read from its folder: its configuration (config.pbtxt, or a
load request's override), the version folders its version policy picks, and each version's
model file loaded, its configuration completed and checked against the graph.

Everything here is untrusted input and nothing here raises for it: a model or a version that
cannot be read or loaded comes back with its reason, in one line. Names come only from the
folder listing (or, for overrides, from the load request's own files, checked by
load_request.py); only regular files are opened, without blocking (config/files.py); a link
that leaves the repository is refused without saying where it leads. A version whose config
has `model_warmup` samples is ready only once they ran (config/warmup.py). A model a load request
sends whole (its config and files) needs no folder, and no file of the server is read for it.
An ensemble (platform "ensemble") has version folders and no model file: each version holds
its plan (runtime/ensembles.py), linked to its step models by the repository afterwards.
Runs on the repository's loader thread.
"""

import logging
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from service.engines.choice import from_a_load_request, load_repository_model, record
from service.errors import InvalidInput, ServiceError
from service.kernels.collector import refreeze
from service.runtime.cache_tag import cache_tag
from service.runtime.config.complete import complete_config
from service.runtime.config.ensemble import complete_ensemble, is_ensemble
from service.runtime.config.files import (
    inside,
    model_file,
    output_labels,
    read_config,
    read_regular,
)
from service.runtime.config.json_form import config_from_json
from service.runtime.config.request_io import RequestIO, request_io
from service.runtime.config.warmup import UNBUDGETED, WarmupRuns, warm_up
from service.runtime.ensembles import Ensemble
from service.runtime.graph import LoadedModel
from service.runtime.load_request import Overrides
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
    model: LoadedModel | Ensemble | None
    error: str | None  # why it is not ready
    config: Any = None  # the completed ModelConfig
    io: RequestIO | None = None
    labels: Mapping[str, list[str]] = field(default_factory=dict)
    plan: SequencePlan | None = None
    state: str = "READY"  # READY, UNLOADING (drained by its requests), UNAVAILABLE
    active: int = 0  # requests running on it
    # its dynamic batcher (core/batcher.py), made by the data plane at its first request;
    # False: its configuration asks for none
    batcher: Any = None
    load_seconds: float = 0.0  # how long its load took, warm-up included (Triton's metric)
    # the digest the response cache keys its answers by; None: never cached (runtime/cache_tag.py)
    cache_tag: bytes | None = None

    @property
    def ready(self) -> bool:
        return self.model is not None and self.state == "READY"

    def retire(self, reason: str | None) -> None:
        """Take the version out of service: UNLOADING while requests still run on it (the
        last one frees it: `drained`), else UNAVAILABLE and freed at once; `reason` replaces
        its error (None: kept)."""
        if reason is not None:
            self.error = reason
        if self.state == "READY":
            self.state = "UNLOADING" if self.active else "UNAVAILABLE"
        if not self.active:
            self.free()

    def drained(self) -> None:
        """Its last request ended: an UNLOADING version becomes UNAVAILABLE and is freed."""
        if self.state == "UNLOADING" and not self.active:
            self.state = "UNAVAILABLE"
            self.free()

    def free(self) -> None:
        """Let go of what only serving needs (the graph and its weights, the compiled config,
        labels): a version that no longer serves keeps its name, state and reason only. A
        request still holding the graph finishes on it, and frees it when done."""
        self.model, self.config, self.io, self.plan = None, None, None, None
        self.labels = {}
        refreeze()  # a model made at start-up was frozen (kernels/collector.py)


@dataclass
class ModelVersions:
    """What one load of a model found: its versions, or why none could be looked at."""

    name: str
    versions: dict[int, RepositoryEntry]
    error: str | None = None  # the model as a whole could not be read


def load_folder(root: Path | None, name: str, settings: Settings,
                overrides: Overrides | None = None,
                runs: WarmupRuns = UNBUDGETED) -> ModelVersions:  # fmt: skip
    """The model of `root/name` (a name from the folder listing), every version its policy
    picks loaded (and warmed up, with `runs`: config/warmup.py) or refused with its reason;
    with `root` None, the model the overrides send whole (their config and files: no folder)."""
    try:
        folder = None if root is None else _model_folder(root, name)
        config = _config(folder, overrides)
        if is_ensemble(config):
            return _ensemble(name, folder, config, settings.max_load_versions)
        found = _version_files(folder, config, overrides, settings.max_load_versions)
    except ServiceError as exc:
        return ModelVersions(name, {}, str(exc))
    except OSError as exc:
        return ModelVersions(name, {}, f"{name}: the model folder cannot be read: "
                                       f"{exc.strerror or exc}")  # fmt: skip
    versions = {number: _entry(name, number, source, folder, config, settings, runs)
                for number, source in sorted(found.items())}  # fmt: skip
    return ModelVersions(name, versions)


def load_bare(root: Path, file_name: str, settings: Settings,
              overrides: Overrides | None = None,
              runs: WarmupRuns = UNBUDGETED) -> ModelVersions:  # fmt: skip
    """A bare `<name>.onnx` at the top of the repository: version 1 of model `name`, its
    configuration completed from the graph. A load request's overrides apply as to a folder
    with no config.pbtxt: its files replace the model (it is sent whole, as Triton loads the
    files a request sends); its config alone is the configuration of the file, with no folder
    to read labels or warm-up data from."""
    name = file_name.removesuffix(".onnx")
    if overrides is not None and overrides.files:
        return load_folder(None, name, settings, overrides, runs)
    path = inside(root, file_name)
    source: Path | bytes | str = path if path is not None else (
        f"{file_name} is a link that leaves the repository or a link loop; refused")  # fmt: skip
    config, picked = None, [1]
    if overrides is not None and overrides.config is not None:
        try:
            config = _config(None, overrides)
            if is_ensemble(config):
                return _ensemble(name, None, config, settings.max_load_versions)  # refused
            picked = _policy(config, [1], settings.max_load_versions)
        except ServiceError as exc:
            return ModelVersions(name, {}, str(exc))
    missing = f"{file_name} is version 1 only; version folder {{}} is not in the repository"
    return ModelVersions(name, {n: _entry(name, n, source if n == 1 else missing.format(n), None,
                                          config, settings, runs)
                                for n in picked})  # fmt: skip


def _model_folder(root: Path, name: str) -> Path:
    folder = inside(root, name)
    if folder is None or not folder.is_dir():
        raise InvalidInput(f"{name}: the model folder is a link that leaves the repository, "
                           "a link loop or not a folder; refused")  # fmt: skip
    return folder


def _config(folder: Path | None, overrides: Overrides | None) -> Any:
    if overrides is not None and overrides.config is not None:
        return from_a_load_request(config_from_json(overrides.config), _own_config(folder))
    if folder is None:
        raise InvalidInput("a model without a folder needs a 'config' and its files")
    return read_config(folder)


def _own_config(folder: Path | None) -> Any | None:
    """The folder's config.pbtxt, whose choices a load request's configuration may not undo
    (choice.from_a_load_request); None without one. One that is there but cannot be read (a
    link, a field this parser lacks, a file half written) refuses the request (400): its
    choices cannot be known, and a request that replaced it whole could undo them."""
    if folder is None:
        return None
    try:
        return read_config(folder)
    except (ServiceError, OSError) as exc:
        why = exc.detail if isinstance(exc, ServiceError) else (exc.strerror or str(exc))
        raise InvalidInput(f"the model's own config.pbtxt cannot be read ({why}), so a load "
                           "request's configuration cannot be checked against the operator's "
                           "choices in it; the file must be mended first") from None  # fmt: skip


def _version_files(folder: Path | None, config: Any, overrides: Overrides | None,
                   max_versions: int) -> dict[int, Path | bytes | str]:  # fmt: skip
    """Each version the policy picks, with its model file (a path, the override's bytes, or
    why there is none). Only the picked versions' files are decoded."""
    file_name = model_file(config) if config is not None else "model.onnx"
    if overrides is not None and overrides.files:
        sent = _sent_versions(overrides, file_name)
        return {n: overrides.file_bytes(sent[n]) if n in sent else (
                    f"no file parameter sends version {n}")
                for n in _policy(config, sorted(sent), max_versions)}  # fmt: skip
    if folder is None:
        raise InvalidInput("a model without a folder needs its files")
    available: dict[int, Path | str] = {}
    for entry in _listing(folder):
        number = _version_number(entry.name)
        if number is not None and entry.is_dir():
            model = inside(folder, f"{entry.name}/{file_name}")
            available[number] = model if model is not None else (
                f"its {file_name} is a link that leaves the model folder, or a link loop; "
                "refused")  # fmt: skip
    return {n: available.get(n, f"version folder {n} is not in the repository")
            for n in _policy(config, sorted(available), max_versions)}  # fmt: skip


def _ensemble(name: str, folder: Path | None, config: Any, max_versions: int) -> ModelVersions:
    """An ensemble's versions: the version folders its policy picks, each holding its plan
    (not yet linked to its step models: the repository does that)."""
    if folder is None:
        raise InvalidInput("an ensemble needs its model folder (its version folders)")
    try:
        done, plan = complete_ensemble(config, name)
        labels = output_labels(folder, done, MAX_LABEL_BYTES)
    except ServiceError as exc:
        return ModelVersions(name, {}, str(exc))
    available = [n for e in _listing(folder) if (n := _version_number(e.name)) and e.is_dir()]
    versions = {}
    for number in _policy(done, sorted(available), max_versions):
        if number in available:
            versions[number] = RepositoryEntry(name, number, Ensemble(plan), None, done,
                                               request_io(done), labels)  # fmt: skip
        else:
            versions[number] = RepositoryEntry(name, number, None, f"version folder {number} "
                                               "is not in the repository", state="UNAVAILABLE")  # fmt: skip
    return ModelVersions(name, versions)


def _sent_versions(overrides: Overrides, file_name: str) -> dict[int, str]:
    """Version number -> the `<version>/<model file>` path a load request sends it as."""
    sent: dict[int, str] = {}
    for path in overrides.files:
        folder_name, _, inner = path.partition("/")
        number = _version_number(folder_name)
        if number is None or inner != file_name:
            raise InvalidInput(f"load file '{path[:100]}' is not '<version>/{file_name}'")
        sent[number] = path
    return sent


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


def _policy(config: Any, available: list[int], max_versions: int) -> list[int]:
    """The versions the configuration's version_policy picks (Triton's default: the newest);
    a policy naming more than `max_versions` versions is refused, before any is loaded."""
    policy = config.version_policy if config is not None else None
    choice = policy.WhichOneof("policy_choice") if policy is not None else None
    if choice == "all":
        return available
    if choice == "specific":
        named = set(policy.specific.versions)  # type: ignore[union-attr]
        if len(named) > max_versions:
            raise InvalidInput(f"version_policy names {len(named)} specific versions, over the "
                               f"limit of {max_versions} (OPSERVE_MAX_LOAD_VERSIONS)")  # fmt: skip
        return sorted(named)
    count = policy.latest.num_versions if choice == "latest" else 1  # type: ignore[union-attr]
    return available[-max(count, 1) :]


def _entry(name: str, number: int, source: Path | bytes | str, folder: Path | None, config: Any,
           settings: Settings, runs: WarmupRuns = UNBUDGETED) -> RepositoryEntry:  # fmt: skip
    """One version loaded, or refused with its reason (logged by the repository, which knows
    whether anyone but the client needs it); never raises."""
    started = time.perf_counter()
    try:
        if isinstance(source, str):
            raise InvalidInput(source)
        entry = _loaded(name, number, source, folder, config, settings, runs)
        entry.load_seconds = time.perf_counter() - started
        return entry
    except ServiceError as exc:
        error = str(exc)
    except OSError as exc:
        error = f"cannot be read: {exc.strerror or exc}"
    except Exception as exc:  # one broken model must not stop the others
        log.exception("model %s version %d failed to load", name, number)
        error = f"failed to load: {type(exc).__name__}"
    return RepositoryEntry(name, number, None, error, state="UNAVAILABLE")


def _loaded(name: str, number: int, source: Path | bytes, folder: Path | None, config: Any,
            settings: Settings, runs: WarmupRuns) -> RepositoryEntry:  # fmt: skip
    data = source
    if isinstance(source, Path):
        what = f"version {number}'s {source.name}"
        data = read_regular(source, what, settings.max_model_bytes,  # type: ignore[assignment]
                            "OPSERVE_MAX_MODEL_BYTES")  # fmt: skip
        if data is None:
            raise InvalidInput(f"version {number} has no model file {source.name}")
    assert isinstance(data, bytes)
    # the engine its config names; bytes a load request sent are a client's (the workers)
    model = load_repository_model(data, config, settings, sent=isinstance(source, bytes))
    done = complete_config(config, name, model.inputs, model.outputs, folder,
                           initialized=model.initializers.keys(),
                           default_max_batch_size=settings.default_max_batch_size)  # fmt: skip
    record(done, model)
    plan = None
    if done.HasField("sequence_batching"):
        instances = sum(group.count for group in done.instance_group)
        plan = sequence_plan(done.sequence_batching, name, done.max_batch_size, instances)
    labels = output_labels(folder, done, MAX_LABEL_BYTES) if folder is not None else (
        _no_labels(done))  # fmt: skip
    io = request_io(done, model.inputs, model.outputs)
    warm_up(done, model, io, folder, settings, runs)  # READY only once its samples ran
    entry = RepositoryEntry(name, number, model, None, done, io, labels, plan)
    entry.cache_tag = cache_tag(data, done)
    return entry


def _no_labels(config: Any) -> dict[str, list[str]]:
    """A model without a folder has no label files: one its config names is refused."""
    for output in config.output:
        if output.label_filename:
            raise InvalidInput(f"label file '{output.label_filename[:100]}' is not in the "
                               "model directory (a model sent whole has no folder)")  # fmt: skip
    return {}
