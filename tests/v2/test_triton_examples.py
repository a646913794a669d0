"""Triton's Python example clients over HTTP (client repository, src/python/examples), their
calls and their checks replayed with tritonclient.http against opserve serving Triton's example
repository (tests/triton_examples.py): simple_http_health_metadata, simple_http_infer_client,
simple_http_async_infer_client, simple_http_aio_infer_client, simple_http_string_infer_client,
simple_http_shm_client, simple_http_shm_string_client, reuse_infer_objects_client,
simple_http_model_control, simple_http_sequence_sync_infer_client (and its -d mode),
image_client (classification with labels) and memory_growth_test. The scripts themselves
are not part of this project; these tests make the same calls and assert what they check."""

import asyncio
import os
import warnings
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient
import tritonclient.http.aio as aioclient
import tritonclient.utils.shared_memory as shm
from tritonclient.utils import InferenceServerException, serialize_byte_tensor

from tests.api.live_server import Server, serve
from tests.triton_examples import VULTURE, write_repository

IN0 = np.arange(16, dtype=np.int32).reshape(1, 16)
IN1 = np.full((1, 16), -1, dtype=np.int32)
ONES = np.ones((1, 16), dtype=np.int32)
SHM = f"/opserve_examples_{os.getpid()}"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    root = write_repository(tmp_path_factory.mktemp("models"))
    with serve(model_repository=str(root), allow_client_shm="true",
               server_name="triton") as running:  # fmt: skip
        yield running


@pytest.fixture
def client(server: Server) -> Iterator[httpclient.InferenceServerClient]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        triton = httpclient.InferenceServerClient(f"127.0.0.1:{server.port}")
    yield triton
    triton.close()


def _inputs(binary0: bool, binary1: bool, in1: np.ndarray = IN1) -> list[httpclient.InferInput]:
    a = httpclient.InferInput("INPUT0", [1, 16], "INT32")
    a.set_data_from_numpy(IN0, binary_data=binary0)
    b = httpclient.InferInput("INPUT1", [1, 16], "INT32")
    b.set_data_from_numpy(in1, binary_data=binary1)
    return [a, b]


def test_simple_http_health_metadata(client: httpclient.InferenceServerClient) -> None:
    assert client.is_server_live(query_params={"test_1": 1, "test_2": 2})
    assert client.is_server_ready() and client.is_model_ready("simple")
    assert client.get_server_metadata()["name"] == "triton"
    assert client.get_model_metadata("simple", query_params={"test_1": 1})["name"] == "simple"
    with pytest.raises(InferenceServerException, match="Request for unknown model"):
        client.get_model_metadata("wrong_model_name")


@pytest.mark.parametrize("compression", [None, "gzip", "deflate"])
def test_simple_http_infer_client(client: httpclient.InferenceServerClient,
                                  compression: str | None) -> None:  # fmt: skip
    outputs = [httpclient.InferRequestedOutput("OUTPUT0", binary_data=True),
               httpclient.InferRequestedOutput("OUTPUT1", binary_data=False)]  # fmt: skip
    for requested in (outputs, None):  # named outputs, then binary_data_output
        result = client.infer("simple", _inputs(False, True), outputs=requested,
                              query_params={"test_1": 1, "test_2": 2},
                              request_compression_algorithm=compression,
                              response_compression_algorithm=compression)  # fmt: skip
        assert len(client.get_inference_statistics("simple")["model_stats"]) == 1
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), IN0 + IN1)
        np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), IN0 - IN1)
    with pytest.raises(InferenceServerException) as caught:
        client.infer("wrong_model_name", _inputs(False, True), outputs=outputs)
    assert caught.value.message().startswith("Request for unknown model")


def test_simple_http_async_infer_client(server: Server) -> None:
    triton = httpclient.InferenceServerClient(f"127.0.0.1:{server.port}", concurrency=2)
    pending = [triton.async_infer("simple", _inputs(True, True, ONES)) for _ in range(2)]
    for request in pending:
        result = request.get_result()
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), IN0 + ONES)
        np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), IN0 - ONES)
    triton.close()


