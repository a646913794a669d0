"""An onnxruntime InferenceSession for a model, made with the service's bounds, or the reason
onnxruntime cannot run the model.

Bounds: no thread spins waiting for work (the cores are shared with the event loop), unless
the operator asks it of a model (below); no CPU memory arena, so what a run allocated goes
back when it ends (the run's memory is claimed from the budget beforehand:
onnxruntime/memory.py).

Threads: a run that starts while no other onnxruntime run is in flight in the process gets
every core; a run that starts while another is in flight gets its share, cores //
OPSERVE_KERNEL_THREADS (`CoreShare`). Intra-op threads belong to a session, so a model has two
sessions (`SharedSession`): one with every core, one with the share (one session when the two
counts are equal: one core, or one kernel thread). Kernel threads' runs then never ask for more
threads than there are cores, but for one case: runs that start while a lone run has every
core add their share until it ends (they do not wait for it: a run onnxruntime cannot stop
would hold them for good). The cores are those the process may run on, at most its
container's CPU quota (`cores`). Measured on a busy 2-core host (docs/models.md, "Speed"):
with 4 calls at once the server went from 0.76-1.08x to 1.16-1.33x of in-process
onnxruntime's throughput on a 224x224 CNN; a lone run gained only in the host's quiet
moments (best 8.8 ms on every core against 11.2 ms on one thread). Chosen over the
alternatives onnxruntime 1.32 offers:

- its global thread pools (`set_global_thread_pool_sizes`, `use_per_session_threads = False`)
  spin: their spinning is not a session option, and Python cannot turn it off (measured: 1.5-3x
  the CPU per run and 3-6 % of a core while idle); they are also the whole process's, for good;
- one session with every core for all runs: two runs at once on 2 cores then ask for 3
  threads (one model's pool serves both) or 4 (two models');
- sharing the weights between the two sessions (`add_initializer`, `add_external_initializers`)
  saved nothing: two sessions given the same initializers held as much as two without, as
  onnxruntime prepacks or transforms weights per session (MatMul's packed B), and its
  prepacked-weights container is not in the Python API;
- a lone run's session spinning while it runs (`session.intra_op.allow_spinning` with
  `session.force_spinning_stop`, which ends the spinning as the run ends, where the defaults
  spin on for about 55 ms of a core): on a quiet host the 224x224 CNN's lone call over HTTP
  took 6.6-6.8 ms against 7.8-8.7 ms (its sleeping pool thread takes 0.1-0.25 ms to wake at
  each parallel section), but the spinning thread holds the second core for the whole run,
  and other clients' requests wait for it: beside other work (a test run, busy loops), the
  dynamic batcher's priority test, whose high-priority request must reach the server while a
  1 s lone run holds the instance, failed in 2 of 11 runs with it and 0 of 12 without, these
  beside more load (docs/models.md, 2026-11-29);
- the pool threads pinned to cores of their own (`session.intra_op_thread_affinities`): the
  whole gap in a single-threaded benchmark; in the server, whose kernel threads call, faster
  over HTTP and slower over gRPC, by the minute (servers called in turns, 2026-11-29: the
  224x224 CNN over HTTP 7.37 -> 6.11 and 6.95 -> 6.54 ms, over gRPC 8.67 -> 8.56 and 8.41
  -> 9.33; the calling thread pinned apart as well, no better);
- spinning bounded in time (`session.intra_op.spin_duration_us`), at any niceness of the pool
  threads: faster for back-to-back calls, twice as slow a small run after a pause (both in
  docs/models.md, "2026-11-29, later").

The operator may ask for what onnxruntime's defaults do for one of its models: the model
parameter `session.intra_op.allow_spinning: "1"` (onnxruntime's own key) makes the session
with every core spin waiting for work (`at_lowest_priority`: its pool threads at nice 19, so
the event loop and other clients' runs take their core first); the share's session, for runs
beside others, never spins, nor does a model in the isolated workers, nor one with a single
session. On 2 cores it took the 224x224 CNN's lone call over HTTP from 7.45 to 5.42 ms
(bench/bench_engines.py), for about 40 ms of a core after each run, which counts against a
container's CPU quota; the small operator call made right after it took as long as after
the model without (0.51-0.54 ms against 0.50), but another client's small CNN called beside
it back to back had its 99th percentile go from 4.1-5.0 to 6.8-9.8 ms (at any nice value:
onnxruntime's calling thread spins at the end of each parallel section until its pool's
work is done). Off by default: a server that shares its cores among clients does not burn
one for the next call of one model.

The price is memory and load time: a model holds two sessions, about twice the memory of one
(a session held 2.2-3x the model's size: a 48 MB MatMul model, a 135 MB Conv model), and
both are opened, in the probe too (with room for both).

The isolated workers run one request at a time per process, on the same cores: the server
counts their runs in its CORES with the in-process ones, and a worker's run gets every core
when it starts alone, else the cores shared among the workers (`worker_threads`); the worker
holds both sessions and runs on the one the server's count chose (`Granted`).

A model is only opened here after `screen()` (no external data, bounded size and depth) and
onnx.checker passed, and after a probe process opened the same bytes first (onnxruntime/probe.py): a
model that makes onnxruntime crash or hang while it loads takes the probe down, not the server.
"""

