"""Triton's model warmup on the loader (config/warmup.py): each kind of sample data reaches the
run as Triton builds it, a failing sample fails the version with its reason, and every file,
size, count and time bound refuses before it runs.

The oracle is a Gather over an initializer of 10 values: a run succeeds only when every index
the sample feeds is in [-10, 9], and onnxruntime's error names the first index that is not, so
what a sample fed is seen in the version's reason."""

import os
from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto, helper

from service.engines.workers.pool import FallbackPool
from service.runtime.config.warmup import WarmupRuns
from service.runtime.load_request import Overrides
from service.runtime.model_loader import load_folder
from service.settings import Settings
from tests.runtime.models import model, value

SETTINGS = Settings()
I64 = TensorProto.INT64


def _gather(rank_dims: list[object]) -> bytes:
    return model([helper.make_node("Gather", ["data", "idx"], ["y"])],
                 [value("idx", I64, rank_dims)], [value("y", TensorProto.FLOAT, rank_dims)],
                 {"data": np.arange(10, dtype=np.float32)}).SerializeToString()  # fmt: skip


def _sample(data: str, dims: str = "[2]", kind: str = "TYPE_INT64", name: str = "w",
            more: str = "batch_size: 2") -> str:  # fmt: skip
    return (f'model_warmup [{{name: "{name}" {more} inputs {{key: "idx" value {{'
            f"data_type: {kind} dims: {dims} {data}}}}}}}]")  # fmt: skip


def _repo(root: Path, warmup: str, max_batch_size: int = 4) -> Path:
    folder = root / "g"
    (folder / "1").mkdir(parents=True, exist_ok=True)
    if not (folder / "warmup").is_symlink():
        (folder / "warmup").mkdir(exist_ok=True)
    dims = ["n", 2] if max_batch_size else [2]
    (folder / "1" / "model.onnx").write_bytes(_gather(dims))
    (folder / "config.pbtxt").write_text(
        f"max_batch_size: {max_batch_size}\n"
        'input [{name: "idx" data_type: TYPE_INT64 dims: [2]}]\n'
        'output [{name: "y" data_type: TYPE_FP32 dims: [2]}]\n' + warmup)  # fmt: skip
    return folder


def _loaded(root: Path, settings: Settings = SETTINGS) -> tuple[bool, str | None]:
    entry = load_folder(root, "g", settings).versions[1]
    return entry.ready, entry.error


def _indices(root: Path, name: str, values: list[int]) -> None:
    (root / "g" / "warmup").mkdir(parents=True, exist_ok=True)
    (root / "g" / "warmup" / name).write_bytes(np.array(values, np.int64).tobytes())


def test_zero_data_and_a_file_of_good_indices_warm_up_and_the_version_is_ready(
    tmp_path: Path,
) -> None:
    _repo(tmp_path, _sample("zero_data: true", more="batch_size: 3 count: 2"))
    assert _loaded(tmp_path) == (True, None)
    _indices(tmp_path, "good", [9, -10, 99])  # Triton reads the first 16 bytes: the rest unused
    _repo(tmp_path, _sample('input_data_file: "good"'))
    assert _loaded(tmp_path) == (True, None)


def test_a_file_s_values_reach_the_run_in_row_major_order(tmp_path: Path) -> None:
    _indices(tmp_path, "bad", [3, 77])
    _repo(tmp_path, _sample('input_data_file: "bad"', name="from file"))
    ready, error = _loaded(tmp_path)
    assert not ready
    assert error is not None
    assert error.startswith("failed to run warmup sample 'from file': onnxruntime could not ")
    assert "idx=77 must be within the inclusive range [-10,9]" in error
    assert error.endswith("; ")  # Triton's form: each response's error, then "; "


def test_random_data_is_random_bytes_of_the_type(tmp_path: Path) -> None:
    # random int64 bytes are an index in [-10, 9] with odds of 20 in 2**64: the run fails
    _repo(tmp_path, _sample("random_data: true", name="r"))
    ready, error = _loaded(tmp_path)
    assert not ready and error is not None
    assert error.startswith("failed to run warmup sample 'r': ")
    assert "indices element out of data bounds" in error


def test_a_model_without_batching_takes_the_sample_s_dims_as_they_are(tmp_path: Path) -> None:
    _indices(tmp_path, "good", [1, 2])
    _repo(tmp_path, _sample('input_data_file: "good"', more="batch_size: 3"), max_batch_size=0)
    assert _loaded(tmp_path) == (True, None)