def test_simple_http_aio_infer_client(server: Server) -> None:
    async def run() -> None:
        triton = aioclient.InferenceServerClient(f"127.0.0.1:{server.port}")
        result = await triton.infer("simple", _inputs(False, True))
        np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), IN0 - IN1)
        stats = await triton.get_inference_statistics("simple")
        assert len(stats["model_stats"]) == 1
        both = await asyncio.gather(*(triton.infer("simple", _inputs(True, True))
                                      for _ in range(2)))  # fmt: skip
        for result in both:
            np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), IN0 + IN1)
        with pytest.raises(InferenceServerException, match=r"^\[404\] Request for unknown model"):
            await triton.infer("wrong_model_name", _inputs(False, True))
        await triton.close()

    asyncio.run(run())


def test_simple_http_string_infer_client(client: httpclient.InferenceServerClient) -> None:
    strings0 = np.array([[str(x) for x in IN0[0]]], dtype=np.object_)
    strings1 = np.array([["1"] * 16], dtype=np.object_)
    a = httpclient.InferInput("INPUT0", [1, 16], "BYTES")
    a.set_data_from_numpy(strings0, binary_data=True)
    b = httpclient.InferInput("INPUT1", [1, 16], "BYTES")
    b.set_data_from_numpy(strings1, binary_data=False)
    outputs = [httpclient.InferRequestedOutput("OUTPUT0", binary_data=True),
               httpclient.InferRequestedOutput("OUTPUT1", binary_data=False)]  # fmt: skip
    result = client.infer("simple_string", [a, b], outputs=outputs)
    sums = [int(x) for x in result.as_numpy("OUTPUT0").reshape(-1)]
    differences = [int(x) for x in result.as_numpy("OUTPUT1").reshape(-1)]
    assert sums == list(IN0[0] + 1) and differences == list(IN0[0] - 1)
    for data in (np.array([["he\x00llo"] * 16], dtype=np.object_),
                 np.array([[b"\x00\x01\x02\x03"] * 16], dtype=np.object_)):  # fmt: skip
        for binary in (True, False):
            echo = httpclient.InferInput("INPUT0", [1, 16], "BYTES")
            echo.set_data_from_numpy(data, binary_data=binary)
            back = client.infer("simple_identity", [echo]).as_numpy("OUTPUT0")
            text = [x if isinstance(x, bytes) else x.encode() for x in back.reshape(-1)]
            expected = [x if isinstance(x, bytes) else x.encode() for x in data.reshape(-1)]
            assert text == expected


@pytest.fixture
def regions(client: httpclient.InferenceServerClient) -> Iterator[list]:
    client.unregister_system_shared_memory()
    client.unregister_cuda_shared_memory()
    made: list = []
    yield made
    client.unregister_system_shared_memory()
    for handle in made:
        shm.destroy_shared_memory_region(handle)


def _shared(client: httpclient.InferenceServerClient, made: list, name: str,
            data: list[np.ndarray] | None, size: int) -> object:  # fmt: skip
    handle = shm.create_shared_memory_region(name, f"{SHM}_{name}", size)
    made.append(handle)
    if data is not None:
        shm.set_shared_memory_region(handle, data)
    client.register_system_shared_memory(name, f"{SHM}_{name}", size)
    return handle


def test_simple_http_shm_client(client: httpclient.InferenceServerClient, regions: list) -> None:
    output = _shared(client, regions, "output_data", None, 128)
    _shared(client, regions, "input_data", [IN0, ONES], 128)
    inputs = _inputs(True, True)
    inputs[0].set_shared_memory("input_data", 64)
    inputs[1].set_shared_memory("input_data", 64, offset=64)
    outputs = [httpclient.InferRequestedOutput("OUTPUT0", binary_data=False),
               httpclient.InferRequestedOutput("OUTPUT1", binary_data=False)]  # fmt: skip
    outputs[0].set_shared_memory("output_data", 64)
    outputs[1].set_shared_memory("output_data", 64, offset=64)
    result = client.infer("simple", inputs, outputs=outputs)
    first, second = result.get_output("OUTPUT0"), result.get_output("OUTPUT1")
    assert first["datatype"] == "INT32" and second["shape"] == [1, 16]
    sums = shm.get_contents_as_numpy(output, np.int32, first["shape"])
    differences = shm.get_contents_as_numpy(output, np.int32, second["shape"], offset=64)
    np.testing.assert_array_equal(sums, IN0 + ONES)
    np.testing.assert_array_equal(differences, IN0 - ONES)
    assert {r["name"] for r in client.get_system_shared_memory_status()} == {"input_data",
                                                                            "output_data"}  # fmt: skip


