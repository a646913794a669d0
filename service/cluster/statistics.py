"""Statistics of the cluster: the stats call (HTTP /v2/models/.../stats, gRPC ModelStatistics)
answers the sum over the live members of every count, whichever replica it reaches.

Each process writes its own **absolute totals**, never deltas, from a timer a few times a second
(OPSERVE_CLUSTER_STATISTICS_SECONDS), never on a request's path: one hash per member,
`stats:<member id>`, one field per model version holding that version's totals, expiring with
the member's heartbeat (three heartbeats). Totals rather than HINCRBY deltas because a write
whose answer was lost (a timeout after Redis applied it) is simply written again: the same
totals, or newer ones, never counted twice; and because the sum over *live* members is then
exact by construction: a member that died (SIGKILL) leaves the sum once its heartbeat runs out,
as its registration does, whereas deltas folded into one shared hash could never be taken out.
A process's own counts are read from its memory, so a client sees its own requests at once
through the replica that served them; another replica's arrive within one flush.

While Redis is away the stats call answers 503 / UNAVAILABLE (ClusterUnreachable's text): the
process's own counts alone would look like the cluster's and drop, then jump back, under a
dashboard; Triton's answer has no place to mark them partial. /metrics stays per replica and
answers throughout."""

import asyncio
import contextlib
import json
import logging
from typing import Any
from urllib.parse import quote

from service.cluster.members import Membership
from service.cluster.store import ClusterFull, ClusterStore, ClusterUnreachable
from service.cluster.timer import repeat
from service.core.statistics import PHASES, ModelStatistics, Statistics

log = logging.getLogger("opserve")
Version = tuple[str, str]  # (model name, version)
# KEYS[1] a member's statistics hash; ARGV[1] its expiry (ms); ARGV[2] 1: write even when the
# hash is gone; then field, value pairs. 0, nothing written, when the hash is gone and ARGV[2] is
# 0 (the caller then sends every version's totals). HSET per pair: unpack() has a size limit.
_FLUSH = """
if ARGV[2] == '0' and redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
for i = 3, #ARGV, 2 do redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 1]) end
redis.call('PEXPIRE', KEYS[1], ARGV[1])
return 1
"""


class ClusterStatistics:
    """This process's `local` counts, written to the cluster store every `interval` seconds,
    and the stats call's reports summed over the live members."""

    def __init__(self, store: ClusterStore, members: Membership, local: Statistics,
                 interval: float) -> None:  # fmt: skip
        self.store = store
        self.members = members
        self.local = local
        self.interval = interval
        self._flushed: dict[Version, int] = {}  # per version: its requests counted when written
        self._task: asyncio.Task[None] | None = None
        self._flush = store.script(_FLUSH)
        # the last write's failure (None: it went through): while this process's totals cannot
        # be written (a Redis full refuses writes), the others' cannot either, and a sum would
        # soon be this replica's counts alone
        self.unwritten: ClusterUnreachable | None = None  # its last failure to write

    @property
    def ttl_ms(self) -> int:
        """The member's own lifetime (three heartbeats), or three flushes when longer."""
        return max(self.members.ttl_ms, round(self.interval * 3000))

    def key(self, member_id: str) -> str:
        return self.store.key("stats", member_id)

    # --- writing: from the timer ---

    async def flush(self) -> None:
        """Write the totals of every version counted since the last write (of all of them when
        this member's hash is gone: expired while Redis was away, or lost by a Redis restarted
        without persistence) and refresh the hash's expiry."""
        try:
            await self._flush_changed()
        except ClusterUnreachable as exc:
            self.unwritten = exc
            raise
        self.unwritten = None

    async def _flush_changed(self) -> None:
        if not await self._write(self._changed(everything=False), everything=False):
            changed = self._changed(everything=True)
            if changed:
                await self._write(changed, everything=True)

    def _changed(self, everything: bool) -> dict[Version, tuple[int, str]]:
        """(marker, encoded totals) of the versions to write. Counts change on the event loop
        only, and this runs on it without awaiting: the totals are one consistent snapshot."""
        found = {}
        for version, stats in self.local.models.items():
            # grows with every request counted (a hit adds to success only; a miss's cache
            # time is counted after its success)
            marker = (stats.execution_count + stats.success[0] + stats.fail[0]
                      + stats.cache_misses[0])  # fmt: skip
            if everything or self._flushed.get(version) != marker:
                found[version] = (marker, json.dumps(_totals(stats), separators=(",", ":")))
        return found

    async def _write(self, changed: dict[Version, tuple[int, str]], everything: bool) -> bool:
        """Write `changed` in one script call; False (nothing written) when the hash is gone
        and not `everything` was sent."""
        args: list[str | int] = [self.ttl_ms, int(everything)]
        for version, (_, text) in changed.items():
            args += (_field(*version), text)
        keys = [self.key(self.members.id)]
        if not await self.store.call(self._flush(keys=keys, args=args)):
            return False
        self._flushed.update((version, marker) for version, (marker, _) in changed.items())
        return True

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="cluster-statistics")

    async def _run(self) -> None:
        # a store away: written again at the next turn
        await repeat(self.flush, self.interval, "statistics write", first_wait=True)

    async def stop(self) -> None:
        """Stop writing and take this member's totals out (best effort: they expire anyway)."""
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        with contextlib.suppress(ClusterUnreachable):
            await self.store.call(self.store.redis.delete(self.key(self.members.id)))

    # --- reading: the stats call ---

    async def reports(self, versions: list[Version]) -> list[dict[str, Any]]:
        """Triton's `model_stats` entry of each version: every count summed over the live
        members (this one's from memory), `last_inference` the latest. ClusterUnreachable
        (503 / UNAVAILABLE) when Redis does not answer, or refuses this process's writes."""
        if isinstance(self.unwritten, ClusterFull):  # (a store away fails the reads below)
            refused = type(self.unwritten)(f"{self.unwritten}: the cluster's statistics cannot "
                                           "be summed while the replicas' counts are not "
                                           "written to it")  # fmt: skip
            raise refused
        others = [m for m in await self.members.live() if m != self.members.id]
        rows: list[list[bytes | None]] = []
        if others and versions:
            pipe = self.store.redis.pipeline(transaction=False)
            fields = [_field(*version) for version in versions]
            for member in others:
                pipe.hmget(self.key(member), fields)
            rows = await self.store.call(pipe.execute())
        answers = []
        for column, (name, version) in enumerate(versions):
            total = ModelStatistics()
            local = self.local.models.get((name, version))
            if local is not None:
                _add(total, _totals(local))
            for member, row in zip(others, rows, strict=True):
                stored = row[column]
                if stored is not None:
                    _add_stored(total, stored, member)
            answers.append(total.report(name, version))
        return answers


