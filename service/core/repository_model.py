"""Repository models (service/runtime/repository.py) as V2 models.

A request is held to the model's completed configuration (the entry's `io`: Triton's input
checks and reshapes), may carry a sequence's controls and state (`turn`), and keeps the
version from being retired under it while it runs (`serving`).
"""

from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import numpy as np

from api_schemas.v2 import Parameter
from service.core.model import model_parameters
from service.errors import Unavailable
from service.kernels.context import KernelContext
from service.runtime.config.json_form import config_json

PLATFORM = "onnxruntime_onnx"  # what the completed configuration says, as Triton's


class RepositoryModel:
    """A V2 model over one version (a `RepositoryEntry`) of the model repository."""

    def __init__(self, entry: Any, versions: Sequence[int], pinned: bool = True) -> None:
        self.entry = entry
        self.name: str = entry.name
        self.version: int = entry.version
        self.versions = versions  # the model's ready versions
        self.pinned = pinned  # the request named this version (else: the newest ready one)
        self.label: str | None = None  # Triton's texts name the model themselves

    @property
    def ready(self) -> bool:
        return bool(self.entry.ready)

    @property
    def reason(self) -> str | None:
        return None if self.ready else self.entry.error or self.entry.state.lower()

    @property
    def inline(self) -> bool:
        """Whether a small request may run on the event loop: when its engine says so (a quick
        model on onnxruntime, engines/onnxruntime/inline.py). A sequence's turn never does
        (core/dataplane.py)."""
        model = self.entry.model
        return model is not None and bool(model.inline)

    @property
    def isolated(self) -> bool:
        """Whether its runs go to the isolated workers (a client's model, or the operator's
        choice: engines/choice.py)."""
        return bool(getattr(self.entry.model, "isolated", False))

    @property
    def max_batch_size(self) -> int:
        return int(self.entry.config.max_batch_size) if self.entry.config is not None else 0

    @property
    def plan(self) -> Any:
        """The model's sequence batching plan (None: it takes no sequences)."""
        return self.entry.plan

    def labels(self, output: str) -> Sequence[str] | None:
        return self.entry.labels.get(output)

    def batch_size(self, inputs: Mapping[str, np.ndarray]) -> int:
        """Inferences in a request: its batch for a batching model, else one."""
        if self.max_batch_size <= 0:
            return 1
        first = next(iter(inputs.values()), None)
        return int(first.shape[0]) if first is not None and first.ndim else 1

    def metadata(self) -> dict[str, Any]:
        """As Triton derives it from the configuration: the ready versions, its platform and
        the configured inputs and outputs (-1 batch dim first when batching)."""
        return {"name": self.name, "versions": [str(v) for v in self.versions],
                "platform": PLATFORM, **self.entry.io.metadata()}  # fmt: skip

    def config(self) -> dict[str, Any]:
        return config_json(self.entry.config)

    @property
    def unloaded(self) -> bool:
        """Whether this version was freed since it was found (unloaded, or replaced)."""
        return self.entry.model is None

    @contextmanager
    def serving(self) -> Iterator[None]:
        """While a request runs: an unloaded version stays UNLOADING until its last one ends,
        which frees it. A version freed while its request was still being read is refused."""
        entry = self.entry
        if entry.model is None:
            raise Unavailable(f"model '{self.name[:100]}' version {self.version} was unloaded "
                              "while the request arrived; try again")  # fmt: skip
        entry.active += 1
        try:
            yield
        finally:
            entry.active -= 1
            entry.drained()

    def infer(
        self,
        inputs: Mapping[str, np.ndarray],
        parameters: Mapping[str, Parameter],
        outputs: Sequence[str] | None,
        ctx: KernelContext,
        turn: Any = None,
    ) -> dict[str, np.ndarray]:
        """Triton's checks and reshapes (the configuration), the sequence's controls and state
        when `turn` is given, the graph run; the outputs asked for, in config order when none
        was named."""
        entry = self.entry
        model_parameters(parameters)  # custom ones reach it (an ONNX graph has no use for them)
        feeds = entry.io.graph_inputs(inputs)
        wanted = entry.io.output_names(outputs)
        state: tuple[str, ...] = ()
        if turn is not None:
            feeds.update(turn.inputs())
            state = tuple(n for n in turn.state_outputs if n not in wanted)
        produced = entry.model.run(feeds, [*wanted, *state], ctx=ctx).outputs
        if turn is not None:
            turn.keep(produced)
        return entry.io.client_outputs({name: produced[name] for name in wanted})
