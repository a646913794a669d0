"""What the data plane needs of whatever keeps sequences: one process's table (sequences.py),
or, in cluster mode, the cluster's (service/cluster/sequences.py, handed over by the app, so
the core never imports the cluster floor)."""

from collections.abc import Hashable
from typing import Any, Protocol

from service.core.sequence_request import SequenceRequest
from service.core.sequence_resend import Resend
from service.runtime.sequence_plan import SequencePlan


class SequenceKeeper(Protocol):
    """Turns in sequences, and whether steps can be taken now. (Idle release is the keeper's
    own: this process's table is swept by the app's sweeper, sequence_sweeper.py; the
    cluster's keys expire in the store.)"""

    @property
    def available(self) -> bool:
        """False while the sequences cannot be reached (cluster mode's store away): sequence
        models then report not ready."""
        ...

    def turn(self, model_key: Hashable, plan: SequencePlan, request: SequenceRequest | None,
             resend: Resend | None = None) -> Any:  # fmt: skip
        """The request's turn in its sequence: an async context manager with `inputs()`,
        `keep(outputs)` and `state_outputs` (sequences.py's Turn); `resend` tells a resend of
        it (sequence_resend.py), for a keeper that needs to."""
        ...
