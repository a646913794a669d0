"""The model repository: Triton's layout (`<root>/<name>/config.pbtxt`,
`<root>/<name>/<version>/model.onnx`), and a bare `<root>/<name>.onnx` as version 1, under
Triton's model control modes (OPSERVE_MODEL_CONTROL_MODE):

- none: every model is loaded at start-up, and the repository is never read again;
- explicit: the models of OPSERVE_LOAD_MODELS are loaded at start-up ("*": all), and clients
  load and unload models with the repository extension (POST /v2/repository/...);
- poll: as none, and the repository is read again every OPSERVE_REPOSITORY_POLL_SECONDS: a
  new model or version is loaded, a removed one unloaded, a changed one loaded again.

Loading runs on one loader thread (model_loader.py); the table changes only on the event loop,
in one step, so a request finds either the old versions or the new ones. An unloaded version
is drained: its requests in flight finish on it (it shows UNLOADING until they have), and a
load that fails leaves the versions that were serving in place. Model names come only from
the folder listing, never from a client's path.
"""

import asyncio
import logging
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from service.errors import InvalidInput, NotFound, Unavailable, listed
from service.runtime.model_loader import (
    ModelVersions,
    Overrides,
    RepositoryEntry,
    load_bare,
    load_folder,
)
from service.settings import Settings

log = logging.getLogger("opserve")
UNLOADED = "unloaded"  # Triton's reason for a version unloaded on purpose

__all__ = ["ModelRepository", "Overrides", "RepositoryEntry"]


