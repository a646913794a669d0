"""The one step's work for a small V2 call on an operator version (api/one_step.py).

The data plane's general work (core/inference.InferWork) serves every model and every form of
a call: binary data, shared memory, classification, requested outputs, parameters, sequences.
For the most common V2 calls on an operator version, plain JSON tensors, or tritonclient's
binary form (binary inputs, `binary_data_output`), with none of the rest, its layers (the
neutral call's objects, the result's, the generic encoder) cost about as much as the operator
run itself: this work answers such a call directly, 7 us less in process and V2 at 0.30x the
floor instead of 0.28x on the server (docs/api.md, Throughput). A binary call is read and
answered by the general path's own parse_request and encode_result. Like the
other short paths, it answers only what the general path would answer the same way, and
declines the rest before anything is sent (`Declined`, or any refusal: the one step then hands
the call, its body replayed, to the general path, the one judge of every refusal and its
words). tests/api/test_one_step.py holds the two to equal answers, log lines, metrics and
statistics on generated bodies.
"""

from time import perf_counter_ns

from service.api.responses import dumps
from service.api.send_answer import Headers
from service.api.v2_codec import (
    answer_headers,
    answer_of,
    common_call,
    encode_result,
    parse_request,
)
from service.codecs.limits import Limits
from service.codecs.v2_json import encode_v2_json
from service.core.calls import InferCall, InferResult
from service.core.fallback import Declined
from service.core.inference import decode_inputs, plain_outputs
from service.core.operator_model import OperatorModel
from service.core.parameters import kernel_attributes
from service.core.statistics import Timings
from service.kernels.context import KernelContext
from service.operators.common_request import COMMON_BODY_BYTES
from service.operators.run import run

JSON_HEADERS: Headers = [(b"content-type", b"application/json")]


class OperatorCall:
    """One small V2 call on an operator version (JSON, or the binary form), as execution.py's
    Work: the same answer as the general path's (V2Wire, InferWork, OperatorModel.infer,
    encode_result)."""

    __slots__ = ("body", "json_length", "limits", "model", "timings")

    def __init__(self, model: OperatorModel, body: bytes, json_length: int | None,
                 limits: Limits) -> None:  # fmt: skip
        self.model, self.body, self.json_length, self.limits = model, body, json_length, limits
        self.timings = Timings()

    @property
    def holding(self) -> int:
        return len(self.body)

    def __call__(self, ctx: KernelContext) -> tuple[int, Headers, bytes]:
        model, timings = self.model, self.timings
        timings.started = start = perf_counter_ns()
        call = self._call()
        # named outputs on JSON (an order, a subset, a refusal of a name) and Constant's
        # tensor attributes, which travel as inputs, are the general path's
        named = call is not None and call.outputs is not None and self.json_length is None
        if call is None or named or model.tensor_attributes:
            raise Declined
        # as the general path (no regions; many BYTES elements are decoded on a thread)
        inputs = decode_inputs(call.inputs, self.limits, None, ctx)
        ran = perf_counter_ns()
        outputs = run(model.op, inputs, kernel_attributes(model.op, {}, {}),
                      ctx.for_format(call.answer_form))  # fmt: skip
        encoded = perf_counter_ns()
        if self.json_length is None:
            entries = [encode_v2_json(name, array) for name, array in outputs.items()]
            headers, answer = JSON_HEADERS, dumps(answer_of(model.name, str(model.version),
                                                            call.id, entries))  # fmt: skip
        else:
            headers, answer = self._binary_answer(call, outputs)
        timings.compute_input = ran - start
        timings.compute_infer = encoded - ran
        timings.compute_output = perf_counter_ns() - encoded
        return 200, headers, answer

    def _call(self) -> InferCall | None:
        """The call the body holds when it is of the common form, else None. A binary one is
        read by the general path's parse_request (its refusals decline it too); only the
        binary extension's own parameters are common (attributes, sequences, shared memory
        and classification travel as others), and outputs only when the one output is named
        with its binary_data flag at most (as tritonclient's examples name it)."""
        if self.json_length is None:  # parse_request reads larger bodies with the model
            return common_call(self.body) if len(self.body) <= COMMON_BODY_BYTES else None
        call = parse_request(self.body, self.json_length)
        if call.parameters.keys() - {"binary_data_output"} or any(
            item.parameters.keys() - {"binary_data_size"} for item in call.inputs
        ):
            return None
        if call.outputs is not None and not (
            len(call.outputs) == 1
            and [call.outputs[0].name] == self.model.op.outputs
            and call.outputs[0].parameters.keys() <= {"binary_data"}
        ):
            return None
        return call

    def _binary_answer(self, call: InferCall, outputs: dict) -> tuple[Headers, bytes]:
        """The general path's answer (encode_result) to a binary call."""
        model = self.model
        result = InferResult(model.name, str(model.version), call.id, plain_outputs(outputs))
        content, json_length = encode_result(call, result)
        if not isinstance(content, bytes):  # an answer sent in parts: the general path's
            raise Declined
        return answer_headers(json_length), content
