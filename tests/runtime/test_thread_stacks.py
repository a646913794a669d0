"""The pool threads of onnxruntime's sessions reserve stacks (8 MiB each by default) in the
address space that the load probe's and the isolated workers' limits count. On a host of many
cores a model's two sessions start many threads (46 on 32 cores: 368 MiB of stacks), which
are not a run's room: they are added to the limit, and taken off again when the model is let
go. Before, every model on 16 cores or more failed its probe (pthread_create refused) or
hung in it until OPSERVE_ONNXRUNTIME_LOAD_SECONDS.

This host may have 2 cores: the thread counts of a large one are asked for directly (the
probe's counts; in a worker, `worker_threads` replaced in its own process)."""

import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path
from typing import Any

import pytest
from onnx import TensorProto, helper

from service.engines.onnxruntime.probe import PROBE_HEADROOM, probe
from service.engines.workers.limits import pool_threads_bytes, thread_stack_bytes

ROOT = Path(__file__).resolve().parents[2]
MiB = 1024 * 1024
linux = pytest.mark.skipif(not Path("/proc/self/status").exists(),
                           reason="the address-space limit is read from /proc")  # fmt: skip


def relu(scale: float = 1.0) -> bytes:
    f = TensorProto.FLOAT
    factor = helper.make_tensor("s", f, [1], [scale])
    graph = helper.make_graph([helper.make_node("Mul", ["x", "s"], ["m"]),
                               helper.make_node("Relu", ["m"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", f, [4])],
                              [helper.make_tensor_value_info("y", f, [4])], [factor])  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()


def worker_runner() -> tuple[Any, Any]:
    """A worker's Runner with the default settings' limits, onnxruntime imported as a worker
    imports it, and the file it names its nodes in (held open while the Runner is)."""
    from service.engines.workers.limits import import_onnxruntime
    from service.engines.workers.pool import LIMITS
    from service.engines.workers.run import NODE_BYTES, Runner
    from service.settings import Settings

    running = tempfile.NamedTemporaryFile()  # noqa: SIM115 (the caller holds it)
    running.write(bytes(NODE_BYTES))
    running.flush()
    settings = Settings()
    runner = Runner({name: getattr(settings, name) for name in LIMITS}, running.name, None)
    import_onnxruntime()
    return runner, running


def test_the_stacks_are_counted_per_pool_thread() -> None:
    assert pool_threads_bytes((1,)) == 0  # the caller's own thread runs a one-thread session
    assert pool_threads_bytes((32, 16)) == 46 * thread_stack_bytes()
    assert thread_stack_bytes() >= 64 * 1024


@linux
@pytest.mark.parametrize("counts", [(16, 8), (32, 16), (64, 32)])
def test_the_probe_opens_a_model_with_the_threads_of_a_large_host(counts: tuple[int, int]) -> None:
    data = relu()
    room = 2 * len(data) * len(counts) + 256 * MiB + PROBE_HEADROOM  # as Probes.check gives
    probe(data, counts, 60.0, room)  # raised Unsupported (pthread_create) or timed out before


WORKER = textwrap.dedent("""
    import resource, sys, tempfile
    import numpy as np
    sys.path.insert(0, sys.argv[1])
    from service.engines.onnxruntime import session
    session.worker_threads = lambda workers: session.Threads(32, 16)  # a 32-core host
    from service.engines.workers.limits import limit_address_space
    from service.engines.workers.run import CACHED_MODELS
    from service.engines.workers.worker import HEADROOM
    from service.settings import Settings
    from tests.runtime.test_thread_stacks import relu, worker_runner

    runner, running = worker_runner()
    settings = Settings()
    limit_address_space(2 * settings.max_graph_bytes + 2 * settings.max_request_bytes + HEADROOM)
    start = resource.getrlimit(resource.RLIMIT_AS)[0]
    x = np.array([-1, 0, 1, 2], np.float32)
    for i in range(CACHED_MODELS + 4):  # more models than are kept: the first ones let go
        data = relu(float(i + 1))
        kind, body = runner.serve((bytes([i]) * 32, "onnxruntime", data,
                                   {"x": ("value", x)}, None, False, 32))
        assert kind == "ok", body
        assert body["outputs"]["y"][1].tolist() == np.maximum(x * (i + 1), 0).tolist()
    held = resource.getrlimit(resource.RLIMIT_AS)[0] - start
    print(held, len(runner.models), len(runner.widened))
""")


@linux
def test_a_worker_holds_models_with_the_threads_of_a_large_host() -> None:
    done = subprocess.run([sys.executable, "-c", WORKER, str(ROOT)], capture_output=True,
                          text=True, timeout=120, env={"MALLOC_ARENA_MAX": "2", "PATH": ""},
                          check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    held, models, widened = map(int, done.stdout.split())
    # the limit is widened for the models held, and only theirs: their stacks, and twice the
    # model for the second session
    assert models == widened == 8
    assert held == 8 * (pool_threads_bytes((32, 16)) + 2 * len(relu()))


ROOM = textwrap.dedent("""
    import sys, tempfile
    import numpy as np
    sys.path.insert(0, sys.argv[1])
    from onnx import TensorProto, helper
    from service.engines.onnxruntime import session
    counts = tuple(map(int, sys.argv[3].split(",")))
    session.worker_threads = lambda workers: session.Threads(*counts)
    from service.engines.workers.limits import limit_address_space
    from tests.runtime.test_thread_stacks import worker_runner

    columns = 12 * 1024  # a MatMul by 48 MiB of weights
    w = np.random.default_rng(0).standard_normal((1024, columns)).astype(np.float32)
    f = TensorProto.FLOAT
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])], "g",
        [helper.make_tensor_value_info("x", f, [1, 1024])],
        [helper.make_tensor_value_info("y", f, [1, columns])],
        [helper.make_tensor("w", f, w.shape, w.tobytes(), raw=True)])
    data = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    data = data.SerializeToString()
    expected = np.ones((1, 1024), np.float32) @ w
    del w, graph
    runner, running = worker_runner()
    limit_address_space(int(sys.argv[2]))
    kind, body = runner.serve((b"m" * 32, "onnxruntime", data,
                               {"x": ("value", np.ones((1, 1024), np.float32))}, None, False,
                               counts[0]))
    if kind == "ok":
        np.testing.assert_allclose(body["outputs"]["y"][1], expected, rtol=1e-4, atol=1e-3)
    print(kind, body[1] if kind == "error" else "")
""")


def _served(room: int, counts: str) -> str:
    done = subprocess.run([sys.executable, "-c", ROOM, str(ROOT), str(room), counts],
                          capture_output=True, text=True, timeout=120,
                          env={"MALLOC_ARENA_MAX": "2", "PATH": ""}, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout.split()[0]


@linux
@pytest.mark.skipif(thread_stack_bytes() > 64 * MiB, reason="a stack past 64 MiB a thread")
def test_a_model_that_fit_a_worker_in_one_session_fits_in_two() -> None:
    """The worker's second session (every core) is the server's choice, not the run's room:
    a model that a worker held in one session within its limit is held in two within it."""
    room = next((room for room in range(128 * MiB, 1024 * MiB, 32 * MiB)
                 if _served(room, "1,1") == "ok"), None)  # fmt: skip
    assert room is not None, "one session did not fit in 1 GiB of room"
    assert _served(room, "2,1") == "ok"


CAPPED = textwrap.dedent("""
    import resource, sys
    sys.path.insert(0, sys.argv[1])
    from service.engines.workers.limits import widen_address_space
    MiB = 1024 * 1024
    hard = 64 * 1024 * MiB
    resource.setrlimit(resource.RLIMIT_AS, (hard - 10 * MiB, hard))
    widened = widen_address_space(100 * MiB)  # capped by the hard limit: 10 MiB
    assert resource.getrlimit(resource.RLIMIT_AS) == (hard, hard)
    widen_address_space(-widened)
    print(widened // MiB, (hard - resource.getrlimit(resource.RLIMIT_AS)[0]) // MiB)
""")


@linux
def test_a_widening_the_hard_limit_capped_is_taken_back_as_far_as_it_went() -> None:
    done = subprocess.run([sys.executable, "-c", CAPPED, str(ROOT)], capture_output=True,
                          text=True, timeout=60, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == ["10", "10"]  # back where it was, not 90 MiB lower
