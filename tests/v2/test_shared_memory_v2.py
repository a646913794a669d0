"""Triton's system shared memory extension over HTTP, driven by tritonclient.http and
tritonclient.utils.shared_memory (the client side of real POSIX shared memory), as
simple_http_shm_client.py uses it: inputs read from regions, outputs written into them,
every offset and size checked, and the extension off by default."""

import os
import warnings
from collections.abc import Iterator

import numpy as np
import pytest
import tritonclient.http as triton
import tritonclient.utils.shared_memory as shm
from tritonclient.utils import InferenceServerException, serialize_byte_tensor

from tests.api.live_server import Server, serve

X = np.arange(1, 7, dtype=np.float32).reshape(2, 3)
REPEATS = np.array([2, 2], dtype=np.int64)
TILED = np.tile(X, (2, 2))
PREFIX = f"/opserve_test_{os.getpid()}"


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    with serve(allow_client_shm="true") as running:
        yield running


@pytest.fixture
def client(server: Server) -> Iterator[triton.InferenceServerClient]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        triton_client = triton.InferenceServerClient(f"127.0.0.1:{server.port}")
    triton_client.unregister_system_shared_memory()  # as every Triton example starts
    triton_client.unregister_cuda_shared_memory()
    yield triton_client
    triton_client.unregister_system_shared_memory()
    triton_client.close()


@pytest.fixture
def regions() -> Iterator[dict[str, shm.SharedMemoryRegion]]:
    """Client regions by name, destroyed after the test."""
    made: dict[str, shm.SharedMemoryRegion] = {}
    yield made
    for handle in made.values():
        shm.destroy_shared_memory_region(handle)


def _region(made: dict, client: triton.InferenceServerClient, name: str, size: int,
            register: bool = True) -> shm.SharedMemoryRegion:  # fmt: skip
    handle = shm.create_shared_memory_region(name, f"{PREFIX}_{name}", size)
    made[name] = handle
    if register:
        client.register_system_shared_memory(name, f"{PREFIX}_{name}", size)
    return handle


def _tile_inputs(input_region: str, offset: int = 0) -> list[triton.InferInput]:
    x = triton.InferInput("input", [2, 3], "FP32")
    x.set_shared_memory(input_region, X.nbytes, offset)
    r = triton.InferInput("repeats", [2], "INT64")
    r.set_data_from_numpy(REPEATS)  # one input in the body, one in shared memory
    return [x, r]


def test_inputs_and_outputs_through_shared_memory(client: triton.InferenceServerClient,
                                                  regions: dict) -> None:  # fmt: skip
    inputs = _region(regions, client, "in", 64 + X.nbytes)
    shm.set_shared_memory_region(inputs, [X], offset=64)
    out = _region(regions, client, "out", 256)
    output = triton.InferRequestedOutput("output", binary_data=False)
    output.set_shared_memory("out", TILED.nbytes, offset=8)
    result = client.infer("Tile", _tile_inputs("in", 64), outputs=[output])
    described = result.get_output("output")
    assert described == {"name": "output", "datatype": "FP32", "shape": [4, 6]}
    got = shm.get_contents_as_numpy(out, np.float32, described["shape"], offset=8)
    np.testing.assert_array_equal(got, TILED)
    status = client.get_system_shared_memory_status()
    assert status == [{"name": "in", "key": f"{PREFIX}_in", "offset": 0, "byte_size": 88},
                      {"name": "out", "key": f"{PREFIX}_out", "offset": 0, "byte_size": 256}]  # fmt: skip
    assert client.get_system_shared_memory_status("out") == [status[1]]


def test_strings_through_shared_memory(client: triton.InferenceServerClient,
                                       regions: dict) -> None:  # fmt: skip
    words = np.array(["he\x00llo", "ok"], dtype=np.object_)
    serialized = np.frombuffer(serialize_byte_tensor(words).item(), dtype=np.uint8)
    inputs = _region(regions, client, "words", serialized.nbytes)
    shm.set_shared_memory_region(inputs, [serialized])
    out = _region(regions, client, "tiled", 64)
    text = triton.InferInput("input", [2], "BYTES")
    text.set_shared_memory("words", serialized.nbytes)
    repeats = triton.InferInput("repeats", [1], "INT64")
    repeats.set_data_from_numpy(np.array([2]), binary_data=False)
    output = triton.InferRequestedOutput("output", binary_data=False)
    output.set_shared_memory("tiled", 64)
    client.infer("Tile", [text, repeats], outputs=[output])
    got = shm.get_contents_as_numpy(out, np.object_, [4])
    assert [x.decode() if isinstance(x, bytes) else x for x in got] == ["he\x00llo", "ok"] * 2


