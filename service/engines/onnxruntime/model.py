"""A model that runs on onnxruntime: the same LoadedModel to its callers (inputs checked against
the graph, outputs bounded and claimed), one `session.run` inside.

Held to the exact engine's bounds: the run's peak memory is estimated before it runs
(onnxruntime/memory.py), refused over OPSERVE_MAX_GRAPH_BYTES (413) and claimed from the request's
reservation while it runs; its outputs are claimed at their real size once it returns; the
run is stopped at its deadline, or when its client leaves or the server shuts down, through
RunOptions.terminate (onnxruntime/stop.py). A small request to a quick model runs inline, on a
leash (onnxruntime/inline.py).
"""

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from time import perf_counter_ns
from typing import Any

import numpy as np

from service.engines.onnxruntime.inline import HELD_SECONDS, LEASH_SECONDS, InlineGate
from service.engines.onnxruntime.memory import MemoryPlan
from service.engines.onnxruntime.resident import PEAKS
from service.engines.onnxruntime.session import reason
from service.engines.onnxruntime.stop import STOPPER
from service.errors import InvalidInput, PayloadTooLarge, RunTimeout, located, shown_int
from service.kernels.context import InlineAttempt, KernelContext, RunOffLoop
from service.runtime import engine_time
from service.runtime.graph import LoadedModel, RunResult
from service.runtime.run_control import RunControl
from service.runtime.steps import NodeReport

RUNNING = "the onnxruntime session"  # what a 504 says the run was stopped at