@pytest.mark.parametrize(("sample", "reason"), [
    (_sample("zero_data: true", dims="[3]"), "warmup sample 'w': unexpected shape for input "
     "'idx' for model 'g'. Expected [-1,2], got [2,3]."),
    (_sample("zero_data: true", kind="TYPE_FP32"), "warmup sample 'w': inference input 'idx' "
     "data-type is 'FP32', but model 'g' expects 'INT64'"),
    (_sample("zero_data: true", more="batch_size: 5"), "warmup sample 'w': inference request "
     "batch-size must be <= 4 for 'g'"),
    (_sample("zero_data: true", dims="[-1]"), "warmup sample 'w': warmup setting expects all "
     "variable-size dimensions are specified for input 'idx'"),
    (_sample(""), "warmup sample 'w': warmup setting expects input 'idx' to have "
     "input_data_type set"),
    (_sample('input_data_file: "short"'), "warmup sample 'w': warmup setting expects 16 bytes, "
     "but the data provided from short only has 8 bytes"),
    (_sample('input_data_file: "none"'), "warmup sample 'w': warmup data file 'none' for input "
     "'idx' is not in the model's warmup folder"),
    (_sample('input_data_file: "../1/model.onnx"'), "warmup sample 'w': warmup data file "
     "'../1/model.onnx' for input 'idx' is outside the model's warmup folder"),
    (_sample('input_data_file: "/etc/hostname"'), "is outside the model's warmup folder"),
    (_sample('input_data_file: "up"'), "warmup data file 'up' for input 'idx' is outside the "
     "model's warmup folder (a path out of it, or a link that leaves it); refused"),
    (_sample('input_data_file: "fifo"'), "warmup data file 'fifo' for input 'idx' is a FIFO; "
     "only a regular file is read"),
    (_sample('input_data_file: "."'), "is outside the model's warmup folder"),
    (_sample('input_data_file: "sub"'), "warmup data file 'sub' for input 'idx' is a directory"),
])  # fmt: skip
def test_a_sample_that_cannot_be_made_fails_the_version_with_its_reason(
    tmp_path: Path, sample: str, reason: str
) -> None:
    folder = _repo(tmp_path, sample)
    (folder / "warmup" / "short").write_bytes(bytes(8))
    os.mkfifo(folder / "warmup" / "fifo")  # never opened: opening one blocks
    (folder / "warmup" / "sub").mkdir()
    (folder / "secret").write_bytes(bytes(64))
    os.symlink(folder / "secret", folder / "warmup" / "up")  # inside the model, not warmup/
    ready, error = _loaded(tmp_path)
    assert not ready
    assert error is not None and reason in error


def test_a_warmup_folder_that_is_a_link_out_of_the_model_is_refused(tmp_path: Path) -> None:
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (outside / "good").write_bytes(np.array([1, 2], np.int64).tobytes())
    folder = _repo(tmp_path, _sample('input_data_file: "good"'))
    (folder / "warmup").rmdir()
    os.symlink(outside, folder / "warmup")
    ready, error = _loaded(tmp_path)
    assert not ready and error is not None
    assert "is outside the model's warmup folder" in error


def test_batch_size_0_is_skipped_and_count_0_runs_once(tmp_path: Path) -> None:
    _indices(tmp_path, "bad", [3, 77])
    _repo(tmp_path, _sample('input_data_file: "bad"', more="batch_size: 0"))
    assert _loaded(tmp_path) == (True, None)  # never ran, as Triton skips it
    _repo(tmp_path, _sample('input_data_file: "bad"', more="batch_size: 1 count: 0"))
    assert _loaded(tmp_path)[0] is False  # ran once


