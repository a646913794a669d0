"""The probe process: opens a model (its bytes on stdin) in onnxruntime with the service's
session options and exits 0, or prints onnxruntime's reason and exits 1. A crash or hang here
is the probe's, not the server's (ort_session.probe)."""

import os
import sys


def main(threads: int) -> int:
    """Open the model read from stdin; 0 when onnxruntime loads it."""
    for name in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[name] = "1"
    data = sys.stdin.buffer.read()
    import onnxruntime as ort

    from service.runtime.ort_session import reason, session_options

    try:
        ort.InferenceSession(data, session_options(threads), providers=["CPUExecutionProvider"])
    except Exception as exc:
        sys.stdout.write(reason(exc))
        return 1
    return 0


if __name__ == "__main__":  # python -m service.runtime.ort_probe <threads>
    sys.exit(main(int(sys.argv[1])))
