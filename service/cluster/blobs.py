"""The `file:` contents of loads in Redis, content-addressed: `repo:blob:<sha256>` holds the
bytes, stored once however many loads or replicas send them. A blob is uploaded with an expiry
(it is nobody's yet) that the desired state's write removes once a spec names it
(desired_state.py counts the specs naming each blob and deletes it when none does), so an
upload whose load never gets written leaves nothing behind for long.

A replica fetches only the blobs a spec it applies names, each bounded before it is read (the
caps load_request.py applies to a load: OPSERVE_MAX_LOAD_FILES files, OPSERVE_MAX_MODEL_BYTES
together), their sizes held from the memory budget before the first is read (as a load's
files are, core/memory_budget.py), and each checked against its digest after."""

import hashlib
import re
from collections.abc import Mapping

from service.cluster.store import ClusterStore
from service.core.memory_budget import Reservation
from service.errors import BadRequest, PayloadTooLarge
from service.settings import Settings

UNCLAIMED_MS = 600_000
"""How long an uploaded blob lives before a spec names it (then it lives while one does)."""
_DIGEST = re.compile(r"[0-9a-f]{64}")


class Blobs:
    """Upload and fetch the contents of `file:` parameters by their sha256."""

    def __init__(self, store: ClusterStore, prefix: str, settings: Settings) -> None:
        self.store = store
        self.prefix = prefix  # the desired state's blob key prefix: its scripts name them too
        self.max_files = settings.max_load_files
        self.max_bytes = settings.max_model_bytes

    async def put(self, data: bytes) -> str:
        """Store `data` unless a blob of its digest is there already; its digest."""
        digest = hashlib.sha256(data).hexdigest()
        key = self.prefix + digest
        redis = self.store.redis
        if not await self.store.call(redis.exists(key)):
            await self.store.call(redis.set(key, data, px=UNCLAIMED_MS, nx=True))
        return digest

    async def fetch(self, name: str, files: Mapping[str, str],
                    held: Reservation) -> dict[str, bytes]:  # fmt: skip
        """The contents of a spec's `files` (path -> digest), bounded as a load's are and
        their sizes held in `held` before any is read: BadRequest / PayloadTooLarge naming
        what is wrong (the budget's 413, or its 503 when it stays short)."""
        if len(files) > self.max_files:
            raise BadRequest(f"the desired state of '{name[:100]}' names {len(files)} files, "
                             f"over the limit of {self.max_files} (OPSERVE_MAX_LOAD_FILES)")  # fmt: skip
        for digest in files.values():
            if not _DIGEST.fullmatch(digest):
                raise BadRequest(f"the desired state of '{name[:100]}' names a file by "
                                 f"{digest[:80]!r}, not a sha256 digest")  # fmt: skip
        sizes = await self._sizes(list(files.values()))
        if sum(sizes) > self.max_bytes:
            raise PayloadTooLarge(f"the files of '{name[:100]}' hold {sum(sizes)} bytes, over "
                                  f"the limit of {self.max_bytes} (OPSERVE_MAX_MODEL_BYTES)")  # fmt: skip
        await held.grow(sum(sizes))
        fetched = {}
        for path, digest in files.items():
            data = await self.store.call(self.store.redis.get(self.prefix + digest))
            if not isinstance(data, bytes) or hashlib.sha256(data).hexdigest() != digest:
                raise BadRequest(f"the file '{path[:100]}' of '{name[:100]}' is gone from the "
                                 "cluster store or changed there")  # fmt: skip
            fetched[path] = data
        return fetched

    async def _sizes(self, digests: list[str]) -> list[int]:
        async with self.store.redis.pipeline(transaction=False) as pipe:
            for digest in digests:
                pipe.strlen(self.prefix + digest)
            return [int(size) for size in await self.store.call(pipe.execute())]
