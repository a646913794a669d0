"""Triton's qa/L0_simple_ensemble over a live server, with tritonclient over HTTP and gRPC:
`ensemble_add_sub_int32_int32_int32` (its configuration as Triton's QA writes it) over the two
versions of `simple` answers what its six steps give when run by hand, and what `simple`
itself answers; each step counts in its own version's statistics (both versions alike when
both outputs are asked for, only version 2 when only OUTPUT0 is, as L0_simple_ensemble
checks), and the ensemble counts its own requests."""

import shutil
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.api.live_server import free_port, serve
from tests.triton_examples import write_repository

ENSEMBLE = "ensemble_add_sub_int32_int32_int32"
STEP = """{{ model_name: "simple" model_version: {version}
  input_map {{ key: "INPUT0" value: "{a}" }} input_map {{ key: "INPUT1" value: "{b}" }}
  output_map {{ key: "{out}" value: "{to}" }} }}"""
# qa/L0_simple_ensemble/models/ensemble_add_sub_int32_int32_int32/config.pbtxt, unchanged
CONFIG = f"""name: "{ENSEMBLE}"
platform: "ensemble"
max_batch_size: 8
input [ {{ name: "INPUT0" data_type: TYPE_INT32 dims: [ 16 ] }},
        {{ name: "INPUT1" data_type: TYPE_INT32 dims: [ 16 ] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 16 ] }},
         {{ name: "OUTPUT1" data_type: TYPE_INT32 dims: [ 16 ] }} ]
ensemble_scheduling {{ step [
  {STEP.format(version=-1, a="INPUT0", b="INPUT0", out="OUTPUT0", to="double_input0")},
  {STEP.format(version=1, a="INPUT1", b="INPUT1", out="OUTPUT0", to="double_input1")},
  {STEP.format(version=-1, a="double_input0", b="INPUT0", out="OUTPUT1", to="input0_val")},
  {STEP.format(version=1, a="double_input1", b="INPUT1", out="OUTPUT1", to="input1_val")},
  {STEP.format(version=-1, a="input0_val", b="INPUT1", out="OUTPUT0", to="OUTPUT0")},
  {STEP.format(version=1, a="INPUT0", b="input1_val", out="OUTPUT1", to="OUTPUT1")}
] }}
"""