class ModelRepository:
    """The repository's models by name, each version loaded, failed or unloaded."""

    def __init__(self, root: Path | None, settings: Settings) -> None:
        self.root = root
        self.settings = settings
        self.mode = settings.model_control_mode
        self._models: dict[str, ModelVersions] = {}
        self._fingerprints: dict[str, tuple[Any, ...]] = {}
        self._loader: ThreadPoolExecutor | None = None
        self._locks: dict[str, asyncio.Lock] = {}

    # --- what the data plane reads ---

    def names(self) -> list[str]:
        """The models loaded or tried, by name."""
        return sorted(self._models)

    def __contains__(self, name: str) -> bool:
        """Whether `name` is a model loaded or tried (every inference asks: no sorted list)."""
        return name in self._models

    def versions(self, name: str) -> dict[int, RepositoryEntry]:
        """Every version of `name` loaded or tried, oldest first (none when the model folder
        itself could not be read: `error` says why); NotFound for a model never tried."""
        if name not in self._models:
            raise NotFound(f"no model {name[:100]!r} in the repository" + (
                f"; the models are {listed(self.names())}" if self._models else ""))  # fmt: skip
        return self._models[name].versions

    def error(self, name: str) -> str | None:
        """Why the model as a whole could not be read, if it could not."""
        found = self._models.get(name)
        return found.error if found is not None else None

    def get(self, name: str, version: int | None = None) -> RepositoryEntry:
        """One version of a model: its newest ready one (its newest) when `version` is None."""
        versions = self.versions(name)
        if not versions:
            raise NotFound(f"model {name[:100]!r} has no versions: {self.error(name)}")
        if version is None:
            ready = [number for number, entry in versions.items() if entry.ready]
            return versions[max(ready or versions)]
        if version not in versions:
            raise NotFound(f"model {name[:100]!r} has no version {version}; its versions are "
                           f"{listed([str(v) for v in versions])}")  # fmt: skip
        return versions[version]

    def ready(self) -> int:
        """How many model versions are ready to run."""
        return sum(e.ready for m in self._models.values() for e in m.versions.values())

    def failed(self) -> bool:
        """Whether a model that should be served failed to load (strict readiness)."""
        return any(
            m.error is not None or any(e.state == "UNAVAILABLE" and e.error != UNLOADED
                                       for e in m.versions.values())
            for m in self._models.values()
        )  # fmt: skip

    def index(self, ready_only: bool) -> list[dict[str, Any]]:
        """Triton's repository index: every model folder, each version tried with its state
        (a folder never loaded: its name alone)."""
        rows: list[dict[str, Any]] = []
        for name in sorted({*self._models, *self._listed()}):
            found = self._models.get(name)
            if found is None or (not found.versions and found.error is None):
                if not ready_only:
                    rows.append({"name": name})
                continue
            if not found.versions:
                if not ready_only:
                    rows.append({"name": name, "state": "UNAVAILABLE", "reason": found.error})
                continue
            for number, entry in found.versions.items():
                if ready_only and not entry.ready:
                    continue
                row = {"name": name, "version": str(number), "state": entry.state}
                if entry.error:
                    row["reason"] = entry.error
                elif entry.model is not None and entry.model.engine_reason:
                    row["reason"] = entry.model.engine_reason  # why not onnxruntime (engines.py)
                rows.append(row)
        return rows

    # --- control ---

    async def start(self) -> None:
        """The start-up load of the mode: every model, or (explicit) OPSERVE_LOAD_MODELS."""
        if self.root is None:
            return
        names = self._listed()
        if self.mode == "explicit":
            asked = [n.strip() for n in self.settings.load_models.split(",") if n.strip()]
            names = names if "*" in asked else {n: names[n] for n in asked if n in names}
            for missing in sorted(set(asked) - set(names) - {"*"}):
                log.error("model %s (OPSERVE_LOAD_MODELS) is not in the repository", missing)
        for name in sorted(names):
            await self._load(name, names[name], None)
        log.info("model repository %s: %d model versions ready", self.root, self.ready())

    async def load(self, name: str, overrides: Overrides | None) -> None:
        """Load (or load again) a model on a client's request (explicit mode only)."""
        self._check_control()
        folder = self._listed().get(name)
        if folder is None and not (overrides and overrides.files and overrides.config):
            raise NotFound(f"failed to load '{name[:100]}', failed to poll from model "
                           "repository: no such model folder")  # fmt: skip
        loaded = await self._load(name, folder or name, overrides)
        shown = name[:100]
        if loaded.error is not None:  # Triton's words, then why
            raise InvalidInput(f"failed to load '{shown}', failed to poll from model "
                               f"repository: {loaded.error}")  # fmt: skip
        if problems := _problems(loaded):
            raise InvalidInput(f"load failed for model '{shown}': {problems}")

    async def unload(self, name: str) -> None:
        """Unload every version of a model (explicit mode only); an unknown one is no error."""
        self._check_control()
        found = self._models.get(name)
        if found is not None:
            for entry in found.versions.values():
                _retire(entry)
            self._fingerprints.pop(name, None)

    async def poll(self) -> None:
        """Poll mode: read the repository again every OPSERVE_REPOSITORY_POLL_SECONDS."""
        while True:
            await asyncio.sleep(self.settings.repository_poll_seconds)
            try:
                await self.refresh()
            except Exception:  # one bad read must not end polling
                log.exception("model repository poll failed")

    async def refresh(self) -> None:
        """Load what is new or changed, unload what is gone (poll mode's one step)."""
        listed = self._listed()
        for name in sorted(set(self._models) - set(listed)):
            for entry in self._models[name].versions.values():
                _retire(entry)
            del self._models[name]
            self._fingerprints.pop(name, None)
        for name, entry_name in sorted(listed.items()):
            fingerprint = await self._on_loader(_fingerprint, self.root, entry_name)
            if fingerprint != self._fingerprints.get(name):
                await self._load(name, entry_name, None)

    def close(self) -> None:
        """Stop the loader thread."""
        if self._loader is not None:
            self._loader.shutdown(wait=False, cancel_futures=True)
            self._loader = None

    # --- inside ---

    def _check_control(self) -> None:
        if self.mode != "explicit":
            raise Unavailable("explicit model load / unload is not allowed if polling is "
                              "enabled")  # Triton's words, whatever the mode  # fmt: skip

    async def _load(self, name: str, entry_name: str,
                    overrides: Overrides | None) -> ModelVersions:  # fmt: skip
        """Load one model and put what loaded in the table (what the load found, its failures
        included). A failed version leaves its ready predecessor serving."""
        lock = self._locks.setdefault(name, asyncio.Lock())
        async with lock:  # one load of a model at a time, in order
            assert self.root is not None
            fingerprint = await self._on_loader(_fingerprint, self.root, entry_name)
            if entry_name.endswith(".onnx"):
                loaded = await self._on_loader(load_bare, self.root, entry_name, self.settings)
            else:
                loaded = await self._on_loader(load_folder, self.root, entry_name,
                                               self.settings, overrides)  # fmt: skip
            self._fingerprints[name] = fingerprint
            self._swap(name, loaded)
            return loaded

    def _swap(self, name: str, loaded: ModelVersions) -> None:
        old = self._models.get(name)
        if old is None or (loaded.error is not None and not old.versions):
            self._models[name] = loaded
            return
        if loaded.error is not None:
            log.error("model %s: %s; its loaded versions keep serving", name, loaded.error)
            return
        merged = dict(loaded.versions)
        for number, entry in old.versions.items():
            fresh = merged.get(number)
            if fresh is None:
                _retire(entry)  # no longer picked by the version policy
                merged[number] = entry
            elif not fresh.ready and entry.ready:
                merged[number] = entry  # a load that fails leaves the previous one serving
            elif fresh is not entry:
                _retire(entry, dropped=True)
        self._models[name] = ModelVersions(name, dict(sorted(merged.items())))

    def _listed(self) -> dict[str, str]:
        """Model name -> its folder (or bare file) name, from the repository's listing."""
        if self.root is None:
            return {}
        try:
            with os.scandir(self.root) as listing:
                entries = [(e.name, _is_dir(e)) for e in listing]
        except OSError as exc:
            log.error("model repository %s cannot be read: %s", self.root, exc.strerror or exc)
            return {}
        found: dict[str, str] = {}
        for entry_name, is_dir in sorted(entries):
            if entry_name.startswith(".") or not _printable(entry_name):
                continue
            if is_dir:
                found[entry_name] = entry_name
            elif entry_name.endswith(".onnx") and len(entry_name) > 5:
                bare = entry_name.removesuffix(".onnx")
                if bare in found:
                    log.warning("model %s: %s ignored, %s/ is the model", bare, entry_name, bare)
                    continue
                found.setdefault(bare, entry_name)
        return found

    async def _on_loader(self, work: Any, *args: Any) -> Any:
        if self._loader is None:
            self._loader = ThreadPoolExecutor(1, thread_name_prefix="opserve-loader")
        return await asyncio.get_running_loop().run_in_executor(self._loader, work, *args)


