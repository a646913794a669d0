"""The gRPC floor of bench_http.py: the least a grpc.aio server can do for the bench's
ModelInfer call (and its ModelStreamInfer form), on uvicorn's event loop as the service's gRPC
server runs.

An ASGI app whose lifespan starts a raw grpc.aio server on OPSERVE_GRPC_PORT with a generic
handler for each: it parses the request (as the service must) and answers fixed bytes, the
service's own answer to the bench request, so both send the same bytes (less, on the stream,
the service's `triton_final_response` flag). Serve it with
`OPSERVE_GRPC_PORT=... uvicorn bench.floor_grpc_app:app`.
"""

import os
from typing import Any

import grpc
import numpy as np
from tritonclient.grpc import service_pb2 as pb

from bench.floor_app import lifespan

METHOD = "/inference.GRPCInferenceService/ModelInfer"
STREAM_METHOD = "/inference.GRPCInferenceService/ModelStreamInfer"
TILED = np.tile(np.arange(1, 7, dtype=np.float32).reshape(2, 3), (2, 2))
RESPONSE = pb.ModelInferResponse(
    model_name="Tile", model_version="13",
    outputs=[pb.ModelInferResponse.InferOutputTensor(name="output", datatype="FP32", shape=[4, 6])],
    raw_output_contents=[TILED.tobytes()],
).SerializeToString()  # fmt: skip
STREAMED = pb.ModelStreamInferResponse(infer_response=pb.ModelInferResponse.FromString(RESPONSE),
                                       ).SerializeToString()  # fmt: skip
_SERVERS: list[grpc.aio.Server] = []


async def _answer(request: bytes, context: Any) -> bytes:
    pb.ModelInferRequest.FromString(request)
    return RESPONSE


async def _stream(requests: Any, context: Any) -> None:
    async for request in requests:
        pb.ModelInferRequest.FromString(request)
        await context.write(STREAMED)


def _start() -> None:
    server = grpc.aio.server()
    handlers = {"ModelInfer": grpc.unary_unary_rpc_method_handler(_answer),  # bytes both ways
                "ModelStreamInfer": grpc.stream_stream_rpc_method_handler(_stream)}  # fmt: skip
    server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler(
        "inference.GRPCInferenceService", handlers)])  # fmt: skip
    server.add_insecure_port(f"127.0.0.1:{os.environ['OPSERVE_GRPC_PORT']}")
    _SERVERS.append(server)


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """Raw ASGI: the lifespan starts the gRPC server; HTTP requests are not expected."""
    if scope["type"] == "lifespan":
        _start()
        await _SERVERS[0].start()
        await lifespan(receive, send)
        await _SERVERS[0].stop(None)