@dataclass(frozen=True)
class OrtModel(LoadedModel):
    """A model whose runs go to one onnxruntime InferenceSession (thread-safe for runs)."""

    session: Any = field(default=None, repr=False)
    memory: MemoryPlan | None = field(default=None, repr=False)
    reports: tuple[NodeReport, ...] = ()  # the graph's nodes, each ran_on "onnxruntime"
    gate: InlineGate = field(default_factory=InlineGate, repr=False, compare=False)  # gate_for

    @property
    def engine(self) -> str:
        return "onnxruntime"

    @property
    def inline(self) -> bool:
        """Whether a small request may run on the event loop now (onnxruntime/inline.py)."""
        return self.gate.open

    def run(self, inputs: Mapping[str, np.ndarray], outputs: Sequence[str] | None = None,
            *, trace: bool = False, ctx: KernelContext | None = None) -> RunResult:  # fmt: skip
        """Run the session for the requested outputs (all graph outputs by default), under the
        request's `ctx` (its claims, its control); no trace (the exact engine shows nodes)."""
        if trace:
            raise InvalidInput("a trace runs on the exact engine, not onnxruntime",
                               loc=("trace",))  # fmt: skip
        ctx = ctx or KernelContext(self.max_graph_bytes, output_format=None)
        wanted = self._wanted(outputs)
        feeds = {name: _fed(name, array) for name, array in self._feeds(inputs).items()}
        claims = ctx.claims
        if ctx.inline_bytes is not None:  # on the event loop (onnxruntime/inline.py's rules)
            produced = self._inline_run(wanted, feeds, ctx.inline_bytes, ctx.attempt)
        else:
            peak, whole = self.memory.estimate(feeds) if self.memory is not None else (0, True)
            if peak > self.max_graph_bytes:
                raise PayloadTooLarge(
                    f"the run would hold about {shown_int(peak)} bytes of intermediates on "
                    f"onnxruntime (from the inputs' shapes), over the limit of "
                    f"{self.max_graph_bytes} (OPSERVE_MAX_GRAPH_BYTES)"
                )  # fmt: skip
            if claims is not None:
                claims.claim(peak)
            # a size the estimate could not follow: what the run held is measured, kept as
            # the estimate for these inputs, and the heap trimmed after a large one
            began = None if whole or self.memory is None else PEAKS.start()
            try:
                produced = self._session_run(wanted, feeds, ctx.control)
            finally:
                if claims is not None:
                    claims.unclaim(peak)
                if began is not None and self.memory is not None:
                    self.memory.measured(feeds, PEAKS.stop(began), self.max_graph_bytes)
        result = {name: _answered(name, value) for name, value in zip(wanted, produced,
                                                                     strict=True)}  # fmt: skip
        if claims is not None:
            claims.claim(sum(array.nbytes for array in result.values()))
        ran = RunResult(result, list(self.reports), None)
        try:
            self._check_answer(ran, ctx)
        except RunOffLoop:  # inline, an answer too long to write on the loop: a thread runs
            self.gate.spilled()  # it again, and these runs stay there a while
            raise
        return ran

    def _inline_run(self, wanted: list[str], feeds: dict[str, np.ndarray], allowance: int,
                    attempt: InlineAttempt | None) -> list[Any]:  # fmt: skip
        """The run on the event loop when the gate is open and the estimate for these inputs is
        made, whole and small (else RunOffLoop: a thread makes it). The leash and the hold
        allowed are the whole inline attempt's, from its start (`attempt`; an ensemble's steps
        share one): a run is not begun once the attempt held the loop HELD_SECONDS, and is
        stopped at the attempt's leash, the gate closed for good; the attempt's time so far is
        held against this model's gate, however the run ended."""
        known = self.memory.estimated(feeds) if self.memory is not None else None
        if not self.inline or known is None or not known[1] or known[0] > allowance:
            raise RunOffLoop
        clock = attempt if attempt is not None else InlineAttempt()  # a lone run: its own
        spent = clock.seconds()
        if spent > HELD_SECONDS:  # the attempt's earlier steps took the loop's share
            self.gate.held(spent)
            raise RunOffLoop
        try:
            return self._session_run(wanted, feeds, RunControl(LEASH_SECONDS - spent))
        except RunTimeout:  # the leash's deadline (the only one an inline run has)
            self.gate.close()
            raise RunOffLoop from None
        finally:
            self.gate.held(clock.seconds())

    def _session_run(self, wanted: list[str], feeds: dict[str, np.ndarray],
                     control: Any) -> list[Any]:  # fmt: skip
        import onnxruntime as ort

        options = ort.RunOptions()
        key = None
        if isinstance(control, RunControl):
            control.check(RUNNING)
            key = STOPPER.watch(control, options)
        try:
            started = perf_counter_ns()
            try:
                produced = list(self.session.run(wanted, feeds, options))
            finally:
                ended = perf_counter_ns()
                self.gate.ran((ended - started) / 1e9)  # a failed run's time counts too
            engine_time.record(started, ended)
            return produced
        except Exception as exc:
            stopped = control.stopped() if isinstance(control, RunControl) else None
            if stopped is not None:
                raise stopped from None
            raise InvalidInput(f"onnxruntime could not run the model on these inputs: "
                               f"{reason(exc)}") from None  # fmt: skip
        finally:
            if key is not None:
                STOPPER.done(key)


def _fed(name: str, array: np.ndarray) -> np.ndarray:
    """An input as onnxruntime takes it: strings as str (it would print bytes as "b'..'")."""
    if array.dtype != object:
        return array
    try:
        return np.array([v.decode("utf-8") if isinstance(v, bytes) else v
                         for v in array.reshape(-1)], dtype=object).reshape(array.shape)  # fmt: skip
    except UnicodeDecodeError:
        raise InvalidInput(f"input {name!r} holds strings that are not UTF-8, which "
                           "onnxruntime cannot take", loc=("inputs", name)) from None  # fmt: skip


def _answered(name: str, value: Any) -> np.ndarray:
    if not isinstance(value, np.ndarray):
        with located("outputs", name):
            raise InvalidInput(f"output {name!r} is a {type(value).__name__}, not a tensor; "
                               "only tensors travel over the API")  # fmt: skip
    return value
