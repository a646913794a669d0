"""The repository's desired state in Redis: which models the cluster serves, each with its
config override and the digests of its `file:` contents (blobs.py), and a generation number
that every change bumps. One record for the cluster, changed only by the Lua scripts below, so
two replicas changing it at once never lose each other's change.

Keys (under `opserve:<cluster name>:`):
- `repo:state` hash: `epoch` (random, set when the record is made: a Redis that lost its data
  and got a new record has a new epoch) and `generation`;
- `repo:models` hash: model name -> its spec, JSON `{"config": text|null, "files": {path:
  sha256}, "stamp": generation of its last load}`;
- `repo:refs` hash: blob digest -> how many specs name it (blobs are deleted at 0);
- `repo:sent` hash: model name -> the bytes of the files its spec names, and `#` their total,
  held at OPSERVE_MAX_SENT_MODEL_BYTES over the cluster (a write past it is refused, 413,
  and the blobs its load uploaded go at once);
- `repo:removed` hash: models unloaded within the reseed window (it expires at its end);
- channel `repo:changed`: `<epoch>:<generation>` after each change (a wake-up, never the only
  source of truth: replicas read the record on a timer too).
"""

import json
import secrets
from collections.abc import Mapping
from dataclasses import dataclass, field

from service.cluster.store import ClusterStore, ClusterUnreachable
from service.errors import PayloadTooLarge

