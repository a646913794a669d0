"""Messages that are not what the method takes, or carry more than it reads (issue 25): each is
INVALID_ARGUMENT naming what is wrong, as HTTP answers a body that is no JSON with 400, and the
server logs the call's one access line and no traceback. Unary calls, streams (where a bad
message ends the stream) and the control methods alike."""

from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc

from tests.grpc.conftest import Served, serve_grpc

SERVICE = "/inference.GRPCInferenceService/"
GARBLED = [
    b"\xff\xff\xff\xff",  # a field number of 0x0fffffff... whose varint never ends
    b"\x0a\x05Ti",  # model_name: 5 bytes announced, 2 sent
    b"\x0a",  # a field's tag and nothing after it
    b"\x1a\x80\x80\x80\x80\x80\x80\x80\x80\x80\x80\x01",  # a length varint past 64 bits
    b"\x0f\x00",  # wire type 7, which no message has
]


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Served, Path]]:
    log = tmp_path_factory.mktemp("malformed") / "server.log"
    with serve_grpc(log_to=log) as running:
        yield running, log


def _raw_call(channel: grpc.Channel, method: str) -> grpc.UnaryUnaryMultiCallable:
    return channel.unary_unary(SERVICE + method, request_serializer=None,
                               response_deserializer=None)  # fmt: skip


@pytest.mark.parametrize("method", ["ModelInfer", "ModelConfig", "RepositoryModelLoad",
                                    "SystemSharedMemoryRegister"])  # fmt: skip
@pytest.mark.parametrize("garbled", GARBLED)
def test_a_garbled_message_is_invalid_argument(served: tuple[Served, Path], method: str,
                                               garbled: bytes) -> None:  # fmt: skip
    server, log = served
    with grpc.insecure_channel(server.target) as channel, pytest.raises(grpc.RpcError) as refused:
        _raw_call(channel, method)(garbled, timeout=5)
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT, refused.value.details()
    assert refused.value.details().startswith(
        f"the request is not a valid inference.{method}Request message ("
    )
    assert "Traceback" not in log.read_text()


def test_a_garbled_message_ends_a_stream_as_invalid_argument(served: tuple[Served, Path]) -> None:
    server, log = served
    with grpc.insecure_channel(server.target) as channel:
        stream = channel.stream_stream(SERVICE + "ModelStreamInfer", request_serializer=None,
                                       response_deserializer=None)  # fmt: skip
        good = _tile(0).SerializeToString()
        answers = stream(iter([good, GARBLED[0], good]), timeout=5)
        first = pb.ModelStreamInferResponse.FromString(next(answers))
        assert not first.error_message and first.infer_response.outputs[0].shape == [4, 3]
        with pytest.raises(grpc.RpcError) as refused:
            next(answers)
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "is not a valid inference.ModelInferRequest message" in refused.value.details()
    assert "Traceback" not in log.read_text()


def _tile(extra: int, repeats: int = 2) -> pb.ModelInferRequest:
    """Tile-13 with its two inputs as raw contents, and `extra` more contents nothing takes."""
    request = pb.ModelInferRequest(model_name="Tile", model_version="13")
    request.inputs.add(name="input", datatype="FP32", shape=[2, 3])
    request.inputs.add(name="repeats", datatype="INT64", shape=[2])
    request.raw_input_contents.extend([np.ones(6, np.float32).tobytes(),
                                       np.array([repeats, 1], np.int64).tobytes()])  # fmt: skip
    request.raw_input_contents.extend([b"\x00" * 8] * extra)
    return request


@pytest.mark.parametrize("extra", [1, 2, 7])
def test_raw_contents_no_input_takes_are_refused(served: tuple[Served, Path], extra: int) -> None:
    server, _log = served
    with grpc.insecure_channel(server.target) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        assert stub.ModelInfer(_tile(0), timeout=5).outputs[0].shape == [4, 3]
        with pytest.raises(grpc.RpcError) as refused:
            stub.ModelInfer(_tile(extra), timeout=5)
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert refused.value.details() == (
            f"Tile-13: unexpected additional input data for model 'Tile': {2 + extra} "
            "raw_input_contents for 2 inputs that take raw contents")  # fmt: skip
        # on a stream the refusal is the request's answer, and the stream goes on
        answers = list(stub.ModelStreamInfer(iter([_tile(extra), _tile(0)]), timeout=5))
    assert "raw_input_contents for 2 inputs that take raw contents" in answers[0].error_message
    assert not answers[1].error_message and answers[1].infer_response.outputs[0].shape == [4, 3]


def test_an_input_in_shared_memory_takes_no_raw_contents(served: tuple[Served, Path]) -> None:
    """Raw contents are counted against the inputs that take them: one input from a region
    (unregistered here, so refused for that) and two raw contents is one too many."""
    server, _log = served
    request = _tile(0)
    request.inputs[0].parameters["shared_memory_region"].string_param = "nowhere"
    with grpc.insecure_channel(server.target) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        with pytest.raises(grpc.RpcError) as refused:
            stub.ModelInfer(request, timeout=5)
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "2 raw_input_contents for 1 inputs that take raw contents" in (
        refused.value.details())  # fmt: skip