def test_simple_http_shm_string_client(client: httpclient.InferenceServerClient,
                                       regions: list) -> None:  # fmt: skip
    strings = [np.array([[str(x) for x in IN0[0]]], dtype=np.object_),
               np.array([["1"] * 16], dtype=np.object_)]  # fmt: skip
    serialized = [serialize_byte_tensor(s) for s in strings]
    sizes = [len(s.item()) for s in serialized]
    expected = [np.array([[str(x) for x in IN0[0] + 1]], dtype=np.object_),
                np.array([[str(x) for x in IN0[0] - 1]], dtype=np.object_)]  # fmt: skip
    out_sizes = [len(serialize_byte_tensor(e).item()) for e in expected]
    outs = [_shared(client, regions, f"output{i}_data", None, out_sizes[i]) for i in (0, 1)]
    for i in (0, 1):
        raw = np.frombuffer(serialized[i].item(), dtype=np.uint8)
        _shared(client, regions, f"input{i}_data", [raw], sizes[i])
    inputs = [httpclient.InferInput(f"INPUT{i}", [1, 16], "BYTES") for i in (0, 1)]
    outputs = [httpclient.InferRequestedOutput(f"OUTPUT{i}", binary_data=True) for i in (0, 1)]
    for i in (0, 1):
        inputs[i].set_shared_memory(f"input{i}_data", sizes[i])
        outputs[i].set_shared_memory(f"output{i}_data", out_sizes[i])
    result = client.infer("simple_string", inputs, outputs=outputs)
    for i in (0, 1):
        shape = result.get_output(f"OUTPUT{i}")["shape"]
        got = shm.get_contents_as_numpy(outs[i], np.object_, shape)
        assert [x.decode() for x in got.reshape(-1)] == list(expected[i].reshape(-1))


def test_reuse_infer_objects_client(client: httpclient.InferenceServerClient,
                                    regions: list) -> None:  # fmt: skip
    """The same InferInput/InferRequestedOutput objects with shared memory, without it
    (unset_shared_memory), and with it again."""
    _shared(client, regions, "input0_data", [IN0], 64)
    _shared(client, regions, "input1_data", [ONES], 64)
    out0 = _shared(client, regions, "output0_data", None, 64)
    _shared(client, regions, "output1_data", None, 64)
    inputs = _inputs(True, True, ONES)
    outputs = [httpclient.InferRequestedOutput(f"OUTPUT{i}", binary_data=True) for i in (0, 1)]
    for round_ in ("shm", "plain", "shm"):
        for i in (0, 1):
            if round_ == "shm":
                inputs[i].set_shared_memory(f"input{i}_data", 64)
                outputs[i].set_shared_memory(f"output{i}_data", 64)
            else:
                inputs[i].set_data_from_numpy(IN0 if i == 0 else ONES * 2)
                outputs[i].unset_shared_memory()
        result = client.infer("simple", inputs, outputs=outputs)
        if round_ == "shm":
            got = shm.get_contents_as_numpy(out0, np.int32, [1, 16])
            np.testing.assert_array_equal(got, IN0 + ONES)
        else:
            np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), IN0 + ONES * 2)


