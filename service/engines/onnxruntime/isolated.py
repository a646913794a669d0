"""A client's model on onnxruntime: checked in the server, opened and run only in the isolated
worker processes (service/engines/workers/).

Where a model's bytes came from decides where it runs: a model a client sent (posted to
/v1/models/run, or loaded with `file:` contents) reaches onnxruntime's native kernels with
values and shapes the client chose, and no screen of those kernels is ever complete (an
integer division that raises SIGFPE, a Loop that ignores its stop, a kernel that spins). So
its session exists only in a worker: a crash, a hang or a swell there costs its own run (the
worker is killed and replaced), never the server. The server keeps what it needs to check a
request and answer it: the graph's inputs and outputs, the initializers' names (optional
inputs) and the nodes' reports; the worker opens the bytes once and keeps the session, by
digest (workers/run.py).
"""

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from service.engines.onnxruntime.differs import differs
from service.engines.onnxruntime.opened import initializer_names, node_reports
from service.engines.onnxruntime.session import Unsupported, check_types
from service.engines.workers.on_loop import InWorker
from service.errors import InvalidInput, ServiceError
from service.kernels.context import KernelContext
from service.runtime.digest import model_digest
from service.runtime.graph import LoadedModel, RunResult
from service.runtime.plan import checked, graph_specs
from service.runtime.steps import NodeReport
from service.settings import Settings

ENGINE = "onnxruntime"
"""What the worker opens the bytes with (workers/run.py), and the engine a client sees."""


@dataclass(frozen=True)
class IsolatedOrtModel(LoadedModel):
    """A model whose every run goes whole to an isolated worker, on onnxruntime."""

    reports: tuple[NodeReport, ...] = ()

    @property
    def engine(self) -> str:
        return ENGINE

    @property
    def isolated(self) -> bool:
        return True

    @property
    def inline(self) -> bool:
        """A small request is decoded and answered on the event loop, which awaits the
        worker's run (workers/on_loop.py); nothing of the model runs in this process."""
        return True

    def run(self, inputs: Mapping[str, np.ndarray], outputs: Sequence[str] | None = None,
            *, trace: bool = False, ctx: KernelContext | None = None) -> RunResult:  # fmt: skip
        """The inputs checked here, the run in a worker (under `ctx`'s deadline and claims)."""
        if trace:
            raise InvalidInput("a trace runs on the exact engine, not onnxruntime",
                               loc=("trace",))  # fmt: skip
        control = ctx.control if ctx is not None else None
        if ctx is not None and control is None and ctx.inline_bytes is not None:
            # a small request's inline attempt: the loop sends the run and awaits the worker
            raise InWorker(self, self._feeds(inputs), self._wanted(outputs))
        if ctx is None or control is None or control.fallback is None:
            # every run of the server has a control with the pool; only a caller that made
            # its own context lands here, and it must not run the model in this process
            raise ServiceError("a client's model runs only in the isolated workers, and this "
                               "run has none")  # fmt: skip
        wanted = self._wanted(outputs)
        feeds = self._feeds(inputs)
        result: RunResult = control.fallback.run(self, feeds, wanted, False, ctx)
        result.nodes = list(self.reports)
        self._check_answer(result, ctx)
        return result


def load_isolated(data: bytes, settings: Settings) -> IsolatedOrtModel:
    """A client's model for the workers: checked as every engine checks (4xx); Unsupported
    with the reason when onnxruntime's Python binding cannot carry its inputs or outputs, or
    onnxruntime answers its nodes otherwise than the exact engine (differs.py). Nothing of
    onnxruntime runs in this process."""
    model = checked(data, settings)
    inputs, outputs = graph_specs(model)  # 422 for a graph input or output not a tensor
    check_types(model)
    why = differs(model)
    if why is not None:
        raise Unsupported(why)
    digest = model_digest(data)
    return IsolatedOrtModel(
        inputs=inputs, outputs=outputs, steps=(), initializers=initializer_names(model),
        max_graph_bytes=settings.max_graph_bytes, source=data,
        source_id=ENGINE.encode() + digest,  # a worker may hold the same bytes on both engines
        reports=node_reports(model),
    )  # fmt: skip
