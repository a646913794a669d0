"""The tests' folder for what is slow to make and the same from run to run (OPSERVE_TEST_CACHE,
~/.cache/opserve-tests), and a lock so that parallel test processes make each thing once."""

import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

CACHE = Path(os.environ.get("OPSERVE_TEST_CACHE", Path.home() / ".cache" / "opserve-tests"))


@contextmanager
def locked(name: str) -> Iterator[Path]:
    """The cache folder, held under the lock `name` (one per thing made) until the block ends."""
    CACHE.mkdir(parents=True, exist_ok=True)
    with open(CACHE / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield CACHE
