"""The fallback worker process: loads models that need onnx.reference and runs them, one at a
time, for the server's FallbackPool (workers/pool.py).

It runs under an address-space limit (RLIMIT_AS: what it had once started, plus room for the
graph's limits), so a node that would allocate past it fails with MemoryError (413) instead
of taking the host's memory; before a run, onnx shape inference with the request's input
shapes names a node whose output would pass OPSERVE_MAX_OUTPUT_BYTES (413) before it runs.
The server kills the process at the run deadline; the node that was running is written to
`running` before each one starts.
"""

import json
import os
import sys
from multiprocessing.connection import Connection
from typing import Any

from service.engines.workers.limits import limit_address_space

MiB = 1024 * 1024
HEADROOM = 256 * MiB  # address space for what a run allocates besides its tensors
NICENESS = 5  # the worker's scheduling priority below the server's


def main(conn: Connection, running: str, limits: dict[str, Any], directory: str | None) -> None:
    """Serve runs from `conn` until it closes; name each node in the file `running`; write
    large results in `directory` (the pool's private one; None: pickled)."""
    # one thread for numpy's BLAS: its threads would reserve address space and compete with
    # the server's cores
    for name in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[name] = "1"
    # below the server on the CPU: a client's model that spins until its deadline must not
    # take the cores from the server's event loop and its other clients' runs
    os.nice(NICENESS)
    import warnings

    warnings.simplefilter("ignore")  # the reference's warnings are not the server's log
    from service.engines.workers.run import Runner  # after the variables above: numpy reads them

    warm = limits.pop("warm_onnxruntime", False)  # the pool's, not a setting
    runner = Runner(limits, running, directory)
    limit_address_space(limits["isolated_worker_bytes"] or (
        2 * limits["max_graph_bytes"] + 2 * limits["max_request_bytes"] + HEADROOM))  # fmt: skip
    if warm:  # the pool has run clients' models: the next will need it (workers/pool.py)
        from service.engines.workers.limits import import_onnxruntime

        import_onnxruntime()
    while True:
        try:
            message = conn.recv()
        except (EOFError, OSError):
            return
        conn.send(runner.serve(message))


if (
    __name__ == "__main__"
):  # python -m service.engines.workers.worker <fd> <node file> <limits> <directory>
    main(Connection(int(sys.argv[1])), sys.argv[2], json.loads(sys.argv[3]), sys.argv[4] or None)
