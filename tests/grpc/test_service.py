"""The gRPC server around the service: health and reflection, API keys, metrics, the access
log and the request id, keepalive, shutdown on SIGTERM, and a port already taken."""

import asyncio
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator

import grpc
import numpy as np
import pytest
from fastapi.testclient import TestClient
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import (
    ProtoReflectionDescriptorDatabase,
)
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc

from service.codecs.compression import INLINE_COMPRESSED_BYTES
from service.main import create_app
from service.settings import Settings
from tests.api.live_server import ROOT, free_port
from tests.cluster.drop_proxy import drop_proxy
from tests.grpc.conftest import Served, serve_grpc

Stub = service_pb2_grpc.GRPCInferenceServiceStub


def _tile() -> pb.ModelInferRequest:
    request = pb.ModelInferRequest(model_name="Tile", model_version="13")
    request.inputs.add(name="input", datatype="INT64", shape=[2])
    request.inputs.add(name="repeats", datatype="INT64", shape=[1])
    request.raw_input_contents.extend([np.array([5, 7]).tobytes(), np.array([2]).tobytes()])
    return request


def test_health_and_reflection(served: Served) -> None:
    with grpc.insecure_channel(served.target) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        for service in ("", "inference.GRPCInferenceService"):
            answer = health.Check(health_pb2.HealthCheckRequest(service=service), timeout=5)
            assert answer.status == health_pb2.HealthCheckResponse.SERVING
        with pytest.raises(grpc.RpcError) as refused:
            health.Check(health_pb2.HealthCheckRequest(service="nope"), timeout=5)
        assert refused.value.code() == grpc.StatusCode.NOT_FOUND
        watched = health.Watch(health_pb2.HealthCheckRequest(), timeout=5)
        assert next(watched).status == health_pb2.HealthCheckResponse.SERVING
        watched.cancel()
        database = ProtoReflectionDescriptorDatabase(channel)
        assert sorted(database.get_services()) == ["grpc.health.v1.Health",
            "grpc.reflection.v1alpha.ServerReflection", "inference.GRPCInferenceService"]  # fmt: skip
        found = database.FindFileContainingSymbol("inference.GRPCInferenceService")
        assert len(found.service[0].method) == 20


def test_api_keys_from_metadata() -> None:
    with serve_grpc(api_keys="k1, k2") as served, grpc.insecure_channel(served.target) as channel:
        stub = Stub(channel)
        with pytest.raises(grpc.RpcError) as refused:
            stub.ModelInfer(_tile(), timeout=5)
        assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
        assert refused.value.details() == ("a valid API key is required: send 'Authorization: "
                                           "Bearer <key>'")  # fmt: skip
        with pytest.raises(grpc.RpcError, match="UNAUTHENTICATED"):
            stub.ModelInfer(_tile(), timeout=5, metadata=[("authorization", "Bearer k3")])
        answer = stub.ModelInfer(_tile(), timeout=5, metadata=[("authorization", "Bearer k2")])
        assert np.frombuffer(answer.raw_output_contents[0], np.int64).tolist() == [5, 7, 5, 7]
        # open without a key, as /v2/health/*: probes carry no credentials
        assert stub.ServerReady(pb.ServerReadyRequest(), timeout=5).ready
        health = health_pb2_grpc.HealthStub(channel)
        assert health.Check(health_pb2.HealthCheckRequest(), timeout=5).status == 1
        streams = stub.ModelStreamInfer(iter([_tile()]), timeout=5)
        with pytest.raises(grpc.RpcError, match="UNAUTHENTICATED"):
            list(streams)
        # a stream holds a place while open: health Watch and reflection need the key
        with pytest.raises(grpc.RpcError, match="UNAUTHENTICATED"):
            next(health.Watch(health_pb2.HealthCheckRequest(), timeout=5))
        key = [("authorization", "Bearer k1")]
        assert (
            next(health.Watch(health_pb2.HealthCheckRequest(), timeout=5, metadata=key)).status == 1
        )
        reflection = reflection_pb2_grpc.ServerReflectionStub(channel)
        ask = reflection_pb2.ServerReflectionRequest(list_services="")
        with pytest.raises(grpc.RpcError, match="UNAUTHENTICATED"):
            next(reflection.ServerReflectionInfo(iter([ask]), timeout=5))
        listed = next(reflection.ServerReflectionInfo(iter([ask]), timeout=5, metadata=key))
        assert len(listed.list_services_response.service) == 3


