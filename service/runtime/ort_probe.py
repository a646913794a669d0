"""The probe process: opens a model (its bytes on stdin) in onnxruntime with the service's
session options and exits 0, or prints onnxruntime's reason and exits 1. A crash or hang here
is the probe's, not the server's (ort_session.probe)."""

import os
import resource
import sys


def main(threads: int, room: int) -> int:
    """Open the model read from stdin, with `room` bytes of address space beyond what the
    process holds once onnxruntime is imported; 0 when onnxruntime loads it."""
    for name in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[name] = "1"
    data = sys.stdin.buffer.read()
    import onnxruntime as ort

    from service.runtime.fallback_worker import _vm_size
    from service.runtime.ort_session import reason, session_options

    # constant folding runs while the session is made: a graph of constants may allocate
    # without bound there, so the probe does it under a limit, before the server does
    size = _vm_size()
    if size is not None:
        _soft, hard = resource.getrlimit(resource.RLIMIT_AS)
        limit = size + room if hard == resource.RLIM_INFINITY else min(size + room, hard)
        resource.setrlimit(resource.RLIMIT_AS, (limit, hard))

    try:
        ort.InferenceSession(data, session_options(threads), providers=["CPUExecutionProvider"])
    except MemoryError:
        sys.stdout.write(
            "onnxruntime needed more memory than OPSERVE_MAX_GRAPH_BYTES allows "
            "to load it (constant folding)"
        )
        return 1
    except Exception as exc:
        sys.stdout.write(reason(exc))
        return 1
    return 0


if __name__ == "__main__":  # python -m service.runtime.ort_probe <threads> <room>
    sys.exit(main(int(sys.argv[1]), int(sys.argv[2])))
