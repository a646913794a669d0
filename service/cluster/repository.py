"""Repository control on every replica (cluster mode, explicit model control): a load or
unload on any replica is applied there first (all or nothing, as one process's), then written
to the desired state in Redis (desired_state.py, its files as blobs.py's), then the call waits
until every live replica has applied it (applied.py). Each replica applies the desired state
at start-up before it says ready, when a change is announced, and on a timer (every
OPSERVE_CLUSTER_HEARTBEAT_SECONDS), so a replica that missed an announcement converges anyway.

Differences between replicas are tolerated: a replica registers that it takes part (only these
are waited for, members.CONTROL); one that finds the record made anew (Redis lost its data)
adds back the models the old record wanted (desired_state.py's reseed window), so whichever
replica reseeded takes nothing from the others; and one that cannot serve a model the cluster
wants says why, in its index, its model ready route (`reason`) and a load it took.

Requests are checked (runtime/load_request.py) and claim their memory in the data plane, below
both doors, as in one process; this module only decides where and when they apply."""

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator
from typing import Any

from service.cluster.applied import APPLIED, FAILED, wait_applied
from service.cluster.blobs import Blobs
from service.cluster.cluster import Cluster
from service.cluster.desired_state import DesiredState, Snapshot, Spec
from service.cluster.members import CONTROL
from service.cluster.sequences import ClusterSequences
from service.cluster.store import ClusterUnreachable
from service.core.dataplane import DataPlane
from service.core.memory_budget import Reservation
from service.errors import Overloaded, PayloadTooLarge, ServiceError, Unavailable
from service.runtime.load_request import LoadRequest, load_request
from service.runtime.repository import UNLOADED, ModelRepository
from service.settings import Settings

log = logging.getLogger("opserve")