# the start of each script below: Redis's time, and the end of the reseed window
_NOW = """
local now = redis.call('TIME')
local ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
local open_until = tonumber(redis.call('HGET', KEYS[1], 'open_until') or '0')
"""
# KEYS: state, models, refs, sent, removed; ARGV: epoch, name, spec JSON ('' = remove), blob key prefix,
# channel, the bytes of the spec's files, the most all specs' may hold, then its digests
_WRITE = """
if redis.call('HGET', KEYS[1], 'epoch') ~= ARGV[1] then
  return redis.error_reply('the desired state was replaced (Redis lost its data); try again')
end
local old_sent = tonumber(redis.call('HGET', KEYS[4], ARGV[2]) or '0')
local new_sent = (ARGV[3] ~= '' and tonumber(ARGV[6])) or 0
local sent = tonumber(redis.call('HGET', KEYS[4], '#') or '0') - old_sent + new_sent
if new_sent > old_sent and sent > tonumber(ARGV[7]) then
  for i = 8, #ARGV do  -- the load's uploads that no spec names: gone now, not in 10 minutes
    if redis.call('HEXISTS', KEYS[3], ARGV[i]) == 0 then redis.call('DEL', ARGV[4] .. ARGV[i]) end
  end
  return redis.error_reply('SENTFULL ' .. sent)
end
if new_sent > 0 then redis.call('HSET', KEYS[4], ARGV[2], new_sent)
else redis.call('HDEL', KEYS[4], ARGV[2]) end
redis.call('HSET', KEYS[4], '#', sent)
for i = 8, #ARGV do
  if redis.call('EXISTS', ARGV[4] .. ARGV[i]) == 0 then
    return redis.error_reply('a file of the load is gone from the store; try again')
  end
end
local generation = redis.call('HINCRBY', KEYS[1], 'generation', 1)
for i = 8, #ARGV do
  redis.call('HINCRBY', KEYS[3], ARGV[i], 1)
  redis.call('PERSIST', ARGV[4] .. ARGV[i])
end
local old = redis.call('HGET', KEYS[2], ARGV[2])
-- an entry that is no spec (written by hand: replicas report it failing) names no blob we
-- counted; it must not make its model's every load and unload fail
local ok, found = pcall(cjson.decode, old or 'null')
local files = ok and type(found) == 'table' and type(found.files) == 'table' and found.files or {}
if old then
  for _, digest in pairs(files) do
    if type(digest) == 'string' and redis.call('HINCRBY', KEYS[3], digest, -1) <= 0 then
      redis.call('HDEL', KEYS[3], digest)
      redis.call('DEL', ARGV[4] .. digest)
    end
  end
end
if ARGV[3] == '' then
  redis.call('HDEL', KEYS[2], ARGV[2])
  if ms < open_until then  -- a merge of the reseed window must not bring it back
    redis.call('HSET', KEYS[5], ARGV[2], generation)
    redis.call('PEXPIREAT', KEYS[5], open_until)
  end
else
  redis.call('HDEL', KEYS[5], ARGV[2])
  local spec = cjson.decode(ARGV[3])
  spec.stamp = generation
  redis.call('HSET', KEYS[2], ARGV[2], cjson.encode(spec))
end
redis.call('PUBLISH', ARGV[5], ARGV[1] .. ':' .. generation)
return generation
"""
# KEYS: state, models, refs, sent, removed; ARGV: epoch, channel, reseed window ms, then name,
# spec JSON pairs (no files)
_SEED = """
if redis.call('HEXISTS', KEYS[1], 'epoch') == 1 then return 0 end
redis.call('DEL', KEYS[2], KEYS[3], KEYS[4], KEYS[5])
redis.call('HSET', KEYS[1], 'epoch', ARGV[1], 'generation', 1,
           'open_until', ms + tonumber(ARGV[3]))
for i = 4, #ARGV, 2 do
  local spec = cjson.decode(ARGV[i + 1])
  spec.stamp = 1
  redis.call('HSET', KEYS[2], ARGV[i], cjson.encode(spec))
end
redis.call('PUBLISH', ARGV[2], ARGV[1] .. ':1')
return 1
"""
# KEYS: state, models, refs, sent, removed; ARGV: epoch, channel, then name, spec JSON pairs (no
# files): those the record lacks and did not remove, added in one new generation while the
# reseed window is open; how many were added
_MERGE = """
if redis.call('HGET', KEYS[1], 'epoch') ~= ARGV[1] or ms >= open_until then return 0 end
local added, generation = 0, 0
for i = 3, #ARGV, 2 do
  if redis.call('HEXISTS', KEYS[2], ARGV[i]) == 0 and redis.call('HEXISTS', KEYS[5], ARGV[i]) == 0 then
    if added == 0 then generation = redis.call('HINCRBY', KEYS[1], 'generation', 1) end
    local spec = cjson.decode(ARGV[i + 1])
    spec.stamp = generation
    redis.call('HSET', KEYS[2], ARGV[i], cjson.encode(spec))
    added = added + 1
  end
end
if added > 0 then redis.call('PUBLISH', ARGV[2], ARGV[1] .. ':' .. generation) end
return added
"""


@dataclass(frozen=True)
class Spec:
    """One desired model: its config override (None: its folder's), its files (path ->
    sha256 of the contents), and `stamp`, the generation that last loaded it (a load again
    with the same parameters gets a new stamp, so every replica loads it again)."""

    config: str | None = None
    files: Mapping[str, str] = field(default_factory=dict)
    stamp: int = 0
    error: str | None = None  # a value in Redis that is no spec (written by hand)

    def json(self) -> str:
        return json.dumps({"config": self.config, "files": dict(self.files)})


@dataclass(frozen=True)
class Snapshot:
    """The record as read at one moment: `version` is (epoch, generation)."""

    epoch: str
    generation: int
    models: Mapping[str, Spec]

    @property
    def version(self) -> tuple[str, int]:
        return (self.epoch, self.generation)