def test_metrics_access_log_and_request_id(capsys: pytest.CaptureFixture[str]) -> None:
    port = free_port()
    app = create_app(Settings(grpc_port=port, access_log=True, host="127.0.0.1"))
    with TestClient(app) as http, grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = Stub(channel)
        _answer, call = stub.ModelInfer.with_call(_tile(), metadata=[("x-request-id", "abc-1")])
        assert ("x-request-id", "abc-1") in list(call.trailing_metadata())
        with pytest.raises(grpc.RpcError) as refused:
            stub.ModelMetadata(pb.ModelMetadataRequest(name="nope"), timeout=5)
        made = dict(refused.value.trailing_metadata())["x-request-id"]
        assert len(made) == 32
        metrics = http.get("/metrics").text
        app.state.grpc.door.telemetry.flush()
    assert (
        'opserve_requests_total{method="GRPC",model="Tile",operator="Tile",'
        'route="/inference.GRPCInferenceService/ModelInfer",status="0",version="13"} 1.0'
    ) in metrics
    assert (
        'opserve_requests_total{method="GRPC",model="",operator="",'
        'route="/inference.GRPCInferenceService/ModelMetadata",status="5",version=""} 1.0'
    ) in metrics
    lines = [line for line in capsys.readouterr().out.splitlines() if '"GRPC"' in line]
    assert any('"request_id":"abc-1"' in line and '"status":0' in line for line in lines)
    assert any(f'"request_id":"{made}"' in line and '"status":5' in line for line in lines)


KEEPALIVE = """
import sys, time, numpy as np, tritonclient.grpc as g
options = g.KeepAliveOptions(keepalive_time_ms=1000, keepalive_timeout_ms=20000,
                             keepalive_permit_without_calls=True, http2_max_pings_without_data=0)
client = g.InferenceServerClient(sys.argv[1], keepalive_options=options)
for _ in range(3):
    assert client.is_server_live()
    time.sleep(2)
print("PASS: KeepAlive")
"""


def test_keepalive_pings_as_often_as_allowed_are_accepted() -> None:
    """simple_grpc_keepalive_client.py with pings every second, idle between calls."""
    with serve_grpc(grpc_min_ping_seconds="1") as served:
        done = subprocess.run([sys.executable, "-c", KEEPALIVE, served.target], cwd=ROOT,
                              capture_output=True, text=True, timeout=60,
                              env={**os.environ, "GRPC_VERBOSITY": "info"})  # fmt: skip
    assert done.stdout == "PASS: KeepAlive\n", done.stderr
    assert "too_many_pings" not in done.stderr


def test_sigterm_finishes_calls_in_flight_and_takes_no_new_ones() -> None:
    with serve_grpc(graceful_shutdown_seconds="10") as served:

        async def main() -> tuple[bytes, grpc.StatusCode, grpc.StatusCode]:
            async with grpc.aio.insecure_channel(served.target) as channel:
                stub = Stub(channel)
                stream = stub.ModelStreamInfer()
                await stream.write(_tile())
                assert not (await stream.read()).error_message  # an idle stream, open
                unary = channel.stream_unary("/inference.GRPCInferenceService/ModelInfer",
                                             pb.ModelInferRequest.SerializeToString,
                                             pb.ModelInferResponse.FromString)()  # fmt: skip
                answer = asyncio.ensure_future(unary)  # its headers sent, its message not yet
                await asyncio.sleep(0.5)
                served.http.process.send_signal(signal.SIGTERM)
                await asyncio.sleep(0.5)
                await unary.write(_tile())  # in flight when the signal came: answered
                await unary.done_writing()
                result = (await answer).raw_output_contents[0]
                stream_code = await stream.code()  # ended by the server, the answers it owed sent
            async with grpc.aio.insecure_channel(served.target) as fresh:
                with pytest.raises(grpc.aio.AioRpcError) as refused:
                    await Stub(fresh).ServerLive(pb.ServerLiveRequest(), timeout=2)
            return result, stream_code, refused.value.code()

        started = time.monotonic()
        result, stream_code, new_call = asyncio.run(asyncio.wait_for(main(), 30))
        assert np.frombuffer(result, np.int64).tolist() == [5, 7, 5, 7]
        assert stream_code == grpc.StatusCode.OK
        assert new_call == grpc.StatusCode.UNAVAILABLE
        assert served.http.process.wait(timeout=15) == 0
        assert time.monotonic() - started < 10  # nothing held it to the grace period
        with pytest.raises(OSError):
            urllib.request.urlopen(f"{served.http.url}/v2/health/live", timeout=2)


