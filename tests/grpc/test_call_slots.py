"""One client cannot hold every gRPC call slot (issue 25): its calls are bounded by
OPSERVE_GRPC_MAX_CALLS_PER_CLIENT, its open streams by OPSERVE_GRPC_MAX_STREAMS_PER_CLIENT
(apart: issue 32), and a stream that sends nothing is ended after OPSERVE_GRPC_IDLE_SECONDS,
which gives its place back. Every loopback address is one client
(127.0.0.1 over IPv4 and ::1 over IPv6 alike, to a server on "::"), so another client is
shown by the count itself (CallSlots) rather than over the network."""

import asyncio
import time
from collections.abc import Iterator

import grpc
import numpy as np
import pytest
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc

from service.core.call_slots import STREAMS, CallSlots, client_of
from tests.grpc.conftest import Served, serve_grpc

PER_CLIENT = 8
IDLE = 1.0
INFER = "/inference.GRPCInferenceService/ModelInfer"


@pytest.fixture(scope="module")
def served() -> Iterator[Served]:
    with serve_grpc(host="::", grpc_max_calls="40", grpc_max_calls_per_client=str(PER_CLIENT),
                    grpc_max_streams_per_client=str(PER_CLIENT),
                    grpc_idle_seconds=str(IDLE)) as running:  # fmt: skip
        yield running


def _tile() -> pb.ModelInferRequest:
    request = pb.ModelInferRequest(model_name="Tile", model_version="13")
    request.inputs.add(name="input", datatype="FP32", shape=[3])
    request.inputs.add(name="repeats", datatype="INT64", shape=[1])
    request.raw_input_contents.extend([np.ones(3, np.float32).tobytes(),
                                       np.array([2], np.int64).tobytes()])  # fmt: skip
    return request


def test_the_slots_of_one_client_are_bounded_over_ipv4_and_ipv6_together(served: Served) -> None:
    """Unary calls whose message has not come (each holds a slot) from both addresses, then
    one more: refused; answered once they are gone."""
    ipv6 = f"[::1]:{served.grpc_port}"

    async def main() -> tuple[grpc.aio.AioRpcError, int]:
        async with grpc.aio.insecure_channel(served.target) as v4, \
                grpc.aio.insecure_channel(ipv6) as v6:  # fmt: skip
            channels = (v4, v6)
            held = [channels[i % 2].stream_unary(INFER)() for i in range(PER_CLIENT)]
            # their headers have come: a slot each (and not yet IDLE: they would be ended; a
            # call that came before them would wait 2 s for the memory they reserve)
            await asyncio.sleep(0.3)
            stub = service_pb2_grpc.GRPCInferenceServiceStub(v6)
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await stub.ModelInfer(_tile(), timeout=5)
            for call in held:
                call.cancel()
            again = await _until_answered(stub)  # its slots are back
            return refused.value, len(again.outputs)

    error, answered = asyncio.run(asyncio.wait_for(main(), 30))
    assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert error.details() == (f"this client (loopback) has {PER_CLIENT} gRPC calls open, as "
                               "many as one client may (OPSERVE_GRPC_MAX_CALLS_PER_CLIENT); "
                               "end some, or retry later")  # fmt: skip
    assert ("retry-after", "1") in list(error.trailing_metadata() or ())
    assert answered == 1


async def _until_answered(stub: service_pb2_grpc.GRPCInferenceServiceStub) -> pb.ModelInferResponse:
    """The first small call answered, tried every 50 ms for up to 5 s: a cancelled call's slot
    comes back once the server has seen it end."""
    deadline = time.monotonic() + 5
    while True:
        try:
            answer: pb.ModelInferResponse = await stub.ModelInfer(_tile(), timeout=5)
            return answer
        except grpc.aio.AioRpcError as exc:
            if exc.code() != grpc.StatusCode.RESOURCE_EXHAUSTED or time.monotonic() > deadline:
                raise
        await asyncio.sleep(0.05)