def _field(name: str, version: str) -> str:
    """A version's field in a member's hash (quoted: no name reaches another's field)."""
    return f"{quote(name, safe='')}:{quote(version, safe='')}"


def _totals(stats: ModelStatistics) -> dict[str, Any]:
    """Every count of one version, as written to the store."""
    return {"last": stats.last_inference, "inferences": stats.inference_count,
            "executions": stats.execution_count, "success": stats.success, "fail": stats.fail,
            **{phase: stats.phases[phase] for phase in PHASES},
            "cache_hit": stats.cache_hits, "cache_miss": stats.cache_misses,
            "batches": {str(size): counts for size, counts in stats.batches.items()}}  # fmt: skip


def _add(total: ModelStatistics, totals: dict[str, Any]) -> None:
    """Add one member's totals of a version to `total` (last_inference: the latest)."""
    total.last_inference = max(total.last_inference, _count(totals["last"]))
    total.inference_count += _count(totals["inferences"])
    total.execution_count += _count(totals["executions"])
    for pair, name in ((total.success, "success"), (total.fail, "fail"),
                       *((total.phases[phase], phase) for phase in PHASES)):  # fmt: skip
        _add_pair(pair, totals[name], 2)
    for pair, name in ((total.cache_hits, "cache_hit"), (total.cache_misses, "cache_miss")):
        _add_pair(pair, totals.get(name, [0, 0]), 2)  # a replica older than the cache has none
    for size, counts in totals["batches"].items():
        batch = total.batches.setdefault(_count(int(size)), [0, 0, 0, 0])
        _add_pair(batch, counts, 4)


def _add_stored(total: ModelStatistics, stored: bytes, member: str) -> None:
    """Add totals read from the store; a value that is not ours (written by hand, or by another
    program under our prefix) is left out with a warning, never a 500."""
    one = ModelStatistics()  # decoded whole first: a bad value adds nothing at all
    try:
        _add(one, json.loads(stored))
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        log.warning("cluster statistics of member %s left out: unreadable (%s)", member, exc)
        return
    _add(total, _totals(one))


def _add_pair(into: list[int], counts: Any, length: int) -> None:
    if not isinstance(counts, list) or len(counts) != length:
        raise ValueError(f"expected {length} counts, got {str(counts)[:40]}")
    for i, count in enumerate(counts):
        into[i] += _count(count)


def _count(value: Any) -> int:
    if type(value) is not int or value < 0:
        raise ValueError(f"not a count: {str(value)[:40]}")
    return value
