"""The floor of bench_sequences.py's cluster step: the one-process turn plus two round trips
to the same Redis (a script that only answers, before the turn and after it, through the
store's script calls as a step's scripts go), no state in Redis; what a cluster step costs on
this host whatever its scripts and bookkeeping do. With `--round-trips 1`, the call after the
turn only: what a step that read no state before its run (one round trip) would cost.

    python -m bench.floor_sequences [--round-trips 1]   (the service's flags and OPSERVE_*
                                                         settings, cluster on)
"""

import sys
from collections.abc import Hashable
from typing import Any

from service.cluster.sequences import ClusterSequences
from service.cluster.store import ClusterStore
from service.core.sequence_request import SequenceRequest
from service.core.sequence_resend import Resend
from service.core.sequences import Sequences, Turn
from service.runtime.sequence_plan import SequencePlan

_ALONE = Sequences(1000)


ROUND_TRIPS = 2


class PingTurn:
    """A one-process turn with a round trip to Redis on the way in and on the way out."""

    def __init__(self, store: ClusterStore, inner: Turn) -> None:
        self.store = store
        self.inner = inner
        self.ping = store.script("return 1")

    async def __aenter__(self) -> "PingTurn":
        if ROUND_TRIPS == 2:
            await self.store.call(self.ping())
        await self.inner.__aenter__()
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.inner.__aexit__(*exc)
        await self.store.call(self.ping())

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def _turn(self: ClusterSequences, model_key: Hashable, plan: SequencePlan,
          request: SequenceRequest | None, resend: Resend | None = None) -> PingTurn:  # fmt: skip
    return PingTurn(self.store, _ALONE.turn(model_key, plan, request))


if __name__ == "__main__":
    if "--round-trips" in sys.argv:
        at = sys.argv.index("--round-trips")
        ROUND_TRIPS = int(sys.argv[at + 1])
        del sys.argv[at : at + 2]
    ClusterSequences.turn = _turn  # type: ignore[method-assign,assignment]
    from service.__main__ import main

    main()
