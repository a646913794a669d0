"""Tile and ConstantOfShape on 64 MiB outputs, against a plain copy, np.tile and onnxruntime.

    python bench/bench_kernels.py

Every figure is the best of N runs of the same work. Ratios are to a plain copy of 64 MiB into a
fresh buffer (`src.copy()`) and to onnxruntime's kernel on the same input (`run_with_ort_values`
on one thread: its arena reuses memory; no conversion to numpy). The cases run twice, each in a
fresh process: with glibc's default allocator, then with `configure_allocator` called first (as
the service does at start-up), which lets freed large blocks be reused instead of unmapped.
"thread" runs our kernel on a worker thread, as the service does for large outputs.
"""

import subprocess
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from anywhere

from service.kernels.allocator import configure_allocator
from service.kernels.context import KernelContext
from service.operators.registry import resolve
from service.operators.run import run

MiB = 1 << 20
RUNS = 25
CTX = KernelContext(max_output_bytes=256 * MiB)


def best_ms(fn: Callable[[], Any], runs: int = RUNS) -> float:
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - start)
        del result  # freed before the next run, as a served response would be
    return min(times) * 1e3


def ort_session(node: Any, inputs: dict[str, np.ndarray], out_type: int) -> Callable[[], Any]:
    graph = helper.make_graph(
        [node],
        "bench",
        [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(a.dtype), a.shape)
         for n, a in inputs.items()],
        [helper.make_tensor_value_info("output", out_type, None)],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1  # one core, like our kernels
    session = ort.InferenceSession(model.SerializeToString(), options, ["CPUExecutionProvider"])
    values = {n: ort.OrtValue.ortvalue_from_numpy(a) for n, a in inputs.items()}
    return lambda: session.run_with_ort_values(None, values)


def tile_case(shape: tuple[int, ...], repeats: list[int]) -> tuple[str, dict[str, Callable]]:
    x = np.random.default_rng(0).random(shape, dtype=np.float32)
    reps = np.array(repeats, dtype=np.int64)
    op = resolve("Tile", 13)
    assert np.array_equal(run(op, {"input": x, "repeats": reps}, {}, CTX)["output"],
                          np.tile(x, repeats))  # fmt: skip
    node = helper.make_node("Tile", ["input", "repeats"], ["output"])
    return f"Tile-13 {shape} x {repeats}", {
        "ours": lambda: run(op, {"input": x, "repeats": reps}, {}, CTX),
        "ort": ort_session(node, {"input": x, "repeats": reps}, TensorProto.FLOAT),
        "np.tile": lambda: np.tile(x, repeats),
    }


def constant_of_shape_case(fill: float) -> tuple[str, dict[str, Callable]]:
    shape = np.array([4096, 4096], dtype=np.int64)
    value = np.array([fill], dtype=np.float32)
    op = resolve("ConstantOfShape", 20)
    node = helper.make_node(
        "ConstantOfShape", ["input"], ["output"], value=numpy_helper.from_array(value)
    )
    return f"ConstantOfShape [4096, 4096] float {fill}", {
        "ours": lambda: run(op, {"input": shape}, {"value": value}, CTX),
        "ort": ort_session(node, {"input": shape}, TensorProto.FLOAT),
        "np.full": lambda: np.full((4096, 4096), fill, dtype=np.float32),
    }


def cases() -> list[tuple[str, dict[str, Callable]]]:
    """Built after the allocator is configured, as the service decodes inputs after start-up."""
    return [
        tile_case((1024, 1024), [4, 4]),  # 4 KiB blocks, two axes: one broadcast copy
        tile_case((4096, 4), [4, 256]),  # 16-byte blocks, two axes: two passes, np.repeat last
        tile_case((2048, 8), [1, 1024]),  # 32-byte blocks, one axis: np.repeat
        tile_case((16, 4096), [256, 1]),  # outer axis only: the whole 256 KiB input per block
        constant_of_shape_case(1.5),
        constant_of_shape_case(0.0),  # all-zero bits: calloc
    ]


def measure(label: str) -> None:
    source = np.ones(64 * MiB, dtype=np.uint8)
    copy_ms = best_ms(source.copy)
    print(f"\nallocator: {label}; plain copy of 64 MiB into a fresh buffer: {copy_ms:.2f} ms")
    print(f"{'case':44} {'ours':>6} {'thread':>6} {'ort':>6} {'numpy':>6} "
          f"{'/copy':>6} {'/ort':>6} {'numpy fn':>9}")  # fmt: skip
    with ThreadPoolExecutor(max_workers=1) as pool:
        for name, fns in cases():
            ours = best_ms(fns["ours"])
            thread = pool.submit(best_ms, fns["ours"]).result()
            ort_ms = best_ms(fns["ort"])
            numpy_name = next(k for k in fns if k.startswith("np."))
            numpy_ms = best_ms(fns[numpy_name])
            print(f"{name:44} {ours:6.2f} {thread:6.2f} {ort_ms:6.2f} {numpy_ms:6.2f} "
                  f"{ours / copy_ms:6.2f} {ours / ort_ms:6.2f} {numpy_name:>9}")  # fmt: skip


def main() -> None:
    if sys.argv[1:] == ["--phase", "default"]:
        measure("glibc defaults")
    elif sys.argv[1:] == ["--phase", "configured"]:
        applied = configure_allocator(256 * MiB)
        measure(
            f"configure_allocator(256 MiB) {'applied' if applied else 'not applied (not glibc)'}"
        )
    else:  # each phase in a fresh process: mallopt settings cannot be undone
        print(f"numpy {np.__version__}, onnxruntime {ort.__version__}; best of {RUNS}; ms")
        for phase in ("default", "configured"):
            subprocess.run([sys.executable, __file__, "--phase", phase], check=True)


if __name__ == "__main__":
    main()
