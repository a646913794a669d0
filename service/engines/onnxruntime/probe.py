"""The load probe: before the server opens a model in onnxruntime, a child process opens the
same bytes with the same session options, each session the server will hold (`main`, below), so a model that makes onnxruntime
crash or hang while it loads takes the probe down, not the server.

A probe costs a process start and onnxruntime's import, about half a second, so its outcome
is kept by the bytes' digest (`PROBES`): a load of 200 versions of one file probes once, a
model loaded again probes not at all. Kept: "opened" or onnxruntime's reason, for the
MAX_KEPT contents probed last. A probe that ran out of time is kept apart, for
TIMED_OUT_SECONDS only (how long a load takes depends on how loaded the machine was): the same
bytes sent again meanwhile are refused at once, without a probe, so a client cannot make the
server spend OPSERVE_ONNXRUNTIME_LOAD_SECONDS of a process on one slow model again and again.
"""

import os
import subprocess
import sys
import threading
import time
from collections import OrderedDict
from pathlib import Path

from service.engines.onnxruntime.session import MAX_REASON, Unsupported
from service.engines.workers.limits import MALLOC_ARENAS
from service.runtime.digest import model_digest

PROBE_HEADROOM = 256 * 1024 * 1024  # the probe's room for onnxruntime's own allocations
MAX_KEPT = 1024  # outcomes kept: a digest, the options and at most MAX_REASON characters each
TIMED_OUT_SECONDS = 600.0  # how long the bytes of a probe that ran out of time are refused


class ProbeTimeout(Unsupported):
    """The probe did not open the model within its time."""


class Probes:
    """The probe's outcomes by content, the least recently used dropped past MAX_KEPT."""

    def __init__(self) -> None:
        self.outcomes: OrderedDict[tuple[bytes, tuple[int, ...], int], str | None] = OrderedDict()
        self.lock = threading.Lock()  # loads run on several threads
        self.started = 0  # probe processes started (what a test counts)
        self.timed_out: OrderedDict[bytes, tuple[float, str]] = OrderedDict()  # until, why

    def check(self, data: bytes, threads: int | tuple[int, ...], seconds: float,
              max_graph_bytes: int) -> None:  # fmt: skip
        """Raise Unsupported unless onnxruntime opens `data` in a probe, a session for each
        of the intra-op thread `threads` (session.Threads) held at once (given twice the
        model per session, the graph limit and PROBE_HEADROOM of memory): probed once per
        content and options."""
        counts = tuple(dict.fromkeys(threads)) if isinstance(threads, tuple) else (threads,)
        room = 2 * len(data) * len(counts) + max_graph_bytes + PROBE_HEADROOM
        digest = model_digest(data)
        key = (digest, counts, room)
        with self.lock:
            known = key in self.outcomes
            said = self.outcomes.get(key)
            if known:
                self.outcomes.move_to_end(key)
            slow = self.timed_out.get(digest)
            if slow is not None and slow[0] <= time.monotonic():
                del self.timed_out[digest]
                slow = None
        if slow is not None:
            raise ProbeTimeout(f"{slow[1]}; the same bytes are refused for "
                               f"{TIMED_OUT_SECONDS:g} s after that")  # fmt: skip
        if not known:
            self.started += 1
            try:
                probe(data, counts, seconds, room)
            except ProbeTimeout as exc:
                with self.lock:
                    self.timed_out[digest] = (time.monotonic() + TIMED_OUT_SECONDS, str(exc))
                    while len(self.timed_out) > MAX_KEPT:
                        self.timed_out.popitem(last=False)
                raise
            except Unsupported as exc:
                said = str(exc)
            with self.lock:
                self.outcomes[key] = said
                while len(self.outcomes) > MAX_KEPT:
                    self.outcomes.popitem(last=False)
        if said is not None:
            raise Unsupported(said)


PROBES = Probes()
"""The process's probe outcomes."""


def probe(data: bytes, counts: tuple[int, ...], seconds: float, room: int) -> None:
    """Open the model in a child process (`main`), a session per intra-op thread count in
    `counts`, with `room` bytes of address space; raise
    Unsupported with its reason, or for a crash, or ProbeTimeout for a load over `seconds`."""
    root = str(Path(__file__).parents[3])  # the folder that holds the service package
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [root, *filter(None, [os.environ.get("PYTHONPATH")])]),
        "MALLOC_ARENA_MAX": MALLOC_ARENAS}  # fmt: skip
    command = [sys.executable, "-m", "service.engines.onnxruntime.probe",
               ",".join(map(str, counts)), str(room)]  # fmt: skip
    try:
        done = subprocess.run(command, input=data, capture_output=True, timeout=seconds,
                              env=env, check=False)  # fmt: skip
    except subprocess.TimeoutExpired:  # run() killed the probe
        raise ProbeTimeout(f"onnxruntime took over {seconds:g} s to load it "
                           "(OPSERVE_ONNXRUNTIME_LOAD_SECONDS)") from None  # fmt: skip
    if done.returncode == 0:
        return
    said = done.stdout.decode("utf-8", "replace").strip()
    if said:
        raise Unsupported(said[:MAX_REASON])
    raise Unsupported(f"onnxruntime crashed loading it (exit status {done.returncode})")


def main(counts: tuple[int, ...], room: int) -> int:
    """The probe process: open the model read from stdin, a session per thread count in
    `counts` held at once (as the server holds them), with `room` bytes of address space
    beyond what the process holds once onnxruntime is imported; 0 when onnxruntime loads it,
    else 1 with onnxruntime's reason on stdout."""
    for name in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[name] = "1"
    data = sys.stdin.buffer.read()
    import onnxruntime as ort

    from service.engines.onnxruntime.session import reason, session_options
    from service.engines.workers.limits import limit_address_space, pool_threads_bytes

    # constant folding runs while the session is made: a graph of constants may allocate
    # without bound there, so the probe does it under a limit, before the server does; the
    # sessions' pool threads' stacks are not the room's
    limit_address_space(room + pool_threads_bytes(counts))

    try:
        held = [ort.InferenceSession(data, session_options(count),
                                     providers=["CPUExecutionProvider"]) for count in counts]  # fmt: skip
        del held
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


if __name__ == "__main__":  # python -m service.engines.onnxruntime.probe <counts,> <room>
    sys.exit(main(tuple(map(int, sys.argv[1].split(","))), int(sys.argv[2])))
