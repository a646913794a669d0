"""Every method of inference.GRPCInferenceService through tritonclient.grpc, unchanged, as
Triton's example clients call them, against Triton's example models."""

from typing import Any

import grpc
import numpy as np
import pytest
import tritonclient.grpc as triton
from tritonclient.grpc import service_pb2 as pb
from tritonclient.utils import InferenceServerException

from service.core.dataplane import EXTENSIONS
from service.core.settings_requests import SETTINGS_BODY_BYTES
from tests.triton_examples import VULTURE

A = np.arange(16, dtype=np.int32).reshape(1, 16)
B = np.ones((1, 16), dtype=np.int32)


def _simple(
    client: triton.InferenceServerClient, outputs: bool = True, **options: object
) -> triton.InferResult:
    inputs = [
        triton.InferInput("INPUT0", [1, 16], "INT32"),
        triton.InferInput("INPUT1", [1, 16], "INT32"),
    ]
    inputs[0].set_data_from_numpy(A)
    inputs[1].set_data_from_numpy(B)
    wanted = [triton.InferRequestedOutput("OUTPUT0"), triton.InferRequestedOutput("OUTPUT1")]
    return client.infer("simple", inputs, outputs=wanted if outputs else None, **options)  # type: ignore[arg-type]


def test_health_and_server_metadata(client: triton.InferenceServerClient) -> None:
    assert client.is_server_live(headers={"test": "1"}) and client.is_server_ready()
    metadata = client.get_server_metadata()
    assert metadata.name == "opserve" and list(metadata.extensions) == [
        *EXTENSIONS,
        "system_shared_memory",
    ]


def test_model_ready_metadata_and_config(client: triton.InferenceServerClient) -> None:
    assert client.is_model_ready("simple") and client.is_model_ready("simple", "1")
    assert not client.is_model_ready("wrong_model_name")  # OK and false (Triton, core#508)
    assert not client.is_model_ready("simple", "7")
    metadata = client.get_model_metadata("simple")
    assert (metadata.name, list(metadata.versions), metadata.platform) == (
        "simple",
        ["1"],
        "onnxruntime_onnx",
    )
    assert [(t.name, t.datatype, list(t.shape)) for t in metadata.inputs] == [
        ("INPUT0", "INT32", [-1, 16]), ("INPUT1", "INT32", [-1, 16])]  # fmt: skip
    with pytest.raises(InferenceServerException) as refused:
        client.get_model_metadata("wrong_model_name")
    assert refused.value.status() == "StatusCode.NOT_FOUND"
    assert refused.value.message().startswith(
        "Request for unknown model: 'wrong_model_name' is not found"
    )
    config = client.get_model_config("simple").config
    assert (config.name, config.max_batch_size, list(config.input[0].dims)) == ("simple", 8, [16])
    dense = client.get_model_config("densenet_onnx").config
    assert dense.input[0].format == dense.input[0].FORMAT_NCHW
    assert dense.output[0].label_filename == "densenet_labels.txt"
    tile = client.get_model_config("Tile", "13").config  # an operator's, derived from its schema
    assert tile.name == "Tile"


def test_infer_raw_with_and_without_outputs(client: triton.InferenceServerClient) -> None:
    for outputs in (True, False):
        result = _simple(client, outputs, request_id="my request id", headers={"test": "1"},
                         client_timeout=10)  # fmt: skip
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), A + B)
        np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), A - B)
        response = result.get_response()
        assert (response.model_name, response.model_version, response.id) == (
            "simple",
            "1",
            "my request id",
        )
        assert [o.name for o in response.outputs] == ["OUTPUT0", "OUTPUT1"]


@pytest.mark.parametrize("algorithm", ["gzip", "deflate", None])
def test_compressed_requests(client: triton.InferenceServerClient, algorithm: str | None) -> None:
    result = _simple(client, compression_algorithm=algorithm)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), A + B)


def test_classification_with_labels(client: triton.InferenceServerClient) -> None:
    image = triton.InferInput("data_0", [3, 4, 4], "FP32")
    image.set_data_from_numpy(np.ones((3, 4, 4), np.float32))
    result = client.infer("densenet_onnx", [image],
                          outputs=[triton.InferRequestedOutput("fc6_1", class_count=2)])  # fmt: skip
    top = [x.decode().split(":") for x in result.as_numpy("fc6_1")]
    assert top[0][1:] == [str(VULTURE), "VULTURE"] and len(top) == 2
    assert result.get_output("fc6_1").datatype == "BYTES"


