"""The response cache of a cluster (core/response_cache.py's store): entries in the cluster's
Redis, so a request answered on one replica is a hit on every other.

An entry is `cache:<key hex>`, its arrays in one value (a JSON header of names, datatypes and
shapes, then each array's binary tensor data), kept OPSERVE_RESPONSE_CACHE_SECONDS (Redis
expires it). What all entries hold together stays within OPSERVE_RESPONSE_CACHE_BYTES: a ledger
(`cache-index`, a sorted set by the time an entry was written, and `cache-sizes`, their bytes)
drops the oldest entries first, in the one script that writes an entry. A Redis away or full
makes a request uncached, never failed: a lookup is a miss and a write is skipped; after a
failure the store is left alone for a second, so a Redis away costs a request one timeout at
most once a second."""

import json
import logging
import time
from typing import Any

from service.cluster.store import ClusterStore, ClusterUnreachable
from service.codecs.dtypes import element_type_of
from service.codecs.limits import Limits
from service.codecs.v2_binary import decode_binary, encode_binary
from service.codecs.v2_types import datatype_of, from_datatype
from service.core.response_cache import Arrays
from service.errors import ServiceError

log = logging.getLogger("opserve")
AWAY_SECONDS = 1.0
"""How long the cache leaves Redis alone after a call failed."""
PRUNE = 64
"""Most expired entries taken out of the ledger by one write (bounds the script's time)."""

# KEYS: the entry, the index, the sizes, the total. ARGV: the value, its size, now (ms), the
# expiry (ms), the cap, the most expired entries to prune. Expired entries leave the ledger, then the oldest ones until it fits.
_PUT = """
local function drop(member)
  local size = tonumber(redis.call('HGET', KEYS[3], member) or '0')
  redis.call('HDEL', KEYS[3], member)
  redis.call('ZREM', KEYS[2], member)
  redis.call('DEL', member)
  redis.call('DECRBY', KEYS[4], size)
end
local now, ttl, cap, size = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[2])
for _, member in ipairs(redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now - ttl, 'LIMIT', 0, tonumber(ARGV[6]))) do
  drop(member)
end
if redis.call('HEXISTS', KEYS[3], KEYS[1]) == 1 then drop(KEYS[1]) end
while tonumber(redis.call('GET', KEYS[4]) or '0') + size > cap do
  local oldest = redis.call('ZRANGE', KEYS[2], 0, 0)
  if #oldest == 0 then break end
  drop(oldest[1])
end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ttl)
redis.call('ZADD', KEYS[2], now, KEYS[1])
redis.call('HSET', KEYS[3], KEYS[1], size)
redis.call('INCRBY', KEYS[4], size)
return 1
"""


class RedisCache:
    """Entries in the cluster store: at most `total_bytes` together, each `seconds` long."""

    def __init__(self, store: ClusterStore, total_bytes: int, seconds: float,
                 limits: Limits) -> None:  # fmt: skip
        self.store = store
        self.total_bytes = total_bytes
        self.ttl_ms = max(1, round(seconds * 1000))
        self.limits = limits
        self.away_until = 0.0
        self._put = store.script(_PUT)
        self.ledger = [store.key(kind) for kind in ("cache-index", "cache-sizes", "cache-total")]

    def key(self, key: bytes) -> str:
        return self.store.key("cache", key.hex())

    async def get(self, key: bytes) -> Arrays | None:
        if time.monotonic() < self.away_until:  # away a moment ago: not asked again yet
            return None
        value = await self._call(self.store.redis.get(self.key(key)))
        if not value:
            return None
        try:
            return unpack(value, self.limits)
        except (ValueError, TypeError, KeyError, ServiceError) as exc:
            log.warning("response cache entry left out: unreadable (%s)", str(exc)[:200])
            return None

    async def put(self, key: bytes, arrays: Arrays, nbytes: int) -> None:
        if nbytes > self.total_bytes or time.monotonic() < self.away_until:
            return
        value = pack(arrays)
        now_ms = round(time.time() * 1000)
        args: list[bytes | int] = [value, len(value), now_ms, self.ttl_ms, self.total_bytes, PRUNE]
        await self._call(self._put(keys=[self.key(key), *self.ledger], args=args))

    async def _call(self, pending: Any) -> Any:
        """The call's answer, or None when Redis is away."""
        try:
            return await self.store.call(pending)
        except ClusterUnreachable:  # uncached, not failed (the store logged why)
            self.away_until = time.monotonic() + AWAY_SECONDS
            return None


def pack(arrays: Arrays) -> bytes:
    """The arrays as one value: a 4-byte header length, the JSON header, then the data."""
    header, data = [], []
    for name, array in arrays.items():
        raw = bytes(encode_binary(array))
        header.append([name, datatype_of(element_type_of(array)), list(array.shape), len(raw)])
        data.append(raw)
    head = json.dumps(header, separators=(",", ":")).encode()
    return b"".join((len(head).to_bytes(4, "little"), head, *data))


def unpack(value: bytes, limits: Limits) -> Arrays:
    """The arrays of a value written by `pack` (checked: a value under our prefix may be
    anyone's)."""
    view = memoryview(value)
    length = int.from_bytes(view[:4], "little")
    header = json.loads(bytes(view[4 : 4 + length]))
    offset = 4 + length
    arrays: Arrays = {}
    for name, datatype, shape, size in header:
        if not isinstance(size, int) or size < 0 or offset + size > len(view):
            raise ValueError("an array's data runs past the entry")
        array = decode_binary(from_datatype(datatype), shape, view[offset : offset + size],
                              limits)  # fmt: skip
        if array.flags.writeable:
            array.flags.writeable = False
        arrays[str(name)] = array
        offset += size
    if offset != len(view):
        raise ValueError("bytes after the entry's last array")
    return arrays