class DesiredState:
    """Reads and changes the record (every call through the store: unreachable -> 503)."""

    def __init__(self, store: ClusterStore, merge_seconds: float = 30.0) -> None:
        self.store = store
        self.merge_ms = max(1, round(merge_seconds * 1000))  # the reseed window
        self.keys = [store.key("repo", "state"), store.key("repo", "models"),
                     store.key("repo", "refs"), store.key("repo", "sent"),
                     store.key("repo", "removed")]  # fmt: skip
        self.channel = store.key("repo", "changed")
        self.blob_prefix = store.key("repo", "blob") + ":"
        self._write = store.script(_NOW + _WRITE)
        self._seed = store.script(_NOW + _SEED)
        self._merge = store.script(_NOW + _MERGE)

    async def version(self) -> tuple[str, int] | None:
        """(epoch, generation) of the record, or None when there is no record."""
        found = self.store.redis.hmget(self.keys[0], ["epoch", "generation"])
        epoch, generation = await self.store.call(found)
        return None if epoch is None else (_text(epoch), int(generation or 0))

    async def read(self) -> Snapshot | None:
        """The whole record, in one transaction; None when there is none."""
        async with self.store.redis.pipeline(transaction=True) as pipe:
            pipe.hgetall(self.keys[0])
            pipe.hgetall(self.keys[1])
            state, models = await self.store.call(pipe.execute())
        state = {_text(k): _text(v) for k, v in state.items()}
        if "epoch" not in state:
            return None
        specs = {_text(name): _spec(_text(value)) for name, value in models.items()}
        return Snapshot(state["epoch"], int(state.get("generation", 0)), specs)

    async def seed(self, specs: Mapping[str, Spec]) -> None:
        """Make the record with `specs` (files none) unless one exists (the first replica's
        start-up models, or what a replica serves when Redis lost the record)."""
        flat = [item for name, spec in specs.items() for item in (name, spec.json())]
        args = [secrets.token_hex(8), self.channel, str(self.merge_ms), *flat]
        await self.store.call(self._seed(keys=self.keys, args=args))

    async def merge(self, epoch: str, specs: Mapping[str, Spec]) -> int:
        """Add to record `epoch`, made anew, the `specs` (files none) it lacks and did not
        remove, while its reseed window is open; how many were added."""
        flat = [item for name, spec in specs.items() for item in (name, spec.json())]
        args = [epoch, self.channel, *flat]
        return int(await self.store.call(self._merge(keys=self.keys, args=args)))

    async def write(self, epoch: str, name: str, spec: Spec | None, sent: int = 0,
                    most_sent: int = 0) -> int:  # fmt: skip
        """Set (or with None remove) one model's spec in record `epoch`, its blobs (`sent`
        bytes) uploaded already; the new generation, announced on the channel. PayloadTooLarge
        when the specs' files would hold more than `most_sent` bytes over the cluster."""
        digests = list(spec.files.values()) if spec is not None else []
        text = spec.json() if spec is not None else ""
        args: list[str | int] = [epoch, name, text, self.blob_prefix, self.channel, sent,
                                 most_sent, *digests]  # fmt: skip
        try:
            return int(await self.store.call(self._write(keys=self.keys, args=args)))
        except ClusterUnreachable as exc:
            if not exc.cause.startswith("SENTFULL "):
                raise
            total = exc.cause.split()[1]
            raise PayloadTooLarge(f"failed to load '{name[:100]}': the models sent whole to the "
                                  f"cluster would hold {total} bytes, over the limit of "
                                  f"{most_sent} (OPSERVE_MAX_SENT_MODEL_BYTES, counted over "
                                  "the cluster); unload one first") from None  # fmt: skip


def _spec(text: str) -> Spec:
    """A spec as stored; a value that is none (written by hand) is a spec with an `error`,
    whose load each replica reports failing."""
    try:
        found = json.loads(text)
        files = found.get("files") or {}
        if not isinstance(files, dict):  # cjson writes an empty object as {} (or [])
            files = {}
        config = found.get("config")
        return Spec(config if isinstance(config, str) else None,
                    {str(k): str(v) for k, v in files.items()}, int(found.get("stamp", 0)))  # fmt: skip
    except (ValueError, AttributeError, TypeError):
        return Spec(error=f"the desired state holds no spec for it: {text[:100]!r}")


def _text(item: bytes | str) -> str:
    return item.decode() if isinstance(item, bytes) else item
