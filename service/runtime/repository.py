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
is drained: its requests in flight finish on it (it shows UNLOADING until they have), then
what it held is freed; only its row stays (`unloaded`), until the model's next load.

A client's load is all or nothing, as Triton's: if the model or any version it picks fails,
nothing changes (the versions that were serving keep serving, no failed row is added, strict
readiness is as it was) and the answer says why. Start-up and poll loads keep what failed in
the index with its reason: those are the models the operator asked to serve. Model names
come from the folder listing, or from a load that sends the model whole (its config and
files, checked by load_request.py): a client's name never becomes a path.

An ensemble is linked to its step models as it goes into the table (runtime/ensembles.py): it
loads after them (start-up and polls load ensembles last), fails its load when one is missing,
not ready or disagrees with it, and is taken out of service (UNAVAILABLE, with the reason)
when a load or unload of a step model breaks it, as Triton's dependency graph does.
"""

import asyncio
import logging
import os
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from service.errors import InvalidInput, NotFound, PayloadTooLarge, Unavailable, listed
from service.runtime.config.messages import shown
from service.runtime.config.warmup import WarmupRuns
from service.runtime.ensembles import (
    UNLOADED,
    EnsemblePlan,
    depending_on,
    ensemble_of,
    link_problem,
    load_order,
)
from service.runtime.model_loader import (
    ModelVersions,
    Overrides,
    RepositoryEntry,
    load_bare,
    load_folder,
)
from service.settings import Settings

log = logging.getLogger("opserve")
SHOWN_PROBLEMS = 3  # versions whose reasons a refused load's answer gives, then a count

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
        self._turns: dict[str, _Turn] = {}  # only of the names being loaded or unloaded
        self._sent: dict[str, int] = {}  # models sent whole (no folder): their files' bytes
        # what warmup runs use (the budget, the isolated workers): the app's, set once built
        self.warmup = WarmupRuns()
        # the data plane's statistics, where ensemble steps are counted (core/ensemble_model.py);
        # the app's, set once built (None: not counted)
        self.statistics: Any = None

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

    def lookup(self, name: str) -> ModelVersions | None:
        """A model's versions loaded or tried, or None (ensembles find their steps so)."""
        return self._models.get(name)

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
        """Whether a model that should be served failed to load (strict readiness): one the
        start-up or a poll loaded, and not unloaded since (a client's failed load changes
        nothing, so it never counts)."""
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
                    row["reason"] = entry.model.engine_reason  # why not onnxruntime (choice.py)
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
        await self._load_all(names)
        log.info("model repository %s: %d model versions ready", self.root, self.ready())

    async def load(self, name: str, overrides: Overrides | None) -> None:
        """Load (or load again) a model on a client's request (explicit mode only), all or
        nothing; `overrides` with a config and files may send a model that has no folder."""
        self._check_control()
        folder = self._listed().get(name)
        whole = overrides is not None and bool(overrides.files) and overrides.config is not None
        if folder is None and not whole:
            raise NotFound(f"failed to load '{name[:100]}', failed to poll from model "
                           "repository: no such model folder")  # fmt: skip
        async with self._turn(name):  # one load or unload of a model at a time, in order
            sent = self._check_sent(name, overrides) if folder is None else None
            loaded = await self._read(name, folder, overrides)
            problem = self._link(name, loaded)
            refusal = _refusal(name, loaded) if problem is None else (
                InvalidInput(f"load failed for model '{shown(name)}': {problem}"))  # fmt: skip
            if refusal is not None:
                log.warning("model %s: a load was refused and changed nothing: %s",
                            name[:100], refusal)  # fmt: skip
                raise refusal
            self._swap(name, loaded)
            self._relink([name])
            if sent is not None:
                self._sent[name] = sent

    async def unload(self, name: str) -> None:
        """Unload every version of a model (explicit mode only); an unknown one is no error.
        Its rows stay as `unloaded` (failures too: none counts against readiness now), what
        they held is freed once drained; a model sent whole leaves nothing behind."""
        self._check_control()
        async with self._turn(name):
            found = self._models.get(name)
            if found is None:
                return
            for entry in found.versions.values():
                entry.retire(UNLOADED)
            found.error = None
            self._fingerprints.pop(name, None)
            if name not in self._listed():
                del self._models[name]
                self._sent.pop(name, None)
            self._relink([name])

    def _check_sent(self, name: str, overrides: Overrides | None) -> int:
        """The bytes a model sent whole will hold (its files'); PayloadTooLarge when the models
        sent whole would then hold more than OPSERVE_MAX_SENT_MODEL_BYTES together (what a
        model of the same name holds now is replaced, so not counted)."""
        assert overrides is not None
        nbytes = sum(len(data) for data in overrides.files.values())
        others = sum(held for sent, held in self._sent.items() if sent != name)
        most = self.settings.max_sent_model_bytes
        if others + nbytes > most:
            raise PayloadTooLarge(
                f"failed to load '{name[:100]}': the models sent whole would hold "
                f"{others + nbytes} bytes, over the limit of {most} "
                f"(OPSERVE_MAX_SENT_MODEL_BYTES); unload one first ({len(self._sent)} loaded)"
            )
        return nbytes

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
        gone = sorted(set(self._models) - set(listed))
        for name in gone:
            for entry in self._models[name].versions.values():
                entry.retire(UNLOADED)
            del self._models[name]
            self._fingerprints.pop(name, None)
        self._relink(gone)
        changed = {}
        for name, entry_name in sorted(listed.items()):
            fingerprint = await self._on_loader(_fingerprint, self.root, entry_name)
            if fingerprint != self._fingerprints.get(name):
                changed[name] = entry_name
        await self._load_all(changed)

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

    async def _load_all(self, names: dict[str, str]) -> None:
        """Load models at start-up or on a poll (name -> folder), ensembles last, each after
        the ensembles its steps name."""
        later: dict[str, ModelVersions] = {}
        for name in sorted(names):
            async with self._turn(name):
                loaded = await self._read(name, names[name], None)
                if _plan(loaded) is None:
                    self._settle(name, loaded)
                else:
                    later[name] = loaded
        plans = {name: _plan(loaded) for name, loaded in later.items()}
        for name in load_order(plans):  # type: ignore[arg-type]
            async with self._turn(name):
                self._settle(name, later[name])

    def _settle(self, name: str, loaded: ModelVersions) -> None:
        """Put what a start-up or poll load found in the table, its failures included (logged,
        one line each). A failed version leaves its ready predecessor serving."""
        self._link(name, loaded)
        if loaded.error is not None:
            log.error("model %s is not ready: %s", name, loaded.error)
        for number, entry in loaded.versions.items():
            if entry.error is not None:
                log.error("model %s version %d is not ready: %s", name, number, entry.error)
        self._swap(name, loaded)
        self._relink([name])

    def _link(self, name: str, loaded: ModelVersions) -> str | None:
        """Link a loaded ensemble to its step models as the table holds them now; when that
        fails, each of its versions is failed with the reason, returned (None: linked, or
        no ensemble)."""
        plan = _plan(loaded)
        if plan is None:
            return None
        config = next(e.config for e in loaded.versions.values() if ensemble_of(e))
        problem = link_problem(name, config, plan, self.lookup)
        if problem is not None:
            for entry in loaded.versions.values():
                entry.free()
                entry.error, entry.state = entry.error or problem, "UNAVAILABLE"
        return problem

    def _relink(self, changed: list[str]) -> None:
        """The ensembles that run the models `changed` (in turn), linked again: one that no
        longer can serve is taken out of service with the reason."""
        for name in depending_on(changed, self._models):
            for number, entry in self._models[name].versions.items():
                ensemble = ensemble_of(entry)
                if ensemble is None or not entry.ready:
                    continue
                problem = link_problem(name, entry.config, ensemble.plan, self.lookup)
                if problem is not None:
                    log.error("model %s version %d is not ready: %s", name, number, problem)
                    entry.retire(problem)

    async def _read(self, name: str, entry_name: str | None,
                    overrides: Overrides | None) -> ModelVersions:  # fmt: skip
        """What one load of a model finds (on the loader thread); `entry_name` None: a model
        sent whole, with no folder. The folder's fingerprint is kept for poll mode."""
        assert self.root is not None
        if entry_name is None:
            return await self._on_loader(load_folder, None, name, self.settings, overrides,
                                         self.warmup)  # fmt: skip
        fingerprint = await self._on_loader(_fingerprint, self.root, entry_name)
        if entry_name.endswith(".onnx"):
            loaded = await self._on_loader(load_bare, self.root, entry_name, self.settings,
                                           overrides, self.warmup)  # fmt: skip
        else:
            loaded = await self._on_loader(load_folder, self.root, entry_name, self.settings,
                                           overrides, self.warmup)  # fmt: skip
        self._fingerprints[name] = fingerprint
        return loaded

    def _swap(self, name: str, loaded: ModelVersions) -> None:
        """Put what a load found in the table in one step: versions it no longer picks are
        retired (their rows stay until the next load, as `unloaded`), versions it loaded
        again replace theirs (freed once drained). A load with a failed version (start-up
        and poll: a client's failed load never gets here) changes nothing that serves, as a
        failed reload in Triton leaves the loaded model as it was: the versions that were
        ready keep serving, its failed versions are listed with their reasons, and the
        versions it did load are freed. A poll that saw a new version's folder before its
        model file was in it retired the serving version for a moment (every request 404)."""
        old = self._models.get(name)
        if old is None or (loaded.error is not None and not old.versions):
            self._models[name] = loaded
            return
        if loaded.error is not None:
            log.error("model %s: %s; its loaded versions keep serving", name, loaded.error)
            return
        serving = {number: entry for number, entry in old.versions.items() if entry.ready}
        if serving and not all(entry.ready for entry in loaded.versions.values()):
            self._keep_serving(name, old, loaded, serving)
            return
        merged = dict(loaded.versions)
        for number, entry in old.versions.items():
            fresh = merged.get(number)
            if fresh is None:
                if entry.state != "UNAVAILABLE":  # retired now: its row says so until next time
                    entry.retire(UNLOADED)
                    merged[number] = entry
            elif fresh is not entry:
                entry.retire(None)
        self._models[name] = ModelVersions(name, dict(sorted(merged.items())))

    def _keep_serving(self, name: str, old: ModelVersions, loaded: ModelVersions,
                      serving: dict[int, RepositoryEntry]) -> None:  # fmt: skip
        """_swap's failed load: what served keeps serving, the failed versions are listed."""
        log.error("model %s: a version failed to load; the versions that were serving (%s) "
                  "keep serving", name, ", ".join(map(str, serving)))  # fmt: skip
        merged = dict(old.versions)
        for number, fresh in loaded.versions.items():
            if fresh.ready:
                if merged.get(number) is not fresh:
                    fresh.retire(None)  # loaded, but the load as a whole failed: freed
            elif number not in serving:
                merged[number] = fresh  # listed with its reason (UNAVAILABLE)
        self._models[name] = ModelVersions(name, dict(sorted(merged.items())))

    @asynccontextmanager
    async def _turn(self, name: str) -> AsyncIterator[None]:
        """One load or unload of `name` at a time, in order; the lock is dropped once no one
        waits for it, so names that come and go leave nothing behind."""
        turn = self._turns.setdefault(name, _Turn())
        turn.waiting += 1
        try:
            async with turn.lock:
                yield
        finally:
            turn.waiting -= 1
            if not turn.waiting:
                del self._turns[name]

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