class ClusterRepository:
    """This replica's part in the cluster's repository control (the data plane's `shared_control`)."""

    def __init__(self, cluster: Cluster, plane: DataPlane, repository: ModelRepository,
                 settings: Settings) -> None:  # fmt: skip
        self.members = cluster.members
        self.members.info[CONTROL] = "1"  # before its first beat: loads wait for this member
        self.state = DesiredState(cluster.store, settings.cluster_apply_seconds)
        self.blobs = Blobs(cluster.store, self.state.blob_prefix, settings)
        self.plane, self.repository, self.settings = plane, repository, settings
        self.interval = settings.cluster_heartbeat_seconds
        self.here: dict[str, int] = {}  # model -> stamp of its spec loaded here
        self.failed: dict[str, tuple[int, str, bool]] = {}  # model -> (stamp, why, try again)
        self.desired: Snapshot | None = None  # the record as this replica applied it last
        self._lock = asyncio.Lock()  # one reconcile or control call of this replica at a time
        self._wake = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []

    # --- control calls (the data plane's) ---

    async def load(self, request: LoadRequest, held: Reservation | None) -> None:
        """Load here (all or nothing), then on every live replica."""
        digests: dict[str, str] = {}

        async def share_files() -> None:  # while the load's memory is still claimed
            for path in request.overrides.files:
                digests[path] = await self.blobs.put(request.overrides.file_bytes(path))

        async with self._turn():
            snapshot = await self._reconcile()  # Redis away: 503 before anything changes here
            try:
                await self.plane.load_here(request, held, share_files if request.overrides.files
                                           else None)  # fmt: skip
            except ClusterUnreachable:
                raise
            except ServiceError as exc:  # its own status; the text says where and what stays
                exc.detail = (f"the load failed on this replica ({self.members.id}), the "
                              f"cluster's desired state is unchanged: {exc.detail}")  # fmt: skip
                raise
            self.here.pop(request.name, None)  # until written: a failed write reloads the record's
            spec = Spec(request.overrides.config, digests)
            sent = sum(len(request.overrides.file_bytes(path)) for path in digests)
            try:
                generation = await self.state.write(snapshot.epoch, request.name, spec, sent,
                                                    self.settings.max_sent_model_bytes)  # fmt: skip
            except PayloadTooLarge:  # the cluster's bound: here as the record wants it
                if request.name not in snapshot.models:
                    await self.plane.unload_here(request.name)  # before the others' apply
                await self._reconcile()  # (the record's spec of it loaded again, if any)
                raise
            self.here[request.name] = generation
            self.failed.pop(request.name, None)
            await self._reconcile()  # what other replicas changed meanwhile; publishes applied
        await wait_applied(self.members, snapshot.epoch, generation, request.name, "load",
                           self.settings.cluster_apply_seconds)  # fmt: skip

    async def unload(self, name: str) -> None:
        """Unload here, then on every live replica (an unknown model is no error)."""
        async with self._turn():
            snapshot = await self._reconcile()
            await self.plane.unload_here(name)
            self.here.pop(name, None)
            self.failed.pop(name, None)
            generation = await self.state.write(snapshot.epoch, name, None)
            await self._reconcile()
        await self._forget_sequences(name)
        await wait_applied(self.members, snapshot.epoch, generation, name, "unload",
                           self.settings.cluster_apply_seconds)  # fmt: skip

    async def _forget_sequences(self, name: str) -> None:
        """The unloaded model's sequences leave the cluster store now, not when they expire
        (best effort: they expire anyway, within OPSERVE_CLUSTER_SEQUENCE_MAX_IDLE_SECONDS)."""
        sequences = self.plane.sequences
        if isinstance(sequences, ClusterSequences):
            try:
                dropped = await sequences.forget(name)
            except ClusterUnreachable as exc:
                log.warning("model %s: its sequences' keys stay until they expire: %s",
                            name[:100], exc.cause or exc)  # fmt: skip
                return
            if dropped:
                log.info("model %s: %d sequences removed from the cluster store", name[:100],
                         dropped)  # fmt: skip

    @contextlib.asynccontextmanager
    async def _turn(self) -> AsyncIterator[None]:
        """This replica's lock, for a control call: waited for as long as a load ahead takes,
        but not past a Redis that does not answer (503 within about two store timeouts, where
        each call ahead waiting for Redis would add one)."""
        while True:
            try:
                async with asyncio.timeout(self.state.store.timeout):
                    await self._lock.acquire()
                break
            except TimeoutError:
                await self.state.version()  # ClusterUnreachable when Redis does not answer
        try:
            yield
        finally:
            self._lock.release()

    def reason(self, name: str) -> str | None:
        """Why a model the cluster wants is not served here at its latest spec (None: the
        cluster does not want it, or it is served)."""
        spec = self.desired.models.get(name) if self.desired is not None else None
        if spec is None or self.here.get(name) == spec.stamp:
            return None
        failure = self.failed.get(name)
        if failure is not None and failure[0] == spec.stamp:
            return f"failed on this replica: {failure[1]}"
        return (f"desired by the cluster (generation {spec.stamp}), not applied on this "
                "replica yet")  # fmt: skip

    def index(self, ready_only: bool) -> list[dict[str, Any]]:
        """This replica's index, with a row for each model the cluster wants (as this replica
        last read the record) that is not loaded here at its latest spec: LOADING, or
        UNAVAILABLE with why it failed here."""
        rows = self.repository.index(ready_only)
        if self.desired is None or ready_only:
            return rows
        for name in self.desired.models:
            reason = self.reason(name)
            if reason is None:
                continue
            state = "UNAVAILABLE" if reason.startswith("failed") else "LOADING"
            row = {"name": name, "state": state, "reason": reason}
            rows = [r for r in rows if r != {"name": name}] + [row]
        return sorted(rows, key=lambda r: (r["name"], int(r.get("version", 0))))

    # --- the life of the replica ---

    async def start(self) -> None:
        """Apply the desired state (making the record from this replica's start-up models if
        there is none) before the replica says ready; then follow it. A Redis away at start-up
        delays it: the timer applies it once Redis answers."""
        try:
            async with self._lock:
                await self._reconcile(adopt=True)
        except Unavailable as exc:  # the store away (ClusterUnreachable) or its record
            log.warning("repository desired state not applied at start-up: %s", exc)
        self._tasks = [asyncio.create_task(self._follow(), name="cluster-repository"),
                       asyncio.create_task(self._listen(), name="cluster-repository-news")]  # fmt: skip

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _follow(self) -> None:
        """Reconcile when woken by an announcement, and every interval anyway."""
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self.interval)
            self._wake.clear()
            try:
                async with self._lock:
                    if await self._behind():
                        await self._reconcile()
            except ClusterUnreachable:
                pass  # the heartbeat logs it; the next turn tries again
            except Exception:  # one bad turn must not end following
                log.exception("repository desired state: a reconcile failed")

    async def _listen(self) -> None:
        """Wake `_follow` on each announced change (pub/sub: a wake-up only)."""
        while True:
            try:
                async with self.state.store.redis.pubsub() as news:
                    await news.subscribe(self.state.channel)
                    while True:
                        if await news.get_message(True, timeout=self.interval) is not None:
                            self._wake.set()
            except asyncio.CancelledError:
                raise
            except Exception:  # Redis away: the timer goes on; subscribe again later
                await asyncio.sleep(self.interval)

    async def _behind(self) -> bool:
        """Whether the record moved past what this replica applied (one small read), or a
        load that failed for want of memory or the store waits to be tried again."""
        retry = any(again for _stamp, _why, again in self.failed.values())
        version = await self.state.version()
        return retry or self.desired is None or version != self.desired.version

    # --- applying the record here ---

    async def _reconcile(self, adopt: bool = False) -> Snapshot:
        """Make this replica serve what the record says, then publish the generation applied
        and what failed. `adopt`: at start-up, a model the start-up loaded from its folder and
        the record wants as its folder has it counts as applied (not loaded twice)."""
        snapshot = await self.state.read()
        if snapshot is None:  # the first replica, or a Redis that lost its data
            await self.state.seed(self._seed())
            snapshot = await self.state.read()
            if snapshot is None:
                raise Unavailable("the cluster's desired state could not be made; try again")
        if self.desired is not None and snapshot.epoch != self.desired.epoch:
            snapshot = await self._merge(snapshot)
        for name, spec in snapshot.models.items():
            if self._same(name, spec, snapshot) or (adopt and spec.config is None and
                                                    not spec.files and self._serving(name)):  # fmt: skip
                self.here[name] = spec.stamp
            await self._apply(name, spec)
        for name in self._stray(snapshot):
            log.info("model %s: unloaded, the cluster no longer wants it", name[:100])
            await self.plane.unload_here(name)
            self.here.pop(name, None)
        self.failed = {n: f for n, f in self.failed.items() if n in snapshot.models}
        self.desired = snapshot
        failures = {name: why for name, (_stamp, why, _again) in self.failed.items()}
        await self.members.beat({APPLIED: f"{snapshot.epoch}:{snapshot.generation}",
                                 FAILED: json.dumps(failures)})  # fmt: skip
        return snapshot

    async def _apply(self, name: str, spec: Spec) -> None:
        """Load one desired model here unless its spec is loaded (or failed for good) already;
        a failure is kept with its reason, a store away ends the turn (tried again later)."""
        failure = self.failed.get(name)
        if self.here.get(name) == spec.stamp or (failure and failure[0] == spec.stamp
                                                 and not failure[2]):  # fmt: skip
            return
        try:
            if spec.error is not None:
                raise Unavailable(spec.error)
            async with self.plane.budget.reservation() as held:
                files = await self.blobs.fetch(name, spec.files, held) if spec.files else {}
                request = load_request(name, spec.config, files, self.settings)
                await self.plane.load_here(request, held)
        except ClusterUnreachable:
            raise
        except ServiceError as exc:
            again = isinstance(exc, Unavailable | Overloaded) and spec.error is None
            if failure is None or failure[:2] != (spec.stamp, str(exc)):
                log.warning("model %s: the cluster's load failed here: %s", name[:100], exc)
            self.failed[name] = (spec.stamp, str(exc), again)
            self.here.pop(name, None)
            return
        self.here[name] = spec.stamp
        self.failed.pop(name, None)

    async def _merge(self, snapshot: Snapshot) -> Snapshot:
        """The record made anew, with the models the old one wanted from folders (and those
        served here) added back while its reseed window is open."""
        assert self.desired is not None
        kept = {name: Spec(spec.config) for name, spec in self.desired.models.items()
                if not spec.files and spec.error is None}  # fmt: skip
        kept |= self._seed()
        missing = {name: spec for name, spec in kept.items() if name not in snapshot.models}
        if not missing or not await self.state.merge(snapshot.epoch, missing):
            return snapshot
        log.info("repository desired state made anew (Redis lost its data): added back %s",
                 ", ".join(sorted(n[:100] for n in missing))[:1000])  # fmt: skip
        merged = await self.state.read()
        if merged is None:
            raise Unavailable("the cluster's desired state was lost again; try again")
        return merged

    def _same(self, name: str, spec: Spec, snapshot: Snapshot) -> bool:
        """Whether a record made anew (a new epoch: Redis lost the old one) wants `name` as it
        is loaded here already, so it is not loaded again."""
        if self.desired is None or snapshot.epoch == self.desired.epoch:
            return False
        old = self.desired.models.get(name)
        return (old is not None and self.here.get(name) == old.stamp
                and (old.config, dict(old.files)) == (spec.config, dict(spec.files)))  # fmt: skip

    def _stray(self, snapshot: Snapshot) -> list[str]:
        """Models this replica serves (or tried) that the record does not want."""
        return [name for name in self.repository.names()
                if name not in snapshot.models and self._serving(name, tried=True)]  # fmt: skip

    def _serving(self, name: str, tried: bool = False) -> bool:
        """Whether a version of `name` is ready here (`tried`: or failed, not unloaded)."""
        if name not in self.repository:
            return False
        if tried and self.repository.error(name) is not None:
            return True
        return any(entry.ready or (tried and entry.error not in (None, UNLOADED))
                   for entry in self.repository.versions(name).values())  # fmt: skip

    def _seed(self) -> dict[str, Spec]:
        """What this replica serves from its folders (with the config override it loaded
        them with): the record made when there is none. Models sent whole are left out: their
        files lived in the store only."""
        specs = {}
        for name in self.repository.names():
            if not self._serving(name):
                continue
            loaded = self.desired.models.get(name) if self.desired is not None else None
            if loaded is None or not loaded.files:
                specs[name] = Spec(loaded.config if loaded is not None else None)
        return specs


def cluster_repository(cluster: Cluster | None, plane: DataPlane, repository: ModelRepository,
                       settings: Settings) -> ClusterRepository | None:  # fmt: skip
    """The cluster's repository control: in cluster mode with explicit model control and a
    repository (poll mode follows its own folder on each replica; mode none never changes)."""
    if cluster is None or settings.model_control_mode != "explicit" or repository.root is None:
        return None
    return ClusterRepository(cluster, plane, repository, settings)