def test_a_grpc_port_in_use_stops_the_start() -> None:
    with serve_grpc() as served:
        done = subprocess.run([sys.executable, "-m", "service", "--port", str(free_port()),
                               "--grpc-port", str(served.grpc_port)], cwd=ROOT,
                              capture_output=True, text=True, timeout=60)  # fmt: skip
    assert done.returncode != 0
    assert f"Failed to bind to address 0.0.0.0:{served.grpc_port}" in done.stderr + done.stdout


@pytest.fixture(scope="module")
def compressing() -> Iterator[Served]:
    """Two workers that compress their answers (OPSERVE_GRPC_COMPRESSION=gzip)."""
    with serve_grpc(workers="2", grpc_compression="gzip") as served:
        yield served


def test_workers_share_the_port_and_answers_may_be_compressed(compressing: Served) -> None:
    """OPSERVE_WORKERS=2: each worker listens on the port (SO_REUSEPORT, after the fork)."""
    for _ in range(4):  # new connections, spread by the kernel
        with grpc.insecure_channel(compressing.target) as channel:
            answer = Stub(channel).ModelInfer(_tile(), timeout=10)
            assert np.frombuffer(answer.raw_output_contents[0], np.int64).tolist() == [5, 7, 5, 7]


def test_a_long_answer_goes_uncompressed_and_a_short_one_compressed(compressing: Served) -> None:
    """OPSERVE_GRPC_COMPRESSION=gzip: grpc compresses a message on the event loop (a 32 MiB
    answer held it 0.86 s), so an answer over INLINE_COMPRESSED_BYTES goes as it is
    (door.sent_as_is_if_long), a shorter one compressed, unary and on a stream alike: the
    bytes on the wire, counted by a proxy, for answers of zeros (which gzip shrinks 1000x)."""
    target = compressing.grpc_port
    with drop_proxy(target) as proxy, grpc.insecure_channel(f"127.0.0.1:{proxy.port}") as channel:
        stub = Stub(channel)  # one connection: one worker answers
        for count in (4096, INLINE_COMPRESSED_BYTES // 4 + 1, 1 << 18):
            request = pb.ModelInferRequest(model_name="ConstantOfShape", model_version="21")
            request.inputs.add(name="input", datatype="INT64", shape=[1])
            request.raw_input_contents.append(np.array([count]).tobytes())
            for streamed in (False, True):
                before = proxy.replied
                if streamed:
                    [reply] = stub.ModelStreamInfer(iter([request]), timeout=10)
                    answer = reply.infer_response
                else:
                    answer = stub.ModelInfer(request, timeout=10)
                assert answer.raw_output_contents[0] == bytes(4 * count)
                came = proxy.replied - before
                if 4 * count > INLINE_COMPRESSED_BYTES:
                    assert came > 4 * count, (count, streamed)
                else:
                    assert came < 2048, (count, streamed)


def test_a_health_watch_ends_at_sigterm_and_does_not_hold_the_stop() -> None:
    """A Watch stream (grpc's client-side health checking, a mesh) gets NOT_SERVING and ends
    when the server stops, instead of keeping it to its grace period."""
    with serve_grpc(graceful_shutdown_seconds="20") as served:

        async def main() -> tuple[list[int], grpc.StatusCode]:
            async with grpc.aio.insecure_channel(served.target) as channel:
                watch = health_pb2_grpc.HealthStub(channel).Watch(
                    health_pb2.HealthCheckRequest(service="")
                )
                statuses = [(await watch.read()).status]
                served.http.process.send_signal(signal.SIGTERM)
                while (answer := await watch.read()) is not grpc.aio.EOF:
                    statuses.append(answer.status)
                return statuses, await watch.code()

        started = time.monotonic()
        statuses, code = asyncio.run(asyncio.wait_for(main(), 15))
        assert statuses == [health_pb2.HealthCheckResponse.SERVING,
                            health_pb2.HealthCheckResponse.NOT_SERVING]  # fmt: skip
        assert code == grpc.StatusCode.OK
        assert served.http.process.wait(timeout=15) == 0
        assert time.monotonic() - started < 10  # not the 20 s grace period
