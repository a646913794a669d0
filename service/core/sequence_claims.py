"""What live sequences hold of the process's memory: their implicit state and their table entry,
claimed from the memory budget while a sequence holds them and given back when it ends, idles
out or keeps a smaller state (sequences.py makes the claims).

Sequence state may keep at most OPSERVE_SEQUENCE_STATE_SHARE of the budget (half by default):
it stays for as long as its sequence lives, so without a cap a flood of STARTs would leave
large requests nothing; with it, they always have the rest. A START whose state cannot be
claimed now is refused (503), never made to wait: the room comes back only as sequences end.

`StateClaims` is the whole interface sequences.py needs, so a store kept elsewhere (the
cluster's, issue 26) can count its own way; `BudgetClaims` is the one-process store.
"""

import threading
from typing import Protocol

from service.core.memory_budget import MemoryBudget


class StateClaims(Protocol):
    """Claims of sequence state on some memory; every method may be called on any thread."""

    def claim(self, nbytes: int) -> bool:
        """Take `nbytes` if they are free now; never waits."""
        ...

    def release(self, nbytes: int) -> None:
        """Give back `nbytes` claimed before."""
        ...

    @property
    def held(self) -> int:
        """Bytes claimed and not given back."""
        ...

    def bound(self) -> str:
        """What bounds the claims, for a refusal's text."""
        ...


class BudgetClaims:
    """Claims on the process's memory budget, at most `share` of it."""

    def __init__(self, budget: MemoryBudget, share: float) -> None:
        self.budget = budget
        self.most = int(budget.total_bytes * share)
        self.share = share

    def claim(self, nbytes: int) -> bool:
        return nbytes <= 0 or self.budget.try_keep(nbytes, self.most)

    def release(self, nbytes: int) -> None:
        if nbytes > 0:
            self.budget.unkeep(nbytes)

    @property
    def held(self) -> int:
        return self.budget.kept

    def bound(self) -> str:
        return (f"sequences may keep {self.most} bytes, {self.share:g} of the memory budget "
                "(OPSERVE_SEQUENCE_STATE_SHARE of OPSERVE_MEMORY_BUDGET_BYTES), and requests "
                "hold the rest")  # fmt: skip


class CountedClaims:
    """Claims that are only counted, up to `most` bytes (a Sequences without a budget)."""

    def __init__(self, most: int = 1 << 62) -> None:
        self.most = most
        self._held = 0
        self._lock = threading.Lock()

    def claim(self, nbytes: int) -> bool:
        with self._lock:
            if self._held + nbytes > self.most:
                return False
            self._held += nbytes
            return True

    def release(self, nbytes: int) -> None:
        with self._lock:
            self._held -= nbytes

    @property
    def held(self) -> int:
        return self._held

    def bound(self) -> str:
        return f"sequences may keep {self.most} bytes"
