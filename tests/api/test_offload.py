"""Small requests run on the event loop; large ones on the kernel thread pool."""

import threading

import numpy as np
import orjson
import pytest
from fastapi.testclient import TestClient

import service.kernels.tile as tile_module
from service.codecs.tensor_proto import encode_tensor_proto
from service.core.offload import INLINE_BODY_BYTES, INLINE_OUTPUT_BYTES
from service.kernels.context import INLINE_JSON_ANSWER_BYTES
from service.main import create_app


@pytest.fixture
def threads_seen(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    seen: list[str] = []
    real_tile = tile_module.tile

    def recording_tile(*args, **kwargs):  # type: ignore[no-untyped-def]
        seen.append(threading.current_thread().name)
        return real_tile(*args, **kwargs)

    monkeypatch.setattr(tile_module, "tile", recording_tile)
    return seen


def _tile(client: TestClient, side: int, repeat: int, pad: int = 0,
          output_format: str = "tensor_proto") -> dict:  # fmt: skip
    body = {
        "inputs": {
            "input": {"tensor_proto": encode_tensor_proto(np.ones((side, side), np.float32))},
            "repeats": {"dtype": "int64", "data": [repeat, repeat]},
        },
        "output_format": output_format,
    }
    raw = orjson.dumps(body) + b" " * pad  # trailing spaces: a larger body, same request
    response = client.post("/v1/ops/Tile/13", content=raw,
                           headers={"content-type": "application/json"})  # fmt: skip
    assert response.status_code == 200, response.text
    return response.json()


def test_small_request_runs_inline(threads_seen: list[str]) -> None:
    with TestClient(create_app()) as client:
        _tile(client, 2, 2)
    assert threads_seen and not threads_seen[0].startswith("opserve-kernel")


def test_large_output_moves_to_a_kernel_thread(threads_seen: list[str]) -> None:
    side, repeat = 16, 64  # 16*64 squared float32 = 4 MiB
    assert (side * repeat) ** 2 * 4 > INLINE_OUTPUT_BYTES
    with TestClient(create_app()) as client:
        _tile(client, side, repeat)
    # first attempt inline stops before allocating, then the kernel runs again on a thread
    assert threads_seen[-1].startswith("opserve-kernel")


def test_large_body_goes_straight_to_a_kernel_thread(threads_seen: list[str]) -> None:
    with TestClient(create_app()) as client:
        _tile(client, 2, 2, pad=INLINE_BODY_BYTES + 1)
    assert threads_seen == [threads_seen[0]] and threads_seen[0].startswith("opserve-kernel")


def test_a_long_json_answer_is_made_on_a_kernel_thread(threads_seen: list[str]) -> None:
    """An output small enough to make inline whose JSON text could pass
    INLINE_JSON_ANSWER_BYTES is made (and its answer written) on a kernel thread: writing it
    held the event loop, and every other client's request, 19-24 ms a call. The same output
    as tensor_proto (a copy) stays inline; on V2 (JSON) it moves too. Each answer is the tile."""
    side, repeat = 16, 16  # [256, 256] float32: 256 KiB, up to 1 MiB of JSON text
    assert (side * repeat) ** 2 * 4 <= INLINE_OUTPUT_BYTES
    assert (side * repeat) ** 2 * 16 > INLINE_JSON_ANSWER_BYTES
    with TestClient(create_app()) as client:
        answer = _tile(client, side, repeat, output_format="json")
        assert threads_seen[-1].startswith("opserve-kernel")
        output = answer["outputs"]["output"]
        assert output["shape"] == [256, 256] and output["data"] == [1.0] * 256 * 256
        threads_seen.clear()
        _tile(client, side, repeat)  # tensor_proto: inline
        assert threads_seen and not any(t.startswith("opserve-kernel") for t in threads_seen)
        threads_seen.clear()
        v2 = client.post("/v2/models/Tile/versions/13/infer", json={"inputs": [
            {"name": "input", "datatype": "FP32", "shape": [side, side],
             "data": [1.0] * side * side},
            {"name": "repeats", "datatype": "INT64", "shape": [2], "data": [repeat, repeat]}]})  # fmt: skip
        assert v2.status_code == 200, v2.text
        assert v2.json()["outputs"][0]["data"] == [1.0] * 256 * 256
        assert threads_seen[-1].startswith("opserve-kernel")
        threads_seen.clear()
        _tile(client, side, 4, output_format="json")  # [64, 64]: short, inline
        assert threads_seen and not any(t.startswith("opserve-kernel") for t in threads_seen)


def test_the_app_serves_large_work_again_after_a_second_lifespan() -> None:
    app = create_app()
    for _ in range(2):  # the first lifespan's end shuts the pool down; the second makes one
        with TestClient(app) as client:
            _tile(client, 16, 64)


def test_large_work_shares_the_kernel_threads() -> None:
    """With one kernel thread, two large requests never run at the same time."""
    import asyncio

    from service.core.offload import Offloader

    offloader = Offloader(threads=1)
    running, overlap = [0], [0]

    def work(body: bytes) -> bytes:
        running[0] += 1
        overlap[0] = max(overlap[0], running[0])
        threading.Event().wait(0.05)
        running[0] -= 1
        return body

    async def scenario() -> list[bytes]:
        return await asyncio.gather(*(offloader.on_thread(work, b"x") for _ in range(3)))

    assert asyncio.run(scenario()) == [b"x"] * 3
    assert overlap[0] == 1
    offloader.close()
