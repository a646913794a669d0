"""Model warmup against a live server, loaded over HTTP and gRPC (tritonclient): a version is
ready only once its samples ran, and a failing sample fails the load with its reason.

Warmup counts in no statistics (nor does Triton's), so what shows it ran is the load itself:
a sample of K runs of a model whose run is measured in the same test makes the load take at
least half of K runs longer than the same model's load without warmup, and the model is not
ready while it runs."""

import threading
import time
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from onnx import TensorProto, helper
from tritonclient.utils import InferenceServerException

from tests.api.live_server import free_port, serve
from tests.runtime.models import model, value

WIDTH, DEPTH, ROWS, RUNS = 256, 24, 256, 40


def _slow() -> bytes:
    """DEPTH MatMuls of ROWS x WIDTH by WIDTH x WIDTH: tens of milliseconds a run."""
    nodes = [helper.make_node("MatMul", [f"h{i}", "w"], [f"h{i + 1}"]) for i in range(DEPTH)]
    weights = (np.eye(WIDTH) * 0.5).astype(np.float32)
    return model(nodes, [value("h0", TensorProto.FLOAT, ["n", WIDTH])],
                 [value(f"h{DEPTH}", TensorProto.FLOAT, ["n", WIDTH])],
                 {"w": weights}).SerializeToString()  # fmt: skip


def _gather() -> bytes:
    return model([helper.make_node("Gather", ["data", "idx"], ["y"])],
                 [value("idx", TensorProto.INT64, ["n", 2])],
                 [value("y", TensorProto.FLOAT, ["n", 2])],
                 {"data": np.arange(10, dtype=np.float32)}).SerializeToString()  # fmt: skip


def _config(name: str, tensor: str, dtype: str, dims: int, warmup: str) -> str:
    return (f'name: "{name}"\nmax_batch_size: {ROWS}\n'
            f'input [{{name: "{tensor}" data_type: {dtype} dims: [{dims}]}}]\n{warmup}')  # fmt: skip


def _repository(root: Path) -> None:
    for name, data in (("slow", _slow()), ("cold", _slow()), ("gather", _gather())):
        (root / name / "1").mkdir(parents=True)
        (root / name / "1" / "model.onnx").write_bytes(data)
    (root / "gather" / "warmup").mkdir()
    (root / "gather" / "warmup" / "bad").write_bytes(np.array([4, 55], np.int64).tobytes())
    sample = (f'model_warmup [{{name: "many" batch_size: {ROWS} count: {RUNS} inputs {{key: "h0" '
              f"value {{data_type: TYPE_FP32 dims: [{WIDTH}] random_data: true}}}}}}]")  # fmt: skip
    (root / "slow" / "config.pbtxt").write_text(_config("slow", "h0", "TYPE_FP32", WIDTH, sample))
    (root / "cold" / "config.pbtxt").write_text(_config("cold", "h0", "TYPE_FP32", WIDTH, ""))
    bad = ('model_warmup [{name: "from file" batch_size: 1 inputs {key: "idx" value '
           '{data_type: TYPE_INT64 dims: [2] input_data_file: "bad"}}}]')  # fmt: skip
    (root / "gather" / "config.pbtxt").write_text(_config("gather", "idx", "TYPE_INT64", 2, bad))


def _timed_load(client: httpclient.InferenceServerClient, address: str,
                name: str) -> tuple[float, list[bool]]:  # fmt: skip
    """How long a load of `name` took, and what readiness answered while it ran."""
    seen: list[bool] = []
    done = threading.Event()
    prober = httpclient.InferenceServerClient(address)  # its own connection

    def probe() -> None:
        while not done.is_set():
            seen.append(prober.is_model_ready(name))
            time.sleep(0.01)

    thread = threading.Thread(target=probe)
    thread.start()
    started = time.perf_counter()
    try:
        client.load_model(name)
    finally:
        took = time.perf_counter() - started
        done.set()
        thread.join(10)
        prober.close()
    return took, seen


def _fastest_run(client: httpclient.InferenceServerClient) -> float:
    given = httpclient.InferInput("h0", [ROWS, WIDTH], "FP32")
    given.set_data_from_numpy(np.ones((ROWS, WIDTH), np.float32), binary_data=True)
    times = []
    for _ in range(5):
        started = time.perf_counter()
        client.infer("cold", [given])
        times.append(time.perf_counter() - started)
    return min(times)


def test_ready_only_after_warmup_and_a_failing_sample_fails_the_load(tmp_path: Path) -> None:
    _repository(tmp_path)
    grpc_port = free_port()
    with serve(model_repository=str(tmp_path), model_control_mode="explicit",
               grpc_port=str(grpc_port), wait_path="/v2/health/live") as server:  # fmt: skip
        address = f"127.0.0.1:{server.port}"
        client = httpclient.InferenceServerClient(address)
        _timed_load(client, address, "cold")  # the first load pays for what the process starts
        client.unload_model("cold")
        cold, _ = _timed_load(client, address, "cold")
        run = _fastest_run(client)  # the client's round trip: more than a run itself
        warm, seen = _timed_load(client, address, "slow")
        assert client.is_model_ready("slow")
        # not ready while its warmup ran (the probes stopped once the load answered)
        assert len(seen) >= 3 and not any(seen[:-1])
        # RUNS runs of the sample took place within the load, before it answered
        assert warm - cold > 0.25 * RUNS * run, (warm, cold, run)
        # HTTP: the load fails with the sample's reason, the model is not ready
        with pytest.raises(InferenceServerException) as failed:
            client.load_model("gather")
        text = str(failed.value)
        assert "failed to run warmup sample 'from file'" in text
        assert "idx=55 must be within the inclusive range [-10,9]" in text
        assert not client.is_model_ready("gather")
        # gRPC: the same, for the load of a repository model and of one sent whole
        grpc = grpcclient.InferenceServerClient(f"127.0.0.1:{grpc_port}")
        with pytest.raises(InferenceServerException, match=r"failed to run warmup sample "
                           r"'from file'.*idx=55"):  # fmt: skip
            grpc.load_model("gather")
        grpc.unload_model("slow")
        grpc.load_model("slow")
        assert grpc.is_model_ready("slow")
        sent = ('{"name": "sent", "max_batch_size": 4, "input": [{"name": "idx", '
                '"data_type": "TYPE_INT64", "dims": [2]}], "model_warmup": [{"name": "w", '
                '"batch_size": 2, "inputs": {"idx": {"data_type": "TYPE_INT64", "dims": [2], '
                '%s}}}]}')  # fmt: skip
        files = {"file:1/model.onnx": _gather()}
        grpc.load_model("sent", config=sent % '"zero_data": true', files=files)
        assert grpc.is_model_ready("sent")  # warmed up in the isolated workers
        with pytest.raises(InferenceServerException, match=r"failed to run warmup sample 'w'.*"
                           "indices element out of data bounds"):  # fmt: skip
            grpc.load_model("sent", config=sent % '"random_data": true', files=files)
        with pytest.raises(InferenceServerException, match="a model sent whole with a load "
                           "request has no folder, so no warmup files"):  # fmt: skip
            client.load_model("sent", config=sent % '"input_data_file": "x"',
                              files={"file:1/model.onnx": _gather()})  # fmt: skip
        assert grpc.is_model_ready("sent")  # a refused load changed nothing
        grpc.close()
        client.close()
