"""The floor of bench_sequences.py's cluster step: the one-process turn plus two round trips
to the same Redis (PING before the turn, PING after it), no script and no state in Redis; what
a cluster step costs on this host whatever its scripts and bookkeeping do.

    python -m bench.floor_sequences   (the service's flags and OPSERVE_* settings, cluster on)
"""

from collections.abc import Hashable
from typing import Any

from service.cluster.sequences import ClusterSequences
from service.cluster.store import ClusterStore
from service.core.sequence_request import SequenceRequest
from service.core.sequence_resend import Resend
from service.core.sequences import Sequences, Turn
from service.runtime.sequence_plan import SequencePlan

_ALONE = Sequences(1000)


class PingTurn:
    """A one-process turn with a PING to Redis on the way in and on the way out."""

    def __init__(self, store: ClusterStore, inner: Turn) -> None:
        self.store = store
        self.inner = inner

    async def __aenter__(self) -> "PingTurn":
        await self.store.call(self.store.redis.ping())
        await self.inner.__aenter__()
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.inner.__aexit__(*exc)
        await self.store.call(self.store.redis.ping())

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def _turn(self: ClusterSequences, model_key: Hashable, plan: SequencePlan,
          request: SequenceRequest | None, resend: Resend | None = None) -> PingTurn:  # fmt: skip
    return PingTurn(self.store, _ALONE.turn(model_key, plan, request))


if __name__ == "__main__":
    ClusterSequences.turn = _turn  # type: ignore[method-assign,assignment]
    from service.__main__ import main

    main()
