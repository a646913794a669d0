"""The model repository: Triton's layout, `<root>/<name>/<version>/model.onnx`, and a bare
`<root>/<name>.onnx` as version 1. Read once at start-up; a model that fails to load is kept,
not ready, with its reason, and never stops the others."""

import logging
import os
from dataclasses import dataclass
from pathlib import Path

from service.errors import InvalidInput, NotFound, PayloadTooLarge, ServiceError
from service.runtime.graph import LoadedModel
from service.runtime.plan import load_model
from service.settings import Settings

log = logging.getLogger("opserve")
MODEL_FILE = "model.onnx"


@dataclass(frozen=True)
class RepositoryEntry:
    name: str
    version: int
    model: LoadedModel | None  # None when it failed to load
    error: str | None  # why it is not ready


class ModelRepository:
    """Names and versions come only from the directory listing, never from a client."""

    def __init__(self, root: Path | None, settings: Settings) -> None:
        self.root = root
        self.settings = settings
        self._models: dict[str, dict[int, RepositoryEntry]] = {}

    def load(self) -> None:
        """Read and validate every model; failures are logged and kept as not ready."""
        self._models = {}
        if self.root is None:
            return
        try:
            root = self.root.resolve(strict=True)
            listing = sorted(os.scandir(root), key=lambda e: e.name)
        except OSError as exc:
            log.error("model repository %s cannot be read: %s", self.root, exc)
            return
        for entry in listing:
            if entry.name.startswith("."):
                continue
            if entry.is_dir():
                for version, path in self._versions(root, Path(entry.path)):
                    self._add(entry.name, version, path, root)
            elif entry.name.endswith(".onnx") and len(entry.name) > len(".onnx"):
                name = entry.name.removesuffix(".onnx")
                if 1 in self._models.get(name, {}):
                    log.warning("model %s: %s ignored, %s/1 is version 1", name, entry.name, name)
                    continue
                self._add(name, 1, Path(entry.path), root)
        total = sum(len(vs) for vs in self._models.values())
        log.info("model repository %s: %d of %d model versions ready", root, self.ready(), total)

    def ready(self) -> int:
        """How many model versions loaded and are ready to run."""
        return sum(e.model is not None for vs in self._models.values() for e in vs.values())

    def names(self) -> list[str]:
        """Sorted model names."""
        return sorted(self._models)

    def versions(self, name: str) -> dict[int, RepositoryEntry]:
        """Every version of `name`, oldest first; NotFound if there is no such model."""
        if name not in self._models:
            raise NotFound(f"no model {name[:100]!r} in the repository" + (
                f"; the models are {', '.join(self.names())}" if self._models else ""))  # fmt: skip
        return self._models[name]

    def get(self, name: str, version: int | None = None) -> RepositoryEntry:
        """One version of a model, the newest when `version` is None."""
        versions = self.versions(name)
        if version is None:
            return versions[max(versions)]
        if version not in versions:
            raise NotFound(f"model {name[:100]!r} has no version {version}; its versions are "
                           f"{', '.join(map(str, versions))}")  # fmt: skip
        return versions[version]

    def _versions(self, root: Path, folder: Path) -> list[tuple[int, Path]]:
        found = []
        for entry in os.scandir(folder):
            name = entry.name
            if not (name.isascii() and name.isdigit() and len(name) <= 9 and int(name) > 0):
                log.warning("model %s: %s is not a version folder (a positive integer), "
                            "ignored", folder.name, name)  # fmt: skip
                continue
            if entry.is_dir():
                found.append((int(name), Path(entry.path) / MODEL_FILE))
        return sorted(found)

    def _add(self, name: str, version: int, path: Path, root: Path) -> None:
        try:
            model, error = self._read(path, root), None
        except ServiceError as exc:
            model, error = None, str(exc)
        except OSError as exc:
            model, error = None, f"cannot be read: {exc.strerror or exc}"
        except Exception as exc:  # one broken model must not stop the others
            log.exception("model %s version %d failed to load", name, version)
            model, error = None, f"failed to load: {type(exc).__name__}"
        if error is not None:
            log.error("model %s version %d is not ready: %s", name, version, error)
        self._models.setdefault(name, {})[version] = RepositoryEntry(name, version, model, error)
        self._models[name] = dict(sorted(self._models[name].items()))

    def _read(self, path: Path, root: Path) -> LoadedModel:
        real = path.resolve(strict=True)
        if not real.is_relative_to(root):
            raise InvalidInput(f"{path.relative_to(root)} is a link that leaves the repository; "
                           "refused")  # fmt: skip
        limit = self.settings.max_model_bytes
        size = real.stat().st_size
        if size > limit:
            raise PayloadTooLarge(f"{path.relative_to(root)} has {size} bytes, over the limit of "
                           f"{limit} (OPSERVE_MAX_MODEL_BYTES)")  # fmt: skip
        with real.open("rb") as file:
            data = file.read(limit + 1)
        if len(data) > limit:  # it grew after stat
            raise PayloadTooLarge(f"{path.relative_to(root)} is over {limit} bytes")
        return load_model(data, self.settings)
