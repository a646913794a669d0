"""ModelStreamInfer: many requests on one stream answered in their order, sequences interleaved
on a stream (Triton's sequence examples), errors answered in the stream as Triton does, with
tritonclient.grpc (threads and asyncio) and with the raw stubs."""

import asyncio
import queue
from collections.abc import AsyncIterator

import numpy as np
import pytest
import tritonclient.grpc as triton
import tritonclient.grpc.aio as triton_aio
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc

from tests.grpc.conftest import Served

Stub = service_pb2_grpc.GRPCInferenceServiceStub


def _value(value: int, name: str = "INPUT") -> triton.InferInput:
    tensor = triton.InferInput(name, [1, 1], "INT32")
    tensor.set_data_from_numpy(np.array([[value]], dtype=np.int32))
    return tensor


def _answers(got: queue.Queue, count: int) -> list[tuple[str, object]]:
    answers: list[tuple[str, object]] = []
    for _ in range(count):
        result, error = got.get(timeout=10)
        if error is not None:
            answers.append(("error", error.message()))
        else:
            answers.append(
                (result.get_response().id, int(result.as_numpy("OUTPUT").reshape(-1)[0]))
            )
    return answers


def test_interleaved_sequences_accumulate_each_their_own(
    client: triton.InferenceServerClient,
) -> None:
    """simple_string_dyna_sequence keeps a running sum per sequence (implicit state); three
    sequences with string ids interleave on one stream, the last request adds its id at END."""
    got: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: got.put((result, error)))
    values = {"1001": [1, 2, 3], "1002": [10, 20, 30], "1003": [100, 200, 300]}
    sent = []
    for step in range(3):
        for seq, numbers in values.items():
            client.async_stream_infer("simple_string_dyna_sequence", [_value(numbers[step])],
                                      request_id=f"{seq}_{step}", sequence_id=seq,
                                      sequence_start=step == 0, sequence_end=step == 2)  # fmt: skip
            sent.append(f"{seq}_{step}")
    answers = _answers(got, len(sent))
    client.stop_stream()
    assert [rid for rid, _ in answers] == sent  # in the order they were sent
    sums = {seq: np.cumsum(numbers).tolist() for seq, numbers in values.items()}
    for rid, output in answers:
        seq, step = rid.split("_")
        assert output == sums[seq][int(step)] + (int(seq) if step == "2" else 0), rid


def test_triton_sequence_example_on_a_stream(client: triton.InferenceServerClient) -> None:
    """simple_grpc_sequence_stream_infer_client.py: READY * (INPUT + START) per request."""
    got: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: got.put((result, error)))
    values = [0, 11, 7, 5, 3, 2, 0, 1]
    for seq, sign in ((1000, 1), ("a-string-id", -1)):
        for i, value in enumerate(values):
            client.async_stream_infer("simple_sequence", [_value(sign * value)],
                                      request_id=f"{seq}_{i}", sequence_id=seq,
                                      sequence_start=i == 0, sequence_end=i == len(values) - 1)  # fmt: skip
    answers = _answers(got, 2 * len(values))
    client.stop_stream()
    outputs = [output for _, output in answers]
    assert outputs == [1, *values[1:], 1, *(-v for v in values[1:])]


def test_refusals_are_answered_in_the_stream_which_goes_on(
    client: triton.InferenceServerClient,
) -> None:
    got: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: got.put((result, error)))
    client.async_stream_infer("simple_sequence", [_value(1)], request_id="a", sequence_id=5,
                              sequence_start=True)  # fmt: skip
    client.async_stream_infer("simple_sequence", [_value(2)], request_id="b", sequence_id=77)
    client.async_stream_infer("wrong_model_name", [_value(3)], request_id="c")
    client.async_stream_infer("simple_sequence", [_value(4)], request_id="d", sequence_id=5,
                              sequence_end=True)  # fmt: skip
    answers = _answers(got, 4)
    client.stop_stream()
    assert answers[0] == ("a", 2) and answers[3] == ("d", 4)
    assert answers[1][0] == "error" and "must specify the START flag" in str(answers[1][1])
    assert answers[2] == ("error", "Request for unknown model: 'wrong_model_name' is not found")


def test_raw_stream_answers_carry_the_ids_and_final_flag(stub: Stub) -> None:
    def requests() -> list[pb.ModelInferRequest]:
        made = []
        for i, model in enumerate(["simple", "nope", "simple"]):
            request = pb.ModelInferRequest(model_name=model, id=f"r{i}")
            for name in ("INPUT0", "INPUT1"):
                request.inputs.add(name=name, datatype="INT32", shape=[1, 16])
                request.raw_input_contents.append(np.full(16, i, np.int32).tobytes())
            made.append(request)
        return made

    answers = list(stub.ModelStreamInfer(iter(requests()), timeout=10))
    assert [a.infer_response.id for a in answers] == ["r0", "r1", "r2"]
    assert [bool(a.error_message) for a in answers] == [False, True, False]
    assert answers[0].infer_response.parameters["triton_final_response"].bool_param
    assert (
        np.frombuffer(answers[2].infer_response.raw_output_contents[0], np.int32).tolist()
        == [4] * 16
    )


def test_aio_stream_of_many_requests_in_order(served: Served) -> None:
    async def main() -> list[str]:
        async with triton_aio.InferenceServerClient(served.target) as client:

            async def requests() -> AsyncIterator[dict]:
                for i in range(40):
                    yield {
                        "model_name": "simple_sequence",
                        "inputs": [_value(i)],
                        "request_id": str(i),
                        "sequence_id": 3000 + i % 4,
                        "sequence_start": i < 4,
                        "sequence_end": i >= 36,
                    }

            ids = []
            async for result, error in client.stream_infer(requests()):
                assert error is None, error
                ids.append(result.get_response().id)
            return ids

    assert asyncio.run(main()) == [str(i) for i in range(40)]


@pytest.mark.parametrize("count", [1, 300])
def test_unary_sequence_requests(client: triton.InferenceServerClient, count: int) -> None:
    """simple_grpc_sequence_sync_infer_client.py: one call per step."""
    outputs = []
    for i in range(count):
        result = client.infer("simple_sequence", [_value(i + 1)], sequence_id=9000 + count,
                              sequence_start=i == 0, sequence_end=i == count - 1)  # fmt: skip
        outputs.append(int(result.as_numpy("OUTPUT")[0][0]))
    assert outputs == [2, *range(2, count + 1)][:count]
