"""Hostile gRPC clients, each bounded in memory and time while the server stays live and a
small call is answered within a second: a message over the size limit, a stream opened and
left silent, a stream whose answers are never read, 1,000 concurrent streams over ten
connections (and more than OPSERVE_GRPC_MAX_STREAMS), raw contents whose length disagrees with
the shape, and a call that sends its headers and never its message."""

import asyncio
import contextlib
import time
from collections.abc import Iterator

import grpc
import numpy as np
import pytest
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc

from tests.grpc.conftest import Served, serve_grpc

MiB = 1 << 20
STREAMS = 1000
LIMITS = {"max_request_bytes": str(MiB), "body_timeout_seconds": "1", "send_timeout_seconds": "1",
          "grpc_max_calls": str(STREAMS + 10), "memory_budget_bytes": str(64 * MiB),
          # one client holds them all here (as a proxy's address does); the per-client bound
          # has tests of its own (test_call_slots.py)
          "grpc_max_calls_per_client": str(STREAMS + 10), "grpc_max_streams": str(STREAMS + 10),
          "grpc_max_streams_per_client": str(STREAMS + 10)}  # fmt: skip


@pytest.fixture(scope="module")
def hostile() -> Iterator[Served]:
    with serve_grpc(**LIMITS) as served:
        yield served


def _tile(
    repeats: int = 2, raw: bytes | None = None, shape: list[int] | None = None
) -> pb.ModelInferRequest:
    request = pb.ModelInferRequest(model_name="Tile", model_version="13")
    request.inputs.add(name="input", datatype="FP32", shape=shape or [2, 3])
    request.inputs.add(name="repeats", datatype="INT64", shape=[2])
    request.raw_input_contents.extend([raw if raw is not None else np.ones(6, np.float32).tobytes(),
                                       np.array([repeats, 1], np.int64).tobytes()])  # fmt: skip
    return request


def _small_call_is_quick(served: Served) -> None:
    with grpc.insecure_channel(served.target) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        started = time.monotonic()
        answer = stub.ModelInfer(_tile(), timeout=5)
        assert time.monotonic() - started < 1.0
        assert list(answer.outputs[0].shape) == [4, 3]
        assert stub.ServerLive(pb.ServerLiveRequest(), timeout=5).live


