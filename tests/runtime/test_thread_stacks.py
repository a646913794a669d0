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
import textwrap
from pathlib import Path

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
    from service.engines.workers.run import CACHED_MODELS, NODE_BYTES, Runner
    from service.engines.workers.worker import HEADROOM
    from service.settings import Settings
    from tests.runtime.test_thread_stacks import relu

    running = tempfile.NamedTemporaryFile()
    running.write(bytes(NODE_BYTES)); running.flush()
    settings = Settings()
    limits = {name: getattr(settings, name) for name in (
        "max_output_bytes", "max_elements", "max_graph_bytes", "max_request_bytes",
        "fallback_workers", "isolated_worker_bytes")}
    runner = Runner(limits, running.name, None)
    from service.engines.workers.limits import import_onnxruntime
    import_onnxruntime()
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
    print(held, len(runner.models), len(runner.stacks))
""")


@linux
def test_a_worker_holds_models_with_the_threads_of_a_large_host() -> None:
    done = subprocess.run([sys.executable, "-c", WORKER, str(ROOT)], capture_output=True,
                          text=True, timeout=120, env={"MALLOC_ARENA_MAX": "2", "PATH": ""},
                          check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    held, models, stacks = map(int, done.stdout.split())
    # the limit is widened by the stacks of the models held, and only theirs
    assert models == stacks == 8
    assert held == 8 * pool_threads_bytes((32, 16))