def _sequence(client: httpclient.InferenceServerClient, model: str, sequence_id: int | str,
              values: list[int]) -> list[int]:  # fmt: skip
    answers = []
    for i, value in enumerate(values):
        data = httpclient.InferInput("INPUT", [1, 1], "INT32")
        data.set_data_from_numpy(np.array([[value]], dtype=np.int32))
        result = client.infer(model, [data], sequence_id=sequence_id,
                              sequence_start=i == 0, sequence_end=i == len(values) - 1,
                              outputs=[httpclient.InferRequestedOutput("OUTPUT")])  # fmt: skip
        answers.append(int(result.as_numpy("OUTPUT")[0][0]))
    return answers


VALUES = [11, 7, 5, 3, 2, 0, 1]


def test_simple_http_sequence_sync_infer_client(client: httpclient.InferenceServerClient) -> None:
    """Three sequences back to back: READY * (INPUT + START), as the script expects."""
    first = _sequence(client, "simple_sequence", 1000, [0, *VALUES])
    second = _sequence(client, "simple_sequence", 1001, [100, *(-v for v in VALUES)])
    third = _sequence(client, "simple_sequence", "a-string-id", [20, *(-v for v in VALUES)])
    assert first == [1, *VALUES]
    assert second == [101, *(-v for v in VALUES)]
    assert third == [21, *(-v for v in VALUES)]


def test_simple_http_sequence_sync_infer_client_dyna(
    client: httpclient.InferenceServerClient,
) -> None:
    """-d: END adds the correlation id; the string-id model accumulates (implicit state)."""
    first = _sequence(client, "simple_dyna_sequence", 1000, [0, *VALUES])
    second = _sequence(client, "simple_dyna_sequence", 1001, [100, *(-v for v in VALUES)])
    third = _sequence(client, "simple_string_dyna_sequence", "1002", [20, *(-v for v in VALUES)])
    assert first == [1, *VALUES[:-1], 1 + 1000]
    assert second == [101, *(-v for v in VALUES[:-1]), -1 + 1001]
    assert third == [20, 9, 2, -3, -6, -8, -8, -9 + 1002]


def test_interleaved_sequences_keep_their_own_state(server: Server) -> None:
    """Sequences interleaved across requests and concurrent clients: each accumulates alone."""

    async def run() -> list[list[int]]:
        triton = aioclient.InferenceServerClient(f"127.0.0.1:{server.port}")

        async def one(sequence_id: str, values: list[int]) -> list[int]:
            answers = []
            for i, value in enumerate(values):
                data = aioclient.InferInput("INPUT", [1, 1], "INT32")
                data.set_data_from_numpy(np.array([[value]], dtype=np.int32))
                result = await triton.infer("simple_string_dyna_sequence", [data],
                                            sequence_id=sequence_id, sequence_start=i == 0,
                                            sequence_end=i == len(values) - 1)  # fmt: skip
                answers.append(int(result.as_numpy("OUTPUT")[0][0]))
            return answers

        found = await asyncio.gather(*(one(str(10 * n), [n, 1, 2, 3]) for n in range(1, 6)))
        await triton.close()
        return list(found)

    for n, answers in enumerate(asyncio.run(run()), start=1):
        assert answers == [n, n + 1, n + 3, n + 6 + 10 * n]


def test_a_sequence_that_was_never_started_is_refused(
    client: httpclient.InferenceServerClient,
) -> None:
    data = httpclient.InferInput("INPUT", [1, 1], "INT32")
    data.set_data_from_numpy(np.array([[1]], dtype=np.int32))
    with pytest.raises(InferenceServerException, match=(
            "inference request for sequence 777 to model 'simple_sequence' must specify the "
            "START flag on the first request of the sequence")) as caught:  # fmt: skip
        client.infer("simple_sequence", [data], sequence_id=777)
    assert caught.value.status() == "400"
    with pytest.raises(InferenceServerException, match="must specify a non-zero or non-empty "
                       "correlation ID"):  # fmt: skip
        client.infer("simple_sequence", [data])


