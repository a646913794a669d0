"""The one step's work for a small ModelInferRequest on an operator version, with raw contents.

The data plane's general work (core/inference.InferWork through GrpcWire) serves every model
and every form of a message: typed contents, shared memory, requested outputs, parameters,
classification, sequences. For the most common gRPC call, raw contents for an operator
version with none of those (what tritonclient.grpc sends), its layers cost about as much as
the node's run: this work answers such a call directly, as api/v2_operator_call.py does for
V2 JSON over HTTP. It answers only what the general path would answer the same way (the same
decode, kernel run and answer encoder) and declines the rest before anything is sent
(`Declined`, or any refusal: the servicer then hands the message to the general path, the
one judge of every refusal and its words). tests/grpc/test_operator_call.py holds the two to
equal answers and statistics on generated messages.
"""

from time import perf_counter_ns

from tritonclient.grpc import service_pb2 as pb

from service.codecs.limits import Limits
from service.core.fallback import Declined
from service.core.inference import decode_raw, plain_outputs
from service.core.operator_model import OperatorModel
from service.core.parameters import kernel_attributes
from service.core.statistics import Timings
from service.grpc.converters import infer_response_of
from service.kernels.context import KernelContext
from service.operators.run import run


class RawOperatorCall:
    """One small ModelInferRequest on an operator version, as execution.py's Work: the same
    answer as the general path's (GrpcWire, InferWork, OperatorModel.infer)."""

    __slots__ = ("limits", "model", "request", "timings")

    def __init__(self, model: OperatorModel, request: pb.ModelInferRequest, limits: Limits) -> None:
        self.model, self.request, self.limits = model, request, limits
        self.timings = Timings()

    @property
    def holding(self) -> int:
        return 0  # small: nothing is reserved for it

    def __call__(self, ctx: KernelContext) -> bytes:
        model, request, timings = self.model, self.request, self.timings
        timings.started = start = perf_counter_ns()
        raw, items = request.raw_input_contents, request.inputs
        # parameters (the request's or an input's: shared memory, sequences, custom ones),
        # typed contents, named outputs and Constant's tensor attributes are the general path's
        declined = request.parameters or request.outputs or model.tensor_attributes
        if declined or len(raw) != len(items):
            raise Declined
        # decoded as the general path decodes raw contents (its decode_inputs, less the
        # neutral call's objects); a name given twice is its to refuse
        arrays = {}
        for item, data in zip(items, raw, strict=True):
            if item.parameters or item.HasField("contents") or item.name in arrays:
                raise Declined
            arrays[item.name] = decode_raw(item.datatype, item.shape[:], data, self.limits, ctx)
        ran = perf_counter_ns()
        outputs = run(model.op, arrays, kernel_attributes(model.op, {}, {}),
                      ctx.for_format("v2_binary"))  # fmt: skip
        encoded = perf_counter_ns()
        answer = infer_response_of(model.name, str(model.version), request.id,
                                   plain_outputs(outputs))  # fmt: skip
        timings.compute_input = ran - start
        timings.compute_infer = encoded - ran
        timings.compute_output = perf_counter_ns() - encoded
        return answer
