"""Issue 32's row on idle gRPC streams, scaled down: one client holds many silent health Watch
and ModelStreamInfer streams, and another client from the same address (every loopback address
is one client, as every client behind a proxy is the proxy's) still gets ServerLive and
ModelMetadata at once, as many side by side as OPSERVE_GRPC_MAX_CALLS_PER_CLIENT allows. Open
streams have caps of their own (OPSERVE_GRPC_MAX_STREAMS, _PER_CLIENT), refused in words past
them; a stream's message takes a call slot only while it is served."""

import asyncio
import contextlib
import time
from collections.abc import Iterator
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc

from tests.grpc.conftest import Served, serve_grpc
from tests.grpc.test_bounds import tile_call

CALLS = 4  # a client's call slots
STREAMS = 24  # a client's streams of each count (inference; health and reflection)
INFER = "/inference.GRPCInferenceService/ModelInfer"
Stub = service_pb2_grpc.GRPCInferenceServiceStub


@pytest.fixture(scope="module")
def served() -> Iterator[Served]:
    with serve_grpc(grpc_max_calls="8", grpc_max_calls_per_client=str(CALLS),
                    grpc_max_streams="40", grpc_max_streams_per_client=str(STREAMS)) as running:  # fmt: skip
        yield running


def connection(target: str) -> grpc.aio.Channel:
    """A channel on a connection of its own (grpc shares one between channels to the same
    target with the same arguments), as another client's or a proxy's is."""
    return grpc.aio.insecure_channel(target, options=[("grpc.use_local_subchannel_pool", 1)])


async def _other_client(target: str) -> float:
    """CALLS ServerLive and CALLS ModelMetadata from a connection of their own, CALLS at once;
    the seconds they took."""
    async with connection(target) as channel:
        stub = Stub(channel)
        started = time.monotonic()
        lives = await asyncio.gather(*(stub.ServerLive(pb.ServerLiveRequest(), timeout=5)
                                       for _ in range(CALLS)))  # fmt: skip
        metadata = await asyncio.gather(*(
            stub.ModelMetadata(pb.ModelMetadataRequest(name="Tile", version="13"), timeout=5)
            for _ in range(CALLS)))  # fmt: skip
        assert all(live.live for live in lives)
        assert all([t.name for t in m.inputs] == ["input", "repeats"] for m in metadata)
        return time.monotonic() - started


async def _refused(call: grpc.aio.Call) -> tuple[grpc.StatusCode, str, tuple[object, ...]]:
    return await call.code(), await call.details(), tuple(await call.trailing_metadata() or ())


def test_idle_streams_hold_no_slot_another_clients_calls_need(served: Served) -> None:
    """STREAMS silent ModelStreamInfer and STREAMS health Watch streams (each six times a
    client's call slots) over two connections; another client's calls are answered in about
    the time they took before, and a stream past either cap is refused in words."""

    async def main() -> tuple[float, float, list[tuple[grpc.StatusCode, str, tuple[object, ...]]]]:
        baseline = await _other_client(served.target)
        channels = [connection(served.target) for _ in range(2)]
        streams = [Stub(channels[i % 2]).ModelStreamInfer() for i in range(STREAMS)]
        watches = [health_pb2_grpc.HealthStub(channels[i % 2]).Watch(
            health_pb2.HealthCheckRequest()) for i in range(STREAMS)]  # fmt: skip
        firsts = await asyncio.gather(*(w.read() for w in watches))
        assert all(f.status == health_pb2.HealthCheckResponse.SERVING for f in firsts)
        await asyncio.sleep(0.3)  # the silent streams' headers have come: each holds its place
        took = await _other_client(served.target)
        over = [
            Stub(channels[0]).ModelStreamInfer(),
            health_pb2_grpc.HealthStub(channels[1]).Watch(health_pb2.HealthCheckRequest()),
        ]
        refusals = [await _refused(call) for call in over]
        assert all(not s.done() for s in streams) and all(not w.done() for w in watches)
        for call in (*streams, *watches):
            call.cancel()
        for channel in channels:
            await channel.close()
        return baseline, took, refusals

    baseline, took, refusals = asyncio.run(asyncio.wait_for(main(), 60))
    assert took < max(1.0, 5 * baseline), (took, baseline)
    hint = ("retry-after", "1")
    assert [(code, details) for code, details, _ in refusals] == [
        (grpc.StatusCode.RESOURCE_EXHAUSTED,
         f"this client (loopback) has {STREAMS} inference streams open, as many as one client "
         "may (OPSERVE_GRPC_MAX_STREAMS_PER_CLIENT); end some, or retry later"),
        (grpc.StatusCode.RESOURCE_EXHAUSTED,
         f"this client (loopback) has {STREAMS} health and reflection streams open, as many as "
         "one client may (OPSERVE_GRPC_MAX_STREAMS_PER_CLIENT); end some, or retry later"),
    ]  # fmt: skip
    assert all(hint in trailing for _, _, trailing in refusals), refusals


