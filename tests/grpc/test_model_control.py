"""Model control over gRPC (Triton's simple_grpc_model_control.py): the repository index, load
with a configuration override and files, unload, and the refusals; in explicit mode, on a
server of its own, and refused as Triton refuses it in the other modes."""

from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
import tritonclient.grpc as triton
from tritonclient.grpc import service_pb2 as pb
from tritonclient.utils import InferenceServerException

from tests.grpc.conftest import Served, repository, serve_grpc
from tests.triton_examples import write_repository


@pytest.fixture(scope="module")
def served_control(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Served, Path]]:
    root = tmp_path_factory.mktemp("control")
    with serve_grpc(**{**repository(root), "load_models": "simple_int8"}) as served:
        yield served, root


@pytest.fixture(scope="module")
def control(served_control: tuple[Served, Path]) -> Iterator[triton.InferenceServerClient]:
    client = triton.InferenceServerClient(served_control[0].target)
    yield client
    client.close()


def _refused(call: object, status: str, text: str) -> None:
    with pytest.raises(InferenceServerException) as refused:
        call()  # type: ignore[operator]
    assert refused.value.status() == status, refused.value.message()
    assert text in refused.value.message()


def test_load_unload_and_index(control: triton.InferenceServerClient) -> None:
    index = {m.name: m for m in control.get_model_repository_index().models}
    assert index["simple_int8"].state == "READY" and not index["simple"].state
    assert not control.is_model_ready("simple")
    control.load_model("simple", config='{"max_batch_size": 16}')
    assert control.is_model_ready("simple")
    assert control.get_model_config("simple").config.max_batch_size == 16
    control.unload_model("simple")
    assert not control.is_model_ready("simple")  # no error: Triton's answer after unload
    stub = control._client_stub  # tritonclient has no `ready` flag; the raw message has
    ready = stub.RepositoryIndex(pb.RepositoryIndexRequest(ready=True)).models
    assert [m.name for m in ready] == ["simple_int8"]


def test_load_refusals(control: triton.InferenceServerClient) -> None:
    _refused(
        lambda: control.load_model("wrong_model_name"), "StatusCode.NOT_FOUND", "wrong_model_name"
    )
    _refused(lambda: control.load_model("simple", config='{"max_batch_size": "x"'),
             "StatusCode.INVALID_ARGUMENT", "")  # fmt: skip


def test_load_with_files(control: triton.InferenceServerClient,
                         served_control: tuple[Served, Path]) -> None:  # fmt: skip
    model = (served_control[1] / "simple" / "1" / "model.onnx").read_bytes()
    files = {"file:1/model.onnx": model}
    _refused(lambda: control.load_model("simple_string", files=files),
             "StatusCode.INVALID_ARGUMENT", "load parameters with files need a 'config' too")  # fmt: skip
    control.load_model("custom_identity_int32", config='{"max_batch_size": 8}', files=files)
    metadata = control.get_model_metadata("custom_identity_int32")
    assert [t.name for t in metadata.outputs] == ["OUTPUT0", "OUTPUT1"]  # simple's graph now
    control.unload_model("custom_identity_int32")
    stub = control._client_stub
    with pytest.raises(grpc.RpcError) as refused:
        stub.RepositoryModelLoad(pb.RepositoryModelLoadRequest(model_name="simple", parameters={
            "config": pb.ModelRepositoryParameter(bytes_param=b"{}")}))  # fmt: skip
    assert refused.value.details() == ("invalid value type for load parameter 'config', "
                                       "expected string_param.")  # fmt: skip
    with pytest.raises(grpc.RpcError) as refused:
        stub.RepositoryIndex(pb.RepositoryIndexRequest(repository_name="other"))
    assert refused.value.code() == grpc.StatusCode.UNIMPLEMENTED


def test_model_control_in_none_mode(tmp_path: Path) -> None:
    settings = {**repository(tmp_path), "model_control_mode": "none", "load_models": ""}
    with serve_grpc(**settings) as served:
        client = triton.InferenceServerClient(served.target)
        _refused(lambda: client.load_model("simple"), "StatusCode.UNAVAILABLE",
                 "explicit model load / unload is not allowed if polling is enabled")  # fmt: skip
        _refused(lambda: client.unload_model("simple"), "StatusCode.UNAVAILABLE", "polling")
        client.close()


def test_simple_grpc_model_control(tmp_path: Path) -> None:
    """Triton's simple_grpc_model_control.py (tritonclient 2.73's examples), its calls and
    checks in its order, over a repository of eight models as the script counts them: a
    file parameter whose path component is over NAME_MAX answers INTERNAL "failed to poll
    from model repository", as Triton does, and the server stays live."""
    root = write_repository(tmp_path, ["simple", "simple_int8", "simple_string",
                                       "simple_identity", "simple_sequence",
                                       "simple_dyna_sequence", "densenet_onnx",
                                       "custom_identity_int32"])  # fmt: skip
    with serve_grpc(model_repository=str(root), reference_fallback="true",
                    model_control_mode="explicit", strict_readiness="false") as served:  # fmt: skip
        client = triton.InferenceServerClient(served.target)
        assert len(client.get_model_repository_index().models) == 8
        client.load_model("simple")
        assert client.is_model_ready("simple")
        with pytest.raises(InferenceServerException) as caught:
            client.load_model("simple", config='"parameters": {"config": {{"max_batch_size": '
                              '"16"}}}')  # the script's malformed override  # fmt: skip
        assert "failed to load" in caught.value.message()
        client.load_model("simple", config='{"max_batch_size":"16"}')
        assert client.get_model_config("simple").config.max_batch_size == 16
        client.unload_model("simple")
        assert not client.is_model_ready("simple")
        with pytest.raises(InferenceServerException) as caught:
            client.load_model("simple", config="{}", files={"file:" + "A" * 256: b"a"})
        assert caught.value.status() == "StatusCode.INTERNAL"
        assert "failed to poll from model repository" in caught.value.message()
        assert client.is_server_live()
        with pytest.raises(InferenceServerException) as caught:
            client.load_model("wrong_model_name")
        assert "failed to load" in caught.value.message()
        client.close()