def by_hand(in0: np.ndarray, in1: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The six steps, each `simple` (OUTPUT0 = a + b, OUTPUT1 = a - b) in numpy."""
    double0, double1 = in0 + in0, in1 + in1
    val0, val1 = double0 - in0, double1 - in1
    return val0 + in1, in0 - val1


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Any:
    root = write_repository(tmp_path_factory.mktemp("repo"), ["simple"])
    shutil.copytree(root / "simple" / "1", root / "simple" / "2")
    with (root / "simple" / "config.pbtxt").open("a") as config:
        config.write("\nversion_policy: { all {} }\n")
    (root / ENSEMBLE / "1").mkdir(parents=True)  # Triton's test.sh makes the version folder
    (root / ENSEMBLE / "config.pbtxt").write_text(CONFIG)
    grpc_port = free_port()
    with serve(model_repository=str(root), grpc_port=str(grpc_port)) as live:
        yield {"http": (httpclient, f"127.0.0.1:{live.port}"),
               "grpc": (grpcclient, f"127.0.0.1:{grpc_port}")}  # fmt: skip


def _infer(kind: Any, client: Any, model: str, in0: np.ndarray, in1: np.ndarray,
           outputs: tuple[str, ...] | None = None) -> Any:  # fmt: skip
    inputs = [kind.InferInput("INPUT0", list(in0.shape), "INT32"),
              kind.InferInput("INPUT1", list(in1.shape), "INT32")]  # fmt: skip
    inputs[0].set_data_from_numpy(in0)
    inputs[1].set_data_from_numpy(in1)
    asked = [kind.InferRequestedOutput(name) for name in outputs] if outputs else None
    return client.infer(model, inputs, outputs=asked)


def _successes(client: Any, model: str) -> dict[str, int]:
    """Successes per version (gRPC's JSON writes 64-bit counts as strings, and leaves 0 out)."""
    grpc = isinstance(client, grpcclient.InferenceServerClient)
    stats = client.get_inference_statistics(model, **({"as_json": True} if grpc else {}))
    return {s["version"]: int(s["inference_stats"]["success"].get("count", 0))
            for s in stats["model_stats"]}  # fmt: skip


@pytest.mark.parametrize("door", ["http", "grpc"])
def test_ensemble_add_sub_as_l0_simple_ensemble(server: dict[str, Any], door: str) -> None:
    kind, url = server[door]
    client = kind.InferenceServerClient(url)
    try:
        assert client.is_model_ready(ENSEMBLE)
        rng = np.random.default_rng(7)
        for bs in (1, 8):
            in0 = rng.integers(-1000, 1000, (bs, 16), dtype=np.int32)
            in1 = rng.integers(-1000, 1000, (bs, 16), dtype=np.int32)
            before = _successes(client, "simple")
            result = _infer(kind, client, ENSEMBLE, in0, in1)
            after = _successes(client, "simple")
            out0, out1 = result.as_numpy("OUTPUT0"), result.as_numpy("OUTPUT1")
            hand0, hand1 = by_hand(in0, in1)
            np.testing.assert_array_equal(out0, hand0)
            np.testing.assert_array_equal(out1, hand1)
            direct = _infer(kind, client, "simple", in0, in1)  # the step model called directly
            np.testing.assert_array_equal(out0, direct.as_numpy("OUTPUT0"))
            np.testing.assert_array_equal(out1, direct.as_numpy("OUTPUT1"))
            # three steps on each version (the direct call came after `after`)
            assert {v: after[v] - before[v] for v in after} == {"1": 3, "2": 3}
        # one output: only the steps it needs run, all on version 2 (L0_simple_ensemble)
        before = _successes(client, "simple")
        result = _infer(kind, client, ENSEMBLE, in0, in1, ("OUTPUT0",))
        after = _successes(client, "simple")
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), in0 + in1)
        assert result.as_numpy("OUTPUT1") is None
        assert {v: after[v] - before[v] for v in after} == {"1": 0, "2": 3}
        # the ensemble's own checks, in Triton's words, naming the ensemble
        with pytest.raises(InferenceServerException, match=f"unexpected shape for input "
                           f"'INPUT0' for model '{ENSEMBLE}'"):  # fmt: skip
            _infer(kind, client, ENSEMBLE, in0[:, :8].copy(), in1[:, :8].copy())
    finally:
        client.close()


def test_ensemble_in_the_index_metadata_and_its_own_statistics(server: dict[str, Any]) -> None:
    kind, url = server["http"]
    client = kind.InferenceServerClient(url)
    try:
        index = {row["name"]: row["state"] for row in client.get_model_repository_index()}
        assert index == {ENSEMBLE: "READY", "simple": "READY"}
        metadata = client.get_model_metadata(ENSEMBLE)
        assert metadata["platform"] == "ensemble"
        assert [i["shape"] for i in metadata["inputs"]] == [[-1, 16], [-1, 16]]
        config = client.get_model_config(ENSEMBLE)
        assert [s["model_version"] for s in config["ensemble_scheduling"]["step"]] == [
            -1, 1, -1, 1, -1, 1]  # fmt: skip
        before = client.get_inference_statistics(ENSEMBLE)["model_stats"][0]
        in0 = np.arange(48, dtype=np.int32).reshape(3, 16)
        _infer(kind, client, ENSEMBLE, in0, in0)
        after = client.get_inference_statistics(ENSEMBLE)["model_stats"][0]
        assert after["inference_count"] - before["inference_count"] == 3  # rows
        assert after["execution_count"] - before["execution_count"] == 1
    finally:
        client.close()
