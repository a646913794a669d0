"""The replays of Triton's example clients (tests/triton_clients.py, which the container test
runs through nginx) pass against one server serving the repository the scripts expect, and
fail where the scripts would exit 1."""

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
import tritonclient.http as httpclient

from tests.api.live_server import Server, free_port, serve
from tests.triton_clients import MODEL_CONTROL_MODELS, REPLAYS
from tests.triton_examples import write_repository


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Server, int, Path]]:
    root = write_repository(tmp_path_factory.mktemp("models"), MODEL_CONTROL_MODELS)
    grpc_port = free_port()
    with serve(model_repository=str(root), model_control_mode="explicit", load_models="*",
               grpc_port=str(grpc_port),
               strict_readiness="false") as server:  # fmt: skip
        yield server, grpc_port, root


# the -d variants need simple_string_dyna_sequence, which would change the model-control
# scripts' count: tests/v2/test_oldest_sequences.py runs them
@pytest.mark.parametrize("script", sorted(s for s in REPLAYS if not s.endswith(" -d")))
def test_each_replay_passes_as_its_script_does(served: tuple[Server, int, Path],
                                               script: str) -> None:  # fmt: skip
    server, grpc_port, root = served
    url = f"127.0.0.1:{grpc_port}" if "_grpc_" in script else f"127.0.0.1:{server.port}"
    if script == "simple_grpc_model_control.py":  # it counts 8 models
        write_repository(root, ["custom_identity_int32"])
    try:
        REPLAYS[script](url)
    finally:
        if "model_control" in script:  # the scripts leave simple unloaded
            httpclient.InferenceServerClient(f"127.0.0.1:{server.port}").load_model("simple")
        if script == "simple_grpc_model_control.py":
            shutil.rmtree(root / "custom_identity_int32")


def test_a_replay_fails_where_its_script_would(served: tuple[Server, int, Path]) -> None:
    server, grpc_port, _ = served
    with pytest.raises(AssertionError, match="the index lists 7 models"):
        REPLAYS["simple_grpc_model_control.py"](f"127.0.0.1:{grpc_port}")  # 8 expected
    client = httpclient.InferenceServerClient(f"127.0.0.1:{server.port}")
    client.unload_model("simple_sequence")
    try:
        with pytest.raises(Exception, match="simple_sequence"):
            REPLAYS["simple_http_sequence_sync_infer_client.py"](f"127.0.0.1:{server.port}")
    finally:
        client.load_model("simple_sequence")