def test_image_client_classification(client: httpclient.InferenceServerClient) -> None:
    """image_client.py: metadata and config as it reads them (one input in FORMAT_NCHW, a
    vector output), then `class_count` top classes as "value:index:label"."""
    metadata = client.get_model_metadata("densenet_onnx")
    config = client.get_model_config("densenet_onnx")
    assert len(metadata["inputs"]) == 1 and metadata["outputs"][0]["datatype"] == "FP32"
    assert config["input"][0]["format"] == "FORMAT_NCHW"
    assert isinstance(config["max_batch_size"], int) and config["max_batch_size"] == 0
    image = httpclient.InferInput("data_0", [3, 4, 4], "FP32")
    image.set_data_from_numpy(np.ones((3, 4, 4), dtype=np.float32))
    scores = httpclient.InferRequestedOutput("fc6_1", binary_data=True, class_count=3)
    result = client.infer("densenet_onnx", [image], outputs=[scores], request_id="1")
    assert result.get_response()["id"] == "1"
    classes = ["".join(chr(x) for x in c).split(":") if not isinstance(c, bytes)
               else c.decode().split(":") for c in result.as_numpy("fc6_1")]  # fmt: skip
    assert classes[0] == ["3.000000", str(VULTURE), "VULTURE"]
    assert [int(c[1]) for c in classes] == [VULTURE, 31, 30]


def test_memory_growth_test(server: Server) -> None:
    """A new client per request, each answer the input (custom_identity_int32)."""
    data = np.arange(64, dtype=np.int32).reshape(1, 64)
    for _ in range(20):
        triton = httpclient.InferenceServerClient(f"127.0.0.1:{server.port}")
        given = httpclient.InferInput("INPUT0", [1, 64], "INT32")
        given.set_data_from_numpy(data)
        got = triton.infer("custom_identity_int32", [given]).as_numpy("OUTPUT0")
        assert got.dtype == np.int32 and got.shape == data.shape
        np.testing.assert_array_equal(got, data)
        triton.close()


def test_perf_analyzers_start_up_calls(client: httpclient.InferenceServerClient) -> None:
    """What perf_analyzer reads: metadata, config, the server's extensions, and statistics
    with a string version and numbers everywhere else."""
    assert client.get_model_metadata("simple")["inputs"][0]["shape"] == [-1, 16]
    config = client.get_model_config("simple")
    assert config["max_batch_size"] == 8 and config["input"][0]["is_shape_tensor"] is False
    assert "statistics" in client.get_server_metadata()["extensions"]
    client.infer("simple", _inputs(True, True))
    (stats,) = client.get_inference_statistics("simple", "1")["model_stats"]
    assert stats["version"] == "1"
    assert stats["inference_count"] >= 1 and isinstance(stats["execution_count"], int)
    for phase in ("success", "queue", "compute_input", "compute_infer", "compute_output",
                  "cache_hit", "cache_miss"):  # fmt: skip
        assert set(stats["inference_stats"][phase]) == {"count", "ns"}
        assert all(isinstance(v, int) for v in stats["inference_stats"][phase].values())


def test_simple_http_model_control(tmp_path: Path) -> None:
    """Explicit model control over a repository of seven models, as the script counts them."""
    root = write_repository(tmp_path, ["simple", "simple_int8", "simple_string",
                                       "simple_identity", "simple_sequence",
                                       "simple_dyna_sequence", "densenet_onnx"])  # fmt: skip
    with serve(model_repository=str(root),
               model_control_mode="explicit", strict_readiness="false") as server:  # fmt: skip
        triton = httpclient.InferenceServerClient(f"127.0.0.1:{server.port}")
        assert len(triton.get_model_repository_index()) == 7
        triton.load_model("simple")
        assert triton.is_model_ready("simple")
        with pytest.raises(InferenceServerException, match="failed to load"):
            triton.load_model("simple", config='"parameters": {"config": {{"max_batch_size": '
                              '"16"}}}')  # the script's malformed override  # fmt: skip
        assert triton.is_model_ready("simple")  # a load that fails leaves it serving
        triton.load_model("simple", config='{"max_batch_size":"16"}')
        assert triton.get_model_config("simple")["max_batch_size"] == 16
        triton.unload_model("simple")
        assert not triton.is_model_ready("simple")
        with pytest.raises(InferenceServerException, match="failed to load"):
            triton.load_model("wrong_model_name")
        triton.close()
