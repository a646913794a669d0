"""Tensors between the server and its fallback workers travel in a directory private to the
server (0700 in /dev/shm): while runs of large arrays go on, their files appear only there,
never right in /dev/shm where a client shared memory key could name them; the directory goes
at shutdown, with what a killed worker left."""

import contextlib
import os
import stat
import threading
from collections.abc import Iterator

import numpy as np
import pytest
from onnx import helper

from service.engines.workers.pool import FallbackPool
from service.engines.workers.transport import (
    PREFIX,
    SHARED_BYTES,
    SHM_DIR,
    make_directory,
    pack,
    remove_directory,
    unlink_all_of,
    unpack,
)
from service.kernels.context import KernelContext
from service.runtime.plan import load_model
from service.runtime.run_control import RunControl
from service.settings import Settings
from tests.runtime.models import model, value

BIG = np.arange(2 * SHARED_BYTES // 4, dtype=np.float32)  # 2 MiB: through shared memory


@pytest.fixture
def pool() -> Iterator[FallbackPool]:
    made = FallbackPool(Settings(reference_fallback=True))
    yield made
    made.close()


def test_the_directory_is_private_and_holds_the_files() -> None:
    directory = make_directory()
    assert directory is not None
    try:
        info = os.stat(directory)
        assert os.path.dirname(directory) == SHM_DIR
        assert os.path.basename(directory).startswith(f"{PREFIX}transport-")
        assert stat.S_IMODE(info.st_mode) == 0o700 and info.st_uid == os.geteuid()
        made: list[str] = []
        packed = pack(BIG, made, directory)
        assert packed[0] == "shm" and made == [packed[1][0]]
        assert os.path.dirname(made[0]) == directory
        assert stat.S_IMODE(os.stat(made[0]).st_mode) == 0o600
        np.testing.assert_array_equal(unpack(packed), BIG)
        assert os.listdir(directory) == []  # the reader took it
    finally:
        remove_directory(directory)
    assert not os.path.exists(directory)


def test_without_a_directory_or_once_it_is_gone_arrays_are_pickled() -> None:
    made: list[str] = []
    assert pack(BIG, made, None)[0] == "value"
    directory = make_directory()
    remove_directory(directory)  # shutdown came first
    assert pack(BIG, made, directory)[0] == "value" and made == []


def test_a_killed_processs_files_are_removed() -> None:
    directory = make_directory()
    assert directory is not None
    try:
        made: list[str] = []
        pack(BIG, made, directory)
        other = os.path.join(directory, "1-leftover")  # another process's: kept
        open(other, "wb").close()
        unlink_all_of(os.getpid(), directory)
        assert os.listdir(directory) == ["1-leftover"]
        unlink_all_of(os.getpid(), None)  # no directory: nothing to do
    finally:
        remove_directory(directory)


def _in_dev_shm() -> set[str]:
    return {name for name in os.listdir(SHM_DIR) if name.startswith(PREFIX)}


def test_runs_in_a_worker_keep_their_files_in_the_pools_directory(pool: FallbackPool) -> None:
    """An Identity (onnx.reference) on 2 MiB: the input goes out and the output comes back
    through files, both seen in the private directory only."""
    identity = model([helper.make_node("Identity", ["x"], ["y"])], [value("x", shape=[None])],
                     [value("y", shape=[None])])  # fmt: skip
    loaded = load_model(identity.SerializeToString(), Settings(reference_fallback=True))
    before = _in_dev_shm()
    seen: set[str] = set()
    new_in_dev_shm: set[str] = set()
    done = threading.Event()

    def watch() -> None:
        while not done.is_set():
            directory = pool.directory
            if directory is not None:
                with contextlib.suppress(FileNotFoundError):
                    seen.update(os.listdir(directory))
            new_in_dev_shm.update(_in_dev_shm() - before)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        for turn in range(20):
            ctx = KernelContext(loaded.max_graph_bytes, output_format=None,
                                control=RunControl(30, fallback=pool))  # fmt: skip
            result = loaded.run({"x": BIG + turn}, ctx=ctx)
            np.testing.assert_array_equal(result.outputs["y"], BIG + turn)
    finally:
        done.set()
        watcher.join()
    directory = pool.directory
    assert directory is not None
    workers = {str(worker.process.pid) for worker in pool.workers}
    senders = {name.split("-")[0] for name in seen if not name.endswith(".node")}
    assert senders == {str(os.getpid()), *workers}, seen  # inputs, and outputs of the worker
    # none of these processes' files right in /dev/shm (other test runs share it)
    ours = tuple(f"{PREFIX}{pid}-" for pid in (str(os.getpid()), *workers))
    assert os.path.basename(directory) in new_in_dev_shm
    assert [name for name in new_in_dev_shm if name.startswith(ours)] == []
    pool.close()
    assert not os.path.exists(directory)
