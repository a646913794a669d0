"""The one step's work for a small V2 JSON call on an operator version (api/one_step.py).

The data plane's general work (core/inference.InferWork) serves every model and every form of
a call: binary data, shared memory, classification, requested outputs, parameters, sequences.
For the most common V2 call, plain JSON tensors for an operator version with none of those,
its layers (the neutral call's objects, the result's, the generic encoder) cost about as much
as the operator run itself: this work answers such a call directly, 7 us less in process and
V2 at 0.30x the floor instead of 0.28x on the server (docs/api.md, Throughput). Like the
other short paths, it answers only what the general path would answer the same way, and
declines the rest before anything is sent (`Declined`, or any refusal: the one step then hands
the call, its body replayed, to the general path, the one judge of every refusal and its
words). tests/api/test_one_step.py holds the two to equal answers, log lines, metrics and
statistics on generated bodies.
"""

from time import perf_counter_ns

from service.api.responses import dumps
from service.api.send_answer import Headers
from service.api.v2_codec import answer_of, common_call
from service.codecs.limits import Limits
from service.codecs.v2_json import encode_v2_json
from service.core.inference import decode_inputs
from service.core.operator_model import OperatorModel
from service.core.parameters import kernel_attributes
from service.core.statistics import Timings
from service.kernels.context import KernelContext
from service.operators.common_request import COMMON_BODY_BYTES
from service.operators.run import run

JSON_HEADERS: Headers = [(b"content-type", b"application/json")]


class Declined(Exception):
    """Not a call this work answers: the general path's."""


class OperatorCall:
    """One small V2 JSON call on an operator version, as execution.py's Work: the same
    answer as the general path's (V2Wire, InferWork, OperatorModel.infer, encode_result)."""

    __slots__ = ("body", "limits", "model", "timings")

    def __init__(self, model: OperatorModel, body: bytes, limits: Limits) -> None:
        self.model, self.body, self.limits = model, body, limits
        self.timings = Timings()

    @property
    def holding(self) -> int:
        return len(self.body)

    def __call__(self, ctx: KernelContext) -> tuple[int, Headers, bytes]:
        model, timings = self.model, self.timings
        timings.started = start = perf_counter_ns()
        # parse_request reads larger bodies with the request model
        call = common_call(self.body) if len(self.body) <= COMMON_BODY_BYTES else None
        # named outputs (an order, a subset, a refusal of a name) and Constant's tensor
        # attributes, which travel as inputs, are the general path's
        if call is None or call.outputs is not None or model.tensor_attributes:
            raise Declined
        inputs = decode_inputs(call.inputs, self.limits)  # as the general path (no regions)
        ran = perf_counter_ns()
        outputs = run(model.op, inputs, kernel_attributes(model.op, {}, {}),
                      ctx.for_format("v2_json"))  # fmt: skip
        encoded = perf_counter_ns()
        entries = [encode_v2_json(name, array) for name, array in outputs.items()]
        answer = dumps(answer_of(model.name, str(model.version), call.id, entries))
        timings.compute_input = ran - start
        timings.compute_infer = encoded - ran
        timings.compute_output = perf_counter_ns() - encoded
        return 200, JSON_HEADERS, answer