def test_the_streams_of_every_client_are_bounded_in_all(served: Served) -> None:
    """Past OPSERVE_GRPC_MAX_STREAMS (10 here, under the default per-client cap), the next
    stream is refused for the total, and calls are still answered."""
    with serve_grpc(grpc_max_streams="10") as small:

        async def main() -> tuple[grpc.StatusCode, str, float]:
            async with connection(small.target) as channel:
                held = [Stub(channel).ModelStreamInfer() for _ in range(10)]
                await asyncio.sleep(0.3)
                code, details, _ = await _refused(Stub(channel).ModelStreamInfer())
                took = await _other_client(small.target)
                for call in held:
                    call.cancel()
                return code, details, took

        code, details, took = asyncio.run(asyncio.wait_for(main(), 60))
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert details == ("the server is answering 10 inference streams, as many as it may "
                       "(OPSERVE_GRPC_MAX_STREAMS); retry later")  # fmt: skip
    assert took < 5


def test_a_stream_message_takes_a_call_slot_only_while_it_is_served(served: Served) -> None:
    """With every call slot of the client held (unary calls whose message has not come), a
    stream's message is answered in the stream with the refusal, and the stream goes on; with
    one slot free its next message is answered; answered, the stream holds none: the client's
    CALLS slots can all be held again beside it."""

    async def hold(channel: grpc.aio.Channel, count: int) -> list[grpc.aio.StreamUnaryCall]:
        calls = [channel.stream_unary(INFER)() for _ in range(count)]  # headers, no message
        await asyncio.sleep(0.3)
        return calls

    async def answered_once_free(stream: Any) -> pb.ModelStreamInferResponse:
        """The stream's next message answered, once the server has seen a held call end (its
        slot comes back a moment after the cancel, later on a busy host)."""
        deadline = time.monotonic() + 10
        while True:
            await stream.write(tile_call())
            response: pb.ModelStreamInferResponse = await stream.read()
            if "gRPC calls open" not in response.error_message or time.monotonic() > deadline:
                return response
            await asyncio.sleep(0.1)

    async def main() -> tuple[str, int, grpc.StatusCode]:
        async with connection(served.target) as channel, connection(served.target) as other:
            stream = Stub(channel).ModelStreamInfer()
            held = await hold(other, CALLS)
            await stream.write(tile_call())
            refused: pb.ModelStreamInferResponse = await stream.read()
            held.pop().cancel()
            answered = await answered_once_free(stream)
            held += await hold(other, 1)  # the stream's slot was given back with its answer
            with pytest.raises(grpc.aio.AioRpcError) as full:
                await Stub(other).ServerLive(pb.ServerLiveRequest(), timeout=5)
            for call in held:
                call.cancel()
            again = await answered_once_free(stream)
            await stream.done_writing()
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.gather(*held, return_exceptions=True)
            assert await stream.code() == grpc.StatusCode.OK
            return (
                refused.error_message,
                len(answered.infer_response.outputs) + len(again.infer_response.outputs),
                full.value.code(),
            )

    refused, outputs, full = asyncio.run(asyncio.wait_for(main(), 60))
    assert refused == (f"this client (loopback) has {CALLS} gRPC calls open, as many as one "
                       "client may (OPSERVE_GRPC_MAX_CALLS_PER_CLIENT); end some, or retry later")  # fmt: skip
    assert outputs == 2
    assert full == grpc.StatusCode.RESOURCE_EXHAUSTED  # the CALLS held again: the slots were full