def test_runs_elements_and_time_are_bounded(tmp_path: Path) -> None:
    _repo(tmp_path, _sample("zero_data: true", more="batch_size: 1 count: 11"))
    ready, error = _loaded(tmp_path, Settings(max_warmup_runs=10))
    assert not ready
    assert error == ("model_warmup asks for 11 runs, over the limit of 10 "
                     "(OPSERVE_MAX_WARMUP_RUNS)")  # fmt: skip
    _repo(tmp_path, _sample("zero_data: true", dims="[2000000]", more="batch_size: 4"))
    ready, error = _loaded(tmp_path, Settings(max_elements=1_000_000))
    assert not ready and error is not None
    assert error == ("warmup sample 'w': input 'idx': shape [2000000] holds 2000000 elements, "
                     "over the limit of 1000000 (OPSERVE_MAX_ELEMENTS)")  # fmt: skip
    # a deadline already past once the first run is done: the second is not started
    _repo(tmp_path, _sample("zero_data: true", more="batch_size: 1 count: 1000"))
    ready, error = _loaded(tmp_path, Settings(max_warmup_seconds=1e-9))
    assert not ready
    assert error == ("the model's warmup took longer than 1e-09 s (OPSERVE_MAX_WARMUP_SECONDS); "
                     "stopped before sample 'w'")  # fmt: skip


def test_a_sample_s_memory_is_claimed_from_the_budget_and_given_back(tmp_path: Path) -> None:
    from service.core.memory_budget import MemoryBudget

    _repo(tmp_path, _sample("zero_data: true", dims="[2]", more="batch_size: 4 count: 3"))
    budget = MemoryBudget(1 << 20, 0.05)
    entry = load_folder(tmp_path, "g", SETTINGS, None, WarmupRuns(budget)).versions[1]
    assert entry.ready
    assert budget.used == 0  # all of it given back
    tiny = MemoryBudget(16, 0.05)  # the sample's 4 x 2 int64 alone are 64 bytes
    entry = load_folder(tmp_path, "g", SETTINGS, None, WarmupRuns(tiny)).versions[1]
    assert not entry.ready and entry.error is not None
    assert "over the memory budget of 16 bytes (OPSERVE_MEMORY_BUDGET_BYTES)" in entry.error


def test_a_model_sent_whole_warms_up_on_zero_data_but_has_no_files() -> None:
    config = ('{"max_batch_size": 4, "input": [{"name": "idx", "data_type": "TYPE_INT64", '
              '"dims": [2]}], "output": [{"name": "y", "data_type": "TYPE_FP32", "dims": [2]}], '
              '"parameters": {"isolated": {"string_value": "false"}}, '
              '"model_warmup": [{"name": "w", "batch_size": 2, "inputs": {"idx": '
              '{"data_type": "TYPE_INT64", "dims": [2], %s}}}]}')  # fmt: skip
    sent = {"1/model.onnx": _gather(["n", 2])}
    settings = Settings(client_models_in_process=True)  # the isolated path: tests/v2
    loaded = load_folder(None, "g", settings, Overrides(config % '"zero_data": true', sent))
    assert loaded.versions[1].ready
    loaded = load_folder(None, "g", settings, Overrides(config % '"input_data_file": "f"', sent))
    assert loaded.versions[1].error == (
        "warmup sample 'w': warmup data file 'f' for input 'idx': a model sent whole with a "
        "load request has no folder, so no warmup files; use zero_data or random_data"
    )


def test_a_client_s_model_warms_up_in_the_isolated_workers() -> None:
    """Its warmup runs where its requests run: in a worker (onnxruntime's error comes back from
    there), and with no pool at hand it is not run in this process."""
    config = ('{"max_batch_size": 4, "input": [{"name": "idx", "data_type": "TYPE_INT64", '
              '"dims": [2]}], "output": [{"name": "y", "data_type": "TYPE_FP32", "dims": [2]}], '
              '"model_warmup": [{"name": "w", "batch_size": 2, "inputs": {"idx": '
              '{"data_type": "TYPE_INT64", "dims": [2], "random_data": true}}}]}')  # fmt: skip
    sent = Overrides(config, {"1/model.onnx": _gather(["n", 2])})
    alone = load_folder(None, "g", SETTINGS, sent).versions[1]
    assert alone.error == ("failed to run warmup sample 'w': a client's model runs only in the "
                           "isolated workers, and this run has none; ")  # fmt: skip
    pool = FallbackPool(SETTINGS)
    try:
        entry = load_folder(None, "g", SETTINGS, sent, WarmupRuns(None, pool)).versions[1]
        assert entry.error is not None
        assert entry.error.startswith("failed to run warmup sample 'w': ")
        assert "indices element out of data bounds" in entry.error
        assert pool.workers, "no worker ran the warmup"
    finally:
        pool.close()