def _retire(entry: RepositoryEntry, dropped: bool = False) -> None:
    """Take a version out of service: UNLOADING while requests still run on it."""
    if entry.state != "READY":
        return
    entry.state = "UNLOADING" if entry.active else "UNAVAILABLE"
    if not dropped:
        entry.error = UNLOADED


def _problems(loaded: ModelVersions) -> str:
    return "; ".join(f"version {n} is at UNAVAILABLE state: {e.error}"
                     for n, e in loaded.versions.items() if e.error)  # fmt: skip


def _is_dir(entry: os.DirEntry[str]) -> bool:
    """A folder (links followed: load_folder refuses one that leaves the repository); an
    entry that cannot be looked at (a link loop) counts as one, so it is listed with its
    reason, unless its name is a bare model file's."""
    try:
        return entry.is_dir()
    except OSError:
        return not entry.name.endswith(".onnx")


def _printable(name: str) -> bool:
    """A name from the listing that is UTF-8 (os.scandir gives undecodable bytes as
    surrogates): others are skipped, shown escaped in the log."""
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        shown = name.encode("utf-8", "surrogateescape")
        log.warning("model repository: %r is not a UTF-8 name; skipped", shown[:100])
        return False
    return True


def _fingerprint(root: Path, entry_name: str) -> tuple[Any, ...]:
    """What poll mode compares: the names, sizes and times of the model's files (two levels
    deep, bounded), so a change to any of them loads the model again."""
    found: list[tuple[Any, ...]] = []
    stack = [(root / entry_name, 0)]
    while stack and len(found) < 10_000:
        path, depth = stack.pop()
        try:
            info = path.stat()
        except OSError:
            found.append((str(path), None))
            continue
        found.append((str(path), info.st_size, info.st_mtime_ns, info.st_ino))
        if depth < 2 and path.is_dir():
            try:
                stack += [(Path(e.path), depth + 1) for e in os.scandir(path)]
            except OSError:
                found.append((str(path), "unreadable"))
    return tuple(sorted(found, key=str))
