"""An onnxruntime InferenceSession for a model, made with the service's bounds, or the reason
onnxruntime cannot run the model.

Bounds: threads per session so that OPSERVE_KERNEL_THREADS runs at once never ask for more
threads than the process has cores (`session_threads`); no thread spins waiting for work (the
cores are shared with the event loop); no CPU memory arena, so what a run allocated goes back
when it ends (the run's memory is claimed from the budget beforehand: onnxruntime/memory.py).

A model is only opened here after `screen()` (no external data, bounded size and depth) and
onnx.checker passed, and after a probe process opened the same bytes first (onnxruntime/probe.py): a
model that makes onnxruntime crash or hang while it loads takes the probe down, not the server.
"""

import os
from typing import Any

from onnx import ModelProto, TensorProto

CARRIED = frozenset({
    TensorProto.FLOAT, TensorProto.DOUBLE, TensorProto.FLOAT16, TensorProto.BOOL,
    TensorProto.INT8, TensorProto.INT16, TensorProto.INT32, TensorProto.INT64,
    TensorProto.UINT8, TensorProto.UINT16, TensorProto.UINT32, TensorProto.UINT64,
    TensorProto.STRING,
})  # fmt: skip
"""Element types onnxruntime's Python binding takes and gives as numpy arrays (bfloat16,
float8, int4 and the like it refuses: "Numpy_type 256 can't be converted to MLDataType")."""

MAX_REASON = 300  # characters of onnxruntime's own message kept in a reason


class Unsupported(Exception):
    """Why onnxruntime cannot run a model (the exact engine may)."""


def session_threads(kernel_threads: int) -> int:
    """Threads of one session's intra-op pool: the cores shared among the kernel threads."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return max(1, (cores or 1) // kernel_threads)


def session_options(threads: int) -> Any:
    """The options every session is made with (also in the probe process)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.enable_cpu_mem_arena = False  # memory goes back to the system after each run
    options.log_severity_level = 3  # errors only: warnings about the model are not the log's
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    options.add_session_config_entry("session.inter_op.allow_spinning", "0")
    return options


def check_types(model: ModelProto) -> None:
    """Raise Unsupported for a graph input or output of a type the binding cannot carry."""
    for role, values in (("input", model.graph.input), ("output", model.graph.output)):
        for info in values:
            elem = info.type.tensor_type.elem_type if info.type.HasField("tensor_type") else 0
            if info.type.HasField("tensor_type") and elem not in CARRIED:
                name = TensorProto.DataType.Name(elem) if elem else "of no element type"
                raise Unsupported(f"graph {role} {info.name[:100]!r} is {name}, which "
                                  "onnxruntime's Python binding does not carry")  # fmt: skip


def open_session(data: bytes, threads: int) -> Any:
    """An InferenceSession of the serialized model, which the load probe opened first
    (ort_probe.PROBES); raises Unsupported with onnxruntime's reason when it cannot."""
    import onnxruntime as ort

    try:
        return ort.InferenceSession(data, session_options(threads),
                                    providers=["CPUExecutionProvider"])  # fmt: skip
    except Exception as exc:  # the probe opened it: only a difference of state lands here
        raise Unsupported(reason(exc)) from None


def reason(exc: BaseException) -> str:
    """onnxruntime's message, without its status prefix, in one bounded line."""
    text = " ".join(str(exc).split()).removeprefix("[ONNXRuntimeError] : ")
    text = text.split(" : ", 2)[-1] if text[:2].strip().isdigit() else text
    return text[:MAX_REASON] + ("..." if len(text) > MAX_REASON else "")
