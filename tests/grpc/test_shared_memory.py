"""System shared memory over gRPC (OPSERVE_ALLOW_CLIENT_SHM=true), as Triton's
simple_grpc_shm_client.py uses it: inputs read from and outputs written to regions the client
registered, the answer naming each output with an empty raw entry; and its refusals."""

import os

import numpy as np
import pytest
import tritonclient.grpc as triton
import tritonclient.utils.shared_memory as shm
from tritonclient.utils import InferenceServerException

A = np.arange(16, dtype=np.int32)
B = np.ones(16, dtype=np.int32)


@pytest.fixture
def regions(client: triton.InferenceServerClient):  # type: ignore[no-untyped-def]
    client.unregister_system_shared_memory()
    client.unregister_cuda_shared_memory()
    made = {name: shm.create_shared_memory_region(name, f"/grpc_test_{name}", 128)
            for name in ("input_data", "output_data")}  # fmt: skip
    shm.set_shared_memory_region(made["input_data"], [A, B])
    for name in made:
        client.register_system_shared_memory(name, f"/grpc_test_{name}", 128)
    yield made
    client.unregister_system_shared_memory()
    for handle in made.values():
        shm.destroy_shared_memory_region(handle)


def test_inputs_and_outputs_in_shared_memory(
    client: triton.InferenceServerClient, regions: dict
) -> None:
    inputs = [
        triton.InferInput("INPUT0", [1, 16], "INT32"),
        triton.InferInput("INPUT1", [1, 16], "INT32"),
    ]
    inputs[0].set_shared_memory("input_data", 64)
    inputs[1].set_shared_memory("input_data", 64, offset=64)
    outputs = [triton.InferRequestedOutput("OUTPUT0"), triton.InferRequestedOutput("OUTPUT1")]
    outputs[0].set_shared_memory("output_data", 64)
    outputs[1].set_shared_memory("output_data", 64, offset=64)
    result = client.infer("simple", inputs, outputs=outputs)
    response = result.get_response()
    assert [(o.name, o.datatype, list(o.shape)) for o in response.outputs] == [
        ("OUTPUT0", "INT32", [1, 16]), ("OUTPUT1", "INT32", [1, 16])]  # fmt: skip
    assert list(response.raw_output_contents) == [b"", b""]
    sums = shm.get_contents_as_numpy(regions["output_data"], np.int32, [1, 16])
    differences = shm.get_contents_as_numpy(regions["output_data"], np.int32, [1, 16], offset=64)
    assert sums.tolist() == [(A + B).tolist()] and differences.tolist() == [(A - B).tolist()]
    status = client.get_system_shared_memory_status().regions
    assert sorted(status) == ["input_data", "output_data"]
    assert (status["input_data"].key, status["input_data"].byte_size) == (
        "/grpc_test_input_data",
        128,
    )


def test_shared_memory_refusals(client: triton.InferenceServerClient, regions: dict) -> None:
    cases = [
        (lambda: client.register_system_shared_memory("input_data", "/grpc_test_input_data", 64),
         "StatusCode.ALREADY_EXISTS", "shared memory region 'input_data' already in manager"),
        (lambda: client.get_system_shared_memory_status("nope"), "StatusCode.NOT_FOUND",
         "Unable to find system shared memory region: 'nope'"),
        (lambda: client.register_system_shared_memory("big", "/grpc_test_input_data", 4096),
         "StatusCode.INVALID_ARGUMENT", "failed to register shared memory region 'big': invalid args"),
    ]  # fmt: skip
    for call, status, text in cases:
        with pytest.raises(InferenceServerException) as refused:
            call()
        assert (refused.value.status(), refused.value.message()) == (status, text)
    unknown = triton.InferInput("INPUT0", [1, 16], "INT32")
    unknown.set_shared_memory("nope", 64)
    other = triton.InferInput("INPUT1", [1, 16], "INT32")
    other.set_data_from_numpy(B.reshape(1, 16))
    with pytest.raises(InferenceServerException) as refused:
        client.infer("simple", [unknown, other])
    assert refused.value.status() == "StatusCode.NOT_FOUND"
    assert refused.value.message().endswith("Unable to find shared memory region: 'nope'")


@pytest.mark.skipif(os.geteuid() != 0, reason="makes an object of another user")
def test_a_region_is_the_clients_own(client: triton.InferenceServerClient) -> None:
    """The server's prefix is refused; the client (root, told by its socket) registers only
    objects it owns: one of nobody's is refused, whatever its mode."""
    key = f"/grpc_test_{os.getpid()}_nobodys"
    fd = os.open(f"/dev/shm{key}", os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        os.ftruncate(fd, 64)
        os.fchown(fd, 65534, 65534)
        os.fchmod(fd, 0o666)
        cases = [
            ("/opserve-1-00ff", "cannot register shared memory region 'r' - shm key "
             "'/opserve-1-00ff' names the server's own files (its names begin with 'opserve-')"),
            (key, f"Unable to open shared memory region: '{key}': it is owned by uid 65534, "
             "not by the registering client's user (uid 0)"),
        ]  # fmt: skip
        for named, text in cases:
            with pytest.raises(InferenceServerException) as refused:
                client.register_system_shared_memory("r", named, 64)
            assert (refused.value.status(), refused.value.message()) == (
                "StatusCode.INVALID_ARGUMENT", text)  # fmt: skip
    finally:
        os.close(fd)
        os.unlink(f"/dev/shm{key}")
    assert "r" not in client.get_system_shared_memory_status().regions