@pytest.mark.parametrize(("offset", "size", "words"), [
    (0, 24, None),  # the whole region: fine
    (24, 24, "Invalid offset for shared memory region: 'in'"),  # offset at the end
    (8, 24, "Invalid offset + byte size for shared memory region: 'in'"),  # one past
    (0, 20, "binary_data_size is 20 bytes but shape [2, 3] of float needs 24"),
])  # fmt: skip
def test_input_offsets_and_sizes_at_and_past_the_edges(
    client: triton.InferenceServerClient, regions: dict, offset: int, size: int,
    words: str | None,
) -> None:  # fmt: skip
    handle = _region(regions, client, "in", X.nbytes)
    shm.set_shared_memory_region(handle, [X])
    inputs = _tile_inputs("in")
    inputs[0].set_shared_memory("in", size, offset)
    if words is None:
        np.testing.assert_array_equal(client.infer("Tile", inputs).as_numpy("output"), TILED)
        return
    with pytest.raises(InferenceServerException, match=_escaped(words)) as caught:
        client.infer("Tile", inputs)
    assert caught.value.status() == "400"


def test_an_output_region_too_small_is_refused(client: triton.InferenceServerClient,
                                               regions: dict) -> None:  # fmt: skip
    _region(regions, client, "in", X.nbytes)
    shm.set_shared_memory_region(regions["in"], [X])
    _region(regions, client, "small", 64)
    output = triton.InferRequestedOutput("output", binary_data=False)
    output.set_shared_memory("small", 64)
    with pytest.raises(InferenceServerException, match=_escaped(
            "shared memory size specified with the request for output 'output' (64 bytes) "
            "should be at least 96 bytes to hold the results")) as caught:  # fmt: skip
        client.infer("Tile", _tile_inputs("in"), outputs=[output])
    assert caught.value.status() == "400"


@pytest.mark.parametrize(("key", "size", "words", "status"), [
    ("/a/b", 8, "invalid shm key '/a/b'", "400"),
    ("/../../etc/passwd", 8, "invalid shm key", "400"),
    ("..", 8, "invalid shm key", "400"),
    ("{prefix}_missing", 8, "Unable to open shared memory region", "400"),
    ("{prefix}_r", 4096, "failed to register shared memory region 'r': invalid args", "400"),
])  # fmt: skip
def test_registrations_that_are_refused(
    client: triton.InferenceServerClient, regions: dict, key: str, size: int, words: str,
    status: str,
) -> None:  # fmt: skip
    _region(regions, client, "r", 64, register=False)
    key = key.format(prefix=PREFIX)  # ids stay the same in every test process
    with pytest.raises(InferenceServerException, match=_escaped(words)) as caught:
        client.register_system_shared_memory("r", key, size)
    assert caught.value.status() == status
    assert client.get_system_shared_memory_status() == []


def test_a_region_registered_twice_and_unknown_regions(client: triton.InferenceServerClient,
                                                       regions: dict) -> None:  # fmt: skip
    _region(regions, client, "twice", 64)
    with pytest.raises(InferenceServerException, match="already in manager") as caught:
        client.register_system_shared_memory("twice", f"{PREFIX}_twice", 64)
    assert caught.value.status() == "400"
    with pytest.raises(InferenceServerException, match="Unable to find system shared") as caught:
        client.get_system_shared_memory_status("nope")
    assert caught.value.status() == "404"
    with pytest.raises(InferenceServerException, match="Unable to find shared memory region: "
                       "'nope'") as caught:  # fmt: skip
        client.infer("Tile", _tile_inputs("nope"))
    assert caught.value.status() == "404"
    client.unregister_system_shared_memory("nope")  # unknown: no error, as Triton


def test_cuda_shared_memory_is_not_supported(client: triton.InferenceServerClient) -> None:
    assert client.get_cuda_shared_memory_status() == []
    with pytest.raises(InferenceServerException, match="GPUs not supported") as caught:
        client.register_cuda_shared_memory("gpu", b"\x00" * 64, 0, 64)
    assert caught.value.status() == "400"


def test_off_by_default(server: Server) -> None:
    with serve() as plain:
        client = triton.InferenceServerClient(f"127.0.0.1:{plain.port}")
        assert "system_shared_memory" not in client.get_server_metadata()["extensions"]
        assert client.get_system_shared_memory_status() == []
        with pytest.raises(InferenceServerException,
                           match="OPSERVE_ALLOW_CLIENT_SHM=true") as caught:  # fmt: skip
            client.register_system_shared_memory("r", f"{PREFIX}_r", 8)
        assert caught.value.status() == "501"
        client.close()


def _escaped(words: str) -> str:
    import re

    return re.escape(words)