import logging
import os
import sys
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, NamedTuple

from onnx import ModelProto, TensorProto

CARRIED = frozenset({
    TensorProto.FLOAT, TensorProto.DOUBLE, TensorProto.FLOAT16, TensorProto.BOOL,
    TensorProto.INT8, TensorProto.INT16, TensorProto.INT32, TensorProto.INT64,
    TensorProto.UINT8, TensorProto.UINT16, TensorProto.UINT32, TensorProto.UINT64,
    TensorProto.STRING,
})  # fmt: skip
"""Element types onnxruntime's Python binding takes and gives as numpy arrays (bfloat16,
float8, int4 and the like it refuses: "Numpy_type 256 can't be converted to MLDataType")."""

log = logging.getLogger("opserve")
MAX_REASON = 300  # characters of onnxruntime's own message kept in a reason
CGROUP = Path("/sys/fs/cgroup")  # a container's own cgroup, seen from inside it


class Unsupported(Exception):
    """Why onnxruntime cannot run a model (the exact engine may)."""


def cores(cgroup: Path = CGROUP) -> int:
    """The cores this process may run on: those it may be scheduled on, at most its cgroup's
    CPU quota rounded up (a container's CPU limit, which the scheduler enforces by pausing
    every thread once the quota is spent)."""
    found = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    quota = _quota(cgroup)
    return max(1, min(found or 1, quota or found or 1))