@dataclass
class _Turn:
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    waiting: int = 0


def _plan(loaded: ModelVersions) -> EnsemblePlan | None:
    """The plan of an ensemble's load (its versions share it); None: no ensemble."""
    found = (ensemble_of(entry) for entry in loaded.versions.values())
    return next((ensemble.plan for ensemble in found if ensemble is not None), None)


def _refusal(name: str, loaded: ModelVersions) -> InvalidInput | None:
    """Why a client's load failed, in Triton's words, with the first few versions' reasons
    and how many more (a load may pick many): None when it loaded."""
    shown = name[:100]
    if loaded.error is not None:
        return InvalidInput(f"failed to load '{shown}', failed to poll from model repository: "
                            f"{loaded.error[:1000]}")  # fmt: skip
    if not loaded.versions:
        return InvalidInput(f"failed to load '{shown}', no version is available")
    problems = [f"version {n} is at UNAVAILABLE state: {e.error}"
                for n, e in loaded.versions.items() if e.error]  # fmt: skip
    if not problems:
        return None
    for entry in loaded.versions.values():
        entry.free()  # the versions that did load are not kept
    return InvalidInput(f"load failed for model '{shown}': "
                        f"{listed(problems, SHOWN_PROBLEMS, 500, '; ')}")  # fmt: skip


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
