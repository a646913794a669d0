"""What the V2 routes need of a model, whatever runs it (an operator version, a graph)."""

from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager
from typing import Any, Protocol

import numpy as np

from api_schemas.v2 import Parameter
from service.errors import InvalidInput, listed
from service.kernels.context import KernelContext

RESERVED_PARAMETERS = frozenset({"binary_data_output", "priority", "timeout", "headers",
                                 "sequence_id", "sequence_start", "sequence_end"})  # fmt: skip
"""Request parameters of the protocol and of Triton (its kReservedParameterKeys), not meant for
the model's own use: the binary extension reads binary_data_output, sequence batching the
sequence ones (a model without it ignores them, as Triton does), priority and timeout the
dynamic batcher's queue (core/batch_policy.py; other models ignore them), and headers are
accepted and ignored."""


class V2Model(Protocol):
    """One version of a V2 model."""

    name: str
    version: int
    # what refusals start with: an operator version's name ("Tile-13: inputs.repeats: ..."),
    # None for repository models (their refusals are Triton's texts, which name the model)
    label: str | None

    @property
    def inline(self) -> bool:
        """Whether a small request may run on the event loop now: kernels that size their
        outputs first, or a quick model on onnxruntime (engines/onnxruntime/inline.py)."""

    @property
    def max_batch_size(self) -> int:
        """> 0: every tensor has a leading batch dimension of at most this."""

    @property
    def plan(self) -> Any:
        """The model's sequence batching plan (runtime/sequence_plan.py); None: no sequences."""

    def batch_size(self, inputs: Mapping[str, np.ndarray]) -> int:
        """Inferences in a request (its batch for a batching model, else one)."""

    def serving(self) -> AbstractContextManager[None]:
        """Held while a request runs on the model (an unloaded version drains first)."""

    @property
    def ready(self) -> bool:
        """Whether the model takes inference requests."""

    @property
    def reason(self) -> str | None:
        """Why the model is not ready (None when it is)."""

    def labels(self, output: str) -> Sequence[str] | None:
        """The class labels of an output (its configuration's label_filename), if any."""

    def metadata(self) -> dict[str, Any]:
        """The body of `GET /v2/models/{name}[/versions/{v}]` (api_schemas.v2.ModelMetadata)."""

    def config(self) -> dict[str, Any]:
        """The body of `GET /v2/models/{name}[/versions/{v}]/config` (Triton's ModelConfig)."""

    def infer(
        self,
        inputs: Mapping[str, np.ndarray],
        parameters: Mapping[str, Parameter],
        outputs: Sequence[str] | None,
        ctx: KernelContext,
        turn: Any = None,
    ) -> dict[str, np.ndarray]:
        """Run on decoded inputs; the outputs asked for (all when None), in that order. `turn`:
        a sequence model's turn (its controls and state), for models with a plan."""


def model_parameters(parameters: Mapping[str, Parameter]) -> dict[str, Parameter]:
    """The request parameters meant for the model (the reserved ones left out); keys starting
    with triton_ are Triton's own, refused with its text."""
    meant = {}
    for key, value in parameters.items():
        if key.startswith("triton_"):
            raise InvalidInput("parameter keys starting with 'triton_' are reserved for Triton "
                               "usage and should not be specified.")  # fmt: skip
        if key not in RESERVED_PARAMETERS:
            meant[key] = value
    return meant


def select_outputs(
    produced: dict[str, np.ndarray], wanted: Sequence[str] | None
) -> dict[str, np.ndarray]:
    """The outputs asked for, in the order asked; an unknown name is refused (400)."""
    if wanted is None:
        return produced
    unknown = [name for name in wanted if name not in produced]
    if unknown:
        raise InvalidInput(f"no output {unknown[0][:100]!r}; the outputs are "
                           f"{listed(list(produced))}", loc=("outputs",))  # fmt: skip
    return {name: produced[name] for name in dict.fromkeys(wanted)}