def _quota(cgroup: Path) -> int | None:
    """The CPU quota of cgroup v2 (cpu.max: "<quota> <period>" or "max <period>") or v1
    (cpu/cpu.cfs_quota_us, -1 for none), in cores rounded up; None without one."""
    try:
        if (cgroup / "cpu.max").exists():
            quota, period = (cgroup / "cpu.max").read_text().split()[:2]
        else:
            quota = (cgroup / "cpu" / "cpu.cfs_quota_us").read_text().strip()
            period = (cgroup / "cpu" / "cpu.cfs_period_us").read_text().strip()
        if quota in ("max", "-1"):
            return None
        return max(1, -(-int(quota) // int(period)))
    except (OSError, ValueError):
        return None


def session_threads(kernel_threads: int) -> int:
    """A run's share of the cores while others are in flight: the cores shared among the
    kernel threads (at least one)."""
    return max(1, cores() // kernel_threads)


class Threads(NamedTuple):
    """Intra-op threads of a run: `alone` when it starts with no other run in flight,
    `shared` when it starts while others are."""

    alone: int
    shared: int

    @property
    def counts(self) -> tuple[int, ...]:
        """The distinct counts: the sessions a model holds."""
        return tuple(dict.fromkeys(self))


def run_threads(kernel_threads: int) -> Threads:
    """Every core for a lone run, the share while others are in flight."""
    return Threads(cores(), session_threads(kernel_threads))


def worker_threads(workers: int) -> Threads:
    """The threads of a run in an isolated worker: every core when it starts with no other run
    in flight in the server or its workers (CORES), else the cores shared among the workers.
    The server counts its workers' runs in CORES, as they run on the same cores, and sends
    each run the count it took (`Granted`)."""
    return Threads(cores(), session_threads(workers))


class CoreShare:
    """The runs in flight on onnxruntime in this process, and the threads they were given."""

    def __init__(self) -> None:
        self.lock = threading.Lock()  # runs start and end on several threads and the loop
        self.in_flight = 0
        self.booked = 0  # intra-op threads of the runs in flight

    def take(self, threads: Threads) -> int:
        """The threads a run starting now gets (give() them back when it ends): every core
        when no other run is in flight, else the share. Never waits."""
        with self.lock:
            given = threads.alone if self.in_flight == 0 else threads.shared
            self.in_flight += 1
            self.booked += given
            return given

    def give(self, given: int) -> None:
        with self.lock:
            self.in_flight -= 1
            self.booked -= given


CORES = CoreShare()
"""The process's runs on onnxruntime, and in the server its isolated workers' runs (those on
the exact engine count as one thread: they take a core too)."""


class Granted:
    """An isolated worker's runs: each runs with the thread count the server process took for
    it from its CORES (workers/pool.py), which counts the runs of that process and of its
    workers; a worker's own count would see one run at a time, and every run alone. (With
    OPSERVE_WORKERS > 1, each server process counts its own, as for its in-process runs.)"""

    def __init__(self) -> None:
        self.given = 0  # set by the worker before each run (workers/run.py)

    def take(self, threads: Threads) -> int:
        return self.given if self.given in threads else threads.shared

    def give(self, given: int) -> None:
        """Nothing to give back here: the count is the server's."""


class SharedSession:
    """A model's sessions by intra-op thread count; `run` runs on the one CORES gives."""

    def __init__(self, sessions: dict[int, Any], threads: Threads,
                 share: CoreShare | Granted = CORES) -> None:  # fmt: skip
        self.sessions = sessions
        self.threads = threads
        self.share = share

    def run(self, output_names: Any, input_feed: Any, run_options: Any = None) -> Any:
        """InferenceSession.run on the session with the threads the run is given."""
        given = self.share.take(self.threads)
        try:
            return self.sessions[given].run(output_names, input_feed, run_options)
        finally:
            self.share.give(given)


def session_options(threads: int, spinning: bool = False) -> Any:
    """The options every session is made with, for `threads` intra-op threads (also in the
    probe process; the workers' sessions too); `spinning`: its pool threads spin waiting for
    work, as onnxruntime's defaults do (the operator's choice for a model, `SPINNING`)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.enable_cpu_mem_arena = False  # memory goes back to the system after each run
    options.log_severity_level = 3  # errors only: warnings about the model are not the log's
    options.add_session_config_entry(SPINNING, "1" if spinning else "0")
    options.add_session_config_entry("session.inter_op.allow_spinning", "0")
    return options


SPINNING = "session.intra_op.allow_spinning"
"""onnxruntime's session option, and the model parameter by the same name that asks for it."""
LOWEST_PRIORITY = 19  # the nice value of a spinning pool's threads


def check_types(model: ModelProto) -> None:
    """Raise Unsupported for a graph input or output of a type the binding cannot carry."""
    for role, values in (("input", model.graph.input), ("output", model.graph.output)):
        for info in values:
            elem = info.type.tensor_type.elem_type if info.type.HasField("tensor_type") else 0
            if info.type.HasField("tensor_type") and elem not in CARRIED:
                name = TensorProto.DataType.Name(elem) if elem else "of no element type"
                raise Unsupported(f"graph {role} {info.name[:100]!r} is {name}, which "
                                  "onnxruntime's Python binding does not carry")  # fmt: skip


def open_session(data: bytes, threads: Threads, share: CoreShare | Granted = CORES,
                 spinning: bool = False) -> SharedSession:  # fmt: skip
    """The model's sessions for `threads` (one per distinct count), which the load probe
    opened first (probe.PROBES), each run given its count by `share`; raises Unsupported with
    onnxruntime's reason when it cannot. `spinning`: the session with every core spins, its
    pool at the lowest priority (`at_lowest_priority`), when the model has a second session
    for runs beside others, which never spins (runs together would take each other's cores):
    with one session (one core, one kernel thread) nothing spins."""
    spins = spinning and threads.alone != threads.shared and PER_THREAD_PRIORITY
    try:
        return SharedSession({count: _session(data, count, spins and count == threads.alone)
                              for count in threads.counts}, threads, share)  # fmt: skip
    except Exception as exc:  # the probe opened it: only a difference of state lands here
        raise Unsupported(reason(exc)) from None


def _session(data: bytes, threads: int, spinning: bool) -> Any:
    import onnxruntime as ort  # here, on the caller's thread: the import starts threads too

    def session(spins: bool) -> Any:
        return ort.InferenceSession(data, session_options(threads, spins),
                                    providers=["CPUExecutionProvider"])  # fmt: skip

    return at_lowest_priority(session) if spinning else session(False)


PER_THREAD_PRIORITY = sys.platform.startswith("linux")
"""Whether a thread's nice value is its own (Linux), not its whole process's: a spinning pool
needs it, and elsewhere its model's sessions open without spinning."""


def at_lowest_priority(session: Callable[[bool], Any]) -> Any:
    """`session(True)`, a spinning one, opened on a thread of its own at the lowest CPU
    priority (nice 19), and so its pool threads, which start there and keep their creator's
    nice value. A spinning pool thread holds a core for about 40 ms after each run (measured:
    onnxruntime 1.32); at nice 19 any other thread that wants that core, the event loop or
    another client's run, takes it first. Where the system refuses the thread its priority
    (a sandbox that filters setpriority), `session(False)`: a pool spins only at the lowest
    priority."""

    def open_at_lowest_priority() -> Any:
        try:
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), LOWEST_PRIORITY)
        except OSError as exc:
            log.warning("a model's pool cannot run at nice %d (%s): it does not spin",
                        LOWEST_PRIORITY, exc)  # fmt: skip
            return session(False)
        return session(True)

    # a thread of its own, ended with the executor: its nice value goes with it
    with ThreadPoolExecutor(1, thread_name_prefix="opserve-spinning-pool") as opener:
        return opener.submit(open_at_lowest_priority).result()


def reason(exc: BaseException) -> str:
    """onnxruntime's message, without its status prefix, in one bounded line."""
    text = " ".join(str(exc).split()).removeprefix("[ONNXRuntimeError] : ")
    text = text.split(" : ", 2)[-1] if text[:2].strip().isdigit() else text
    return text[:MAX_REASON] + ("..." if len(text) > MAX_REASON else "")