def test_strings_with_nul_bytes_round_trip(client: triton.InferenceServerClient) -> None:
    words = np.array([[b"he\x00llo"] * 16, [b"\x00\x01\x02\x03"] * 16], dtype=np.object_)
    data = triton.InferInput("INPUT0", [2, 16], "BYTES")
    data.set_data_from_numpy(words)
    result = client.infer("simple_identity", [data])
    assert result.as_numpy("OUTPUT0").tolist() == words.tolist()


def test_statistics_after_a_known_mix(client: triton.InferenceServerClient) -> None:
    before = client.get_inference_statistics("simple_int8").model_stats
    assert len(before) == 1
    pair = [triton.InferInput(n, [2, 16], "INT8") for n in ("INPUT0", "INPUT1")]
    for tensor in pair:
        tensor.set_data_from_numpy(np.ones((2, 16), np.int8))
    for _ in range(3):
        client.infer("simple_int8", pair)
    wrong = triton.InferInput("INPUT0", [2, 16], "INT32")  # the model takes INT8: refused
    wrong.set_data_from_numpy(np.ones((2, 16), np.int32))
    with pytest.raises(InferenceServerException, match="INVALID_ARGUMENT"):
        client.infer("simple_int8", [wrong, pair[1]])
    after = client.get_inference_statistics("simple_int8", "1").model_stats[0]
    old = before[0]
    assert after.inference_count - old.inference_count == 6  # batches of 2
    assert after.execution_count - old.execution_count == 3
    assert after.inference_stats.success.count - old.inference_stats.success.count == 3
    assert after.inference_stats.fail.count - old.inference_stats.fail.count == 1
    assert [b.batch_size for b in after.batch_stats] == [2]
    everything = client.get_inference_statistics().model_stats
    assert {"simple", "Tile"} <= {s.name for s in everything}
    with pytest.raises(InferenceServerException, match="requested model 'nope' is not available"):
        client.get_inference_statistics("nope")


def test_repository_index(client: triton.InferenceServerClient) -> None:
    index = client.get_model_repository_index().models
    assert {m.name for m in index} >= {"simple", "simple_sequence", "densenet_onnx"}
    assert all(m.state == "READY" for m in index if m.name == "simple")


def test_cuda_shared_memory_as_a_cpu_only_triton(client: triton.InferenceServerClient) -> None:
    client.unregister_cuda_shared_memory()  # every Triton shm example starts with this
    assert not client.get_cuda_shared_memory_status().regions
    with pytest.raises(InferenceServerException) as refused:
        client.register_cuda_shared_memory("gpu", b"\x00" * 64, 0, 64)
    assert refused.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert "GPUs not supported" in refused.value.message()
    with pytest.raises(InferenceServerException, match="NOT_FOUND"):
        client.get_cuda_shared_memory_status("gpu")


def test_settings_messages_past_their_limit_are_refused(stub: Any) -> None:
    """Settings and repository messages are small, as over HTTP (core/settings_requests.py):
    past SETTINGS_BODY_BYTES, RESOURCE_EXHAUSTED in the same words; a load is not one."""
    padding = "x" * SETTINGS_BODY_BYTES
    log = pb.LogSettingsRequest()
    log.settings["log_verbose_level"].uint32_param = 0
    trace = pb.TraceSettingRequest()
    trace.settings["trace_rate"].value.append("1000")
    for method, request in (
        (stub.LogSettings, log), (stub.TraceSetting, trace),
        (stub.RepositoryIndex, pb.RepositoryIndexRequest(ready=True)),
        (stub.SystemSharedMemoryStatus, pb.SystemSharedMemoryStatusRequest()),
    ):  # fmt: skip
        assert method(request, timeout=10) is not None  # small: answered
    log.settings[padding].string_param = "?"
    trace.settings[padding].value.append("?")
    for method, request in (
        (stub.LogSettings, log), (stub.TraceSetting, trace),
        (stub.RepositoryIndex, pb.RepositoryIndexRequest(repository_name=padding)),
        (stub.RepositoryModelUnload, pb.RepositoryModelUnloadRequest(model_name=padding)),
        (stub.SystemSharedMemoryRegister, pb.SystemSharedMemoryRegisterRequest(key=padding)),
    ):  # fmt: skip
        with pytest.raises(grpc.RpcError) as refused:
            method(request, timeout=10)
        assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert f"over the limit of {SETTINGS_BODY_BYTES} bytes for a settings or repository " \
               "request" in refused.value.details()  # fmt: skip
