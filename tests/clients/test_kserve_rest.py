"""The KServe SDK's REST client (InferenceRESTClient, protocol v2), unchanged, against a live
server: its five calls, with JSON and binary inputs, on an operator and a repository model."""

from collections.abc import Iterator

import pytest

from tests.api.live_server import Server, serve
from tests.clients import kserve_sdk
from tests.triton_examples import write_repository

SCRIPT = """
import asyncio, json, sys
import numpy as np
from kserve import InferenceRESTClient, InferInput, InferRequest, RESTConfig

async def main(url):
    client = InferenceRESTClient(RESTConfig(protocol="v2", timeout=30))
    out = {"live": await client.is_server_live(url), "ready": await client.is_server_ready(url),
           "tile_ready": await client.is_model_ready(url, "Tile"),
           "nope_ready": await client.is_model_ready(url, "nope")}
    for binary in (False, True):
        x = InferInput("input", [2, 3], "FP32")
        x.set_data_from_numpy(np.arange(6, dtype=np.float32).reshape(2, 3), binary_data=binary)
        r = InferInput("repeats", [2], "INT64")
        r.set_data_from_numpy(np.array([1, 2], dtype=np.int64), binary_data=binary)
        answer = await client.infer(url, InferRequest("Tile", [x, r], request_id="k1"),
                                    model_name="Tile")
        got = answer.outputs[0].as_numpy()
        out[f"tile_{binary}"] = {"id": answer.id, "shape": list(got.shape),
                                 "data": got.reshape(-1).tolist()}
    a = InferInput("INPUT0", [1, 16], "INT32")
    a.set_data_from_numpy(np.arange(16, dtype=np.int32).reshape(1, 16), binary_data=False)
    b = InferInput("INPUT1", [1, 16], "INT32")
    b.set_data_from_numpy(np.ones((1, 16), dtype=np.int32), binary_data=True)
    answer = await client.infer(url, InferRequest("simple", [a, b]), model_name="simple")
    out["simple"] = {o.name: o.as_numpy().reshape(-1).tolist() for o in answer.outputs}
    try:
        await client.infer(url, InferRequest("nope", [a]), model_name="nope")
    except Exception as exc:
        out["nope"] = str(exc)
    await client.close()
    print(json.dumps(out))

asyncio.run(main(sys.argv[1]))
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    root = write_repository(tmp_path_factory.mktemp("models"), ["simple"])
    with serve(model_repository=str(root), reference_fallback="true") as running:
        yield running


def test_every_rest_call_of_the_kserve_sdk(server: Server) -> None:
    (out,) = kserve_sdk.run(SCRIPT, server.url)
    assert (out["live"], out["ready"], out["tile_ready"], out["nope_ready"]) == (
        True, True, True, False)  # fmt: skip
    for binary in ("False", "True"):
        assert out[f"tile_{binary}"] == {"id": "k1", "shape": [2, 6], "data": [
            0, 1, 2, 0, 1, 2, 3, 4, 5, 3, 4, 5]}  # fmt: skip
    assert out["simple"] == {"OUTPUT0": list(range(1, 17)), "OUTPUT1": list(range(-1, 15))}
    assert "Request for unknown model: 'nope' is not found" in out["nope"]
    assert "404" in out["nope"]