def test_a_message_over_the_size_limit(hostile: Served) -> None:
    with grpc.insecure_channel(hostile.target) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        big = np.ones(2 * MiB // 4, np.float32).tobytes()
        started = time.monotonic()
        with pytest.raises(grpc.RpcError) as refused:
            stub.ModelInfer(_tile(raw=big, shape=[len(big) // 4]), timeout=10)
        assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "larger than max" in (refused.value.details() or "")
        assert time.monotonic() - started < 2
    _small_call_is_quick(hostile)


def test_raw_contents_whose_length_disagrees_with_the_shape(hostile: Served) -> None:
    with grpc.insecure_channel(hostile.target) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        with pytest.raises(grpc.RpcError) as refused:
            stub.ModelInfer(_tile(raw=b"\x00" * 20), timeout=5)
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert refused.value.details() == ("Tile-13: inputs.input: binary_data_size is 20 bytes but "
                                       "shape [2, 3] of float needs 24")  # fmt: skip


def test_a_call_that_never_sends_its_message(hostile: Served) -> None:
    async def main() -> tuple[grpc.StatusCode, str, float]:
        async with grpc.aio.insecure_channel(hostile.target) as channel:
            # a unary method, its headers sent and its message never: the client half of a
            # stream call, on the same path
            call = channel.stream_unary("/inference.GRPCInferenceService/ModelInfer")()
            started = time.monotonic()
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await asyncio.wait_for(call, 10)
            error = refused.value
            return error.code(), error.details() or "", time.monotonic() - started

    code, details, seconds = asyncio.run(asyncio.wait_for(main(), 60))
    assert code == grpc.StatusCode.DEADLINE_EXCEEDED and seconds < 3
    assert details == ("the request body did not all arrive within 1 s "
                       "(OPSERVE_BODY_TIMEOUT_SECONDS)")  # fmt: skip
    _small_call_is_quick(hostile)


def test_a_silent_stream_and_a_stream_never_read(hostile: Served) -> None:
    """The server ends a stream whose answers are not taken within the send timeout: it stops
    reading and working for it at once; its status reaches the client once it reads again
    (HTTP/2 sends it after the data the client left unread)."""
    before = hostile.http.rss_bytes()

    async def main() -> tuple[grpc.StatusCode, str, int]:
        async with grpc.aio.insecure_channel(hostile.target) as channel:
            stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
            silent = stub.ModelStreamInfer()  # opened, never written to
            unread = stub.ModelStreamInfer()
            big = _tile(repeats=64 * 1024)  # 1.5 MiB answers: a few fill the flow control windows

            async def flood() -> None:
                for _ in range(40):
                    await unread.write(big)

            writing = asyncio.create_task(flood())
            await asyncio.sleep(3)  # the send timeout (1 s) has passed
            await asyncio.to_thread(_small_call_is_quick, hostile)
            assert hostile.http.rss_bytes() - before < 150 * MiB
            writing.cancel()
            answers = 0
            with pytest.raises(grpc.aio.AioRpcError):
                while True:
                    if await unread.read() is grpc.aio.EOF:
                        break
                    answers += 1
            code, details = await unread.code(), await unread.details()
            await asyncio.to_thread(_small_call_is_quick, hostile)
            silent.cancel()
            return code, details, answers

    code, details, answers = asyncio.run(asyncio.wait_for(main(), 60))
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED and answers < 40
    assert details == "the client read none of the answer within 1 s (OPSERVE_SEND_TIMEOUT_SECONDS)"


def connection(target: str) -> grpc.aio.Channel:
    """A channel on a connection of its own (grpc shares one between channels to the same
    target with the same arguments): each holds at most OPSERVE_GRPC_MAX_STREAMS_PER_CONNECTION
    calls open."""
    return grpc.aio.insecure_channel(target, options=[("grpc.use_local_subchannel_pool", 1)])


async def _finish(call: grpc.aio.StreamStreamCall) -> grpc.StatusCode:
    """The status of a call, once its answers are read (a call's status comes after them)."""
    with contextlib.suppress(grpc.aio.AioRpcError):
        while await call.read() is not grpc.aio.EOF:
            pass
    return await call.code()


async def _refusal(call: grpc.aio.StreamStreamCall) -> grpc.StatusCode:
    """The status of a call the server refused. When the refusal closed the stream while the
    client was sending its first message, grpc-core reports the client's failed send instead
    (INTERNAL, "Failed execute_batch"): the server's status is lost to that race, not wrong."""
    code = await call.code()
    if code == grpc.StatusCode.INTERNAL and "execute_batch" in await call.debug_error_string():
        return grpc.StatusCode.RESOURCE_EXHAUSTED
    return code


def test_a_thousand_concurrent_streams_and_more_than_the_limit(hostile: Served) -> None:
    before = hostile.http.rss_bytes()

    async def main() -> list[grpc.StatusCode]:
        channels = [connection(hostile.target) for _ in range(STREAMS // 100)]
        stubs = [service_pb2_grpc.GRPCInferenceServiceStub(channel) for channel in channels]
        streams = [stub.ModelStreamInfer() for stub in stubs for _ in range(100)]
        for stream in streams:
            await stream.write(_tile())
        answers = await asyncio.gather(*(stream.read() for stream in streams))
        assert all(not a.error_message for a in answers)
        await asyncio.to_thread(_small_call_is_quick, hostile)
        async with connection(hostile.target) as other:  # a connection with streams free
            more = service_pb2_grpc.GRPCInferenceServiceStub(other)
            over = [more.ModelStreamInfer() for _ in range(30)]
            for call in over:  # a client stream's call starts with its first message
                # refused already: the write fails, as InvalidStateError, or as an
                # AioRpcError when the refusal lands while the message is being sent
                with contextlib.suppress(asyncio.InvalidStateError, grpc.aio.AioRpcError):
                    await call.write(_tile())
            await asyncio.sleep(0.5)  # the refusals have come; the ten admitted are open
            codes = [await _refusal(call) for call in over if call.done()]
            for call in over:
                with contextlib.suppress(asyncio.InvalidStateError):
                    await call.done_writing()
            await asyncio.gather(*(_finish(call) for call in over))
        for stream in streams:
            await stream.done_writing()
        await asyncio.gather(*(stream.code() for stream in streams))
        for channel in channels:
            await channel.close()
        return list(codes)

    codes = asyncio.run(asyncio.wait_for(main(), 60))
    assert codes == [grpc.StatusCode.RESOURCE_EXHAUSTED] * 20  # past the limit of 1,010
    assert hostile.http.rss_bytes() - before < 200 * MiB
    _small_call_is_quick(hostile)


def test_the_limit_says_so_with_a_retry_hint(hostile: Served) -> None:
    async def main() -> tuple[grpc.StatusCode, str, grpc.aio.Metadata | None]:
        channels = [connection(hostile.target) for _ in range(STREAMS // 100 + 1)]
        stubs = [service_pb2_grpc.GRPCInferenceServiceStub(channel) for channel in channels]
        held = [stub.ModelStreamInfer() for stub in stubs[:-1] for _ in range(100)]
        held += [stubs[-1].ModelStreamInfer() for _ in range(10)]
        for stream in held:
            await stream.write(_tile())
        await asyncio.gather(*(stream.read() for stream in held))
        answer = await stubs[-1].ModelInfer(_tile(), timeout=5)  # open streams hold no call slot
        assert list(answer.outputs[0].shape) == [4, 3]
        more = stubs[-1].ModelStreamInfer()
        refused = (await more.code(), await more.details(), await more.trailing_metadata())
        for stream in held:
            stream.cancel()
        for channel in channels:
            await channel.close()
        return refused

    code, details, trailing = asyncio.run(asyncio.wait_for(main(), 60))
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert details == (f"the server is answering {STREAMS + 10} inference streams, as many as it "
                       "may (OPSERVE_GRPC_MAX_STREAMS); retry later")  # fmt: skip
    assert ("retry-after", "1") in list(trailing or ())
    _small_call_is_quick(hostile)
