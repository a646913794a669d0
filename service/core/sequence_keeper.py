"""What the data plane needs of whatever keeps sequences: one process's table (sequences.py),
or, in cluster mode, the cluster's (service/cluster/sequences.py, handed over by the app, so
the core never imports the cluster floor)."""

from collections.abc import Hashable
from typing import Any, Protocol

from service.core.sequence_request import SequenceRequest
from service.core.sequence_sweeper import Sweepable
from service.runtime.sequence_plan import SequencePlan


class SequenceKeeper(Sweepable, Protocol):
    """Turns in sequences, idle deadlines to sweep, and whether steps can be taken now."""

    @property
    def available(self) -> bool:
        """False while the sequences cannot be reached (cluster mode's store away): sequence
        models then report not ready."""
        ...

    def turn(self, model_key: Hashable, plan: SequencePlan,
             request: SequenceRequest | None) -> Any:  # fmt: skip
        """The request's turn in its sequence: an async context manager with `inputs()`,
        `keep(outputs)` and `state_outputs` (sequences.py's Turn)."""
        ...