def test_the_streams_of_one_client_are_bounded_over_ipv4_and_ipv6_together(
    served: Served,
) -> None:
    """Answered streams open from both addresses, then one more: refused for streams, while
    a unary call is answered (the open streams hold no call slot)."""
    ipv6 = f"[::1]:{served.grpc_port}"

    async def main() -> tuple[grpc.StatusCode, str, int]:
        async with grpc.aio.insecure_channel(served.target) as v4, \
                grpc.aio.insecure_channel(ipv6) as v6:  # fmt: skip
            stubs = [service_pb2_grpc.GRPCInferenceServiceStub(c) for c in (v4, v6)]
            held = [stubs[i % 2].ModelStreamInfer() for i in range(PER_CLIENT)]
            for stream in held:  # each open and answered: a place each, from both addresses
                await stream.write(_tile())
            await asyncio.gather(*(stream.read() for stream in held))
            answer = await stubs[1].ModelInfer(_tile(), timeout=5)
            more = stubs[1].ModelStreamInfer()
            code, details = await more.code(), await more.details()
            for stream in held:
                await stream.done_writing()
            await asyncio.gather(*(stream.code() for stream in held))
            return code, details, len(answer.outputs)

    code, details, answered = asyncio.run(asyncio.wait_for(main(), 30))
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert details == (f"this client (loopback) has {PER_CLIENT} inference streams open, as many "
                       "as one client may (OPSERVE_GRPC_MAX_STREAMS_PER_CLIENT); end some, or "
                       "retry later")  # fmt: skip
    assert answered == 1


def test_a_silent_stream_ends_and_gives_its_place_back(served: Served) -> None:
    async def main() -> tuple[list[grpc.StatusCode], str, float]:
        async with grpc.aio.insecure_channel(served.target) as channel:
            stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
            started = time.monotonic()
            silent = [stub.ModelStreamInfer() for _ in range(PER_CLIENT - 1)]  # never a message
            talked = stub.ModelStreamInfer()  # one message, then silent with its stream open
            await talked.write(_tile())
            await talked.read()
            codes = await asyncio.gather(*(call.code() for call in [*silent, talked]))
            took = time.monotonic() - started
            details = await talked.details()
            again = [stub.ModelStreamInfer() for _ in range(PER_CLIENT)]  # places free again
            for stream in again:
                await stream.write(_tile())
            answers = await asyncio.gather(*(stream.read() for stream in again))
            assert all(len(a.infer_response.outputs) == 1 for a in answers), answers
            for stream in again:
                stream.cancel()
            return list(codes), details, took

    codes, details, took = asyncio.run(asyncio.wait_for(main(), 30))
    assert codes == [grpc.StatusCode.DEADLINE_EXCEEDED] * PER_CLIENT
    assert details == f"the stream sent no request within {IDLE:g} s (OPSERVE_GRPC_IDLE_SECONDS)"
    assert IDLE <= took < IDLE + 2


def test_slots_count_per_client_and_in_all() -> None:
    slots = CallSlots(total=5, per_client=2)
    assert [slots.take("a"), slots.take("a")] == [None, None]
    assert "as many as one client may" in str(slots.take("a"))
    assert [slots.take("b"), slots.take("b"), slots.take("c")] == [None, None, None]
    assert "the server is answering 5 gRPC calls" in str(slots.take("d"))
    slots.give("a")
    assert slots.take("d") is None and slots.by_client == {"a": 1, "b": 2, "c": 1, "d": 1}
    for client in ("a", "b", "b", "c", "d"):
        slots.give(client)
    assert slots.taken == 0 and slots.by_client == {}
    streams = CallSlots(total=2, per_client=1, what="inference streams", setting=STREAMS)
    assert streams.take("a") is None
    assert str(streams.take("a")) == ("this client (a) has 1 inference streams open, as many as "
                                      "one client may (OPSERVE_GRPC_MAX_STREAMS_PER_CLIENT); end "
                                      "some, or retry later")  # fmt: skip
    assert streams.take("b") is None
    assert "(OPSERVE_GRPC_MAX_STREAMS); retry later" in str(streams.take("c"))


@pytest.mark.parametrize(("host", "client"), [
    ("127.0.0.1", "loopback"), ("127.8.9.10", "loopback"), ("::1", "loopback"),
    ("::ffff:127.0.0.2", "loopback"), ("10.1.2.3", "10.1.2.3"), ("::ffff:10.1.2.3", "10.1.2.3"),
    ("2001:db8::1", "2001:db8::/64"), ("2001:db8::ffff:1", "2001:db8::/64"),
    ("2001:db8:0:1::1", "2001:db8:0:1::/64"), ("unix:/tmp/socket", "unix:/tmp/socket"),
])  # fmt: skip
def test_the_client_an_address_counts_as(host: str, client: str) -> None:
    """A host has many addresses to choose from: all of loopback, or an IPv6 /64."""
    assert client_of(host) == client
