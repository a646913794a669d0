"""The address-space limit of a process that runs what the server must not (an isolated
worker, the load probe): RLIMIT_AS set to what the process holds once started plus its room,
so an allocation past it fails there (MemoryError, onnxruntime's bad_alloc) instead of taking
the host's memory."""

import resource
import sys
from collections.abc import Iterable

MiB = 1024 * 1024
MALLOC_ARENAS = "2"
"""MALLOC_ARENA_MAX of the worker and probe processes: each thread's malloc arena reserves
64 MiB of the address space the limit counts; two keep onnxruntime's threads from spending
the room on them."""
UNLIMITED_STACK_BYTES = 32 * MiB  # a thread's stack when RLIMIT_STACK is unlimited (at most)


def vm_size() -> int | None:
    """The process's address space now (VmSize), in bytes; None where /proc has none."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmSize:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def limit_address_space(room: int) -> None:
    """Limit the address space to what the process holds now plus `room` bytes."""
    size = vm_size()
    if size is None:
        return
    _soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    wanted = size + room
    if hard != resource.RLIM_INFINITY:
        wanted = min(wanted, hard)
    resource.setrlimit(resource.RLIMIT_AS, (wanted, hard))


def thread_stack_bytes() -> int:
    """The address space a new thread's stack reserves: glibc's default stack is the soft
    RLIMIT_STACK (8 MiB on most systems), or the architecture's own when it is unlimited
    (taken at its largest)."""
    soft, _hard = resource.getrlimit(resource.RLIMIT_STACK)
    return UNLIMITED_STACK_BYTES if soft == resource.RLIM_INFINITY else soft


def pool_threads_bytes(counts: Iterable[int]) -> int:
    """The address space the intra-op pool threads of sessions of `counts` threads reserve
    for their stacks (a session of n threads starts n - 1; its caller is the n-th). It is not
    a run's room: on 32 cores a model's two sessions start 46 threads, 368 MiB of stacks,
    where the load probe had about 512 MiB of room in all, and every model on 16 cores or more
    failed its probe (pthread_create refused) or hung in it."""
    return sum(max(0, count - 1) for count in counts) * thread_stack_bytes()


def widen_address_space(nbytes: int) -> int:
    """Move the soft address-space limit by `nbytes` (negative: narrow it), within the hard
    limit; nothing when there is none. Returns how far it moved: what to take back later (a
    widening the hard limit capped must not be taken back whole)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    if soft == resource.RLIM_INFINITY or not nbytes:
        return 0
    limit = max(0, soft + nbytes)
    if hard != resource.RLIM_INFINITY:
        limit = min(limit, hard)
    resource.setrlimit(resource.RLIMIT_AS, (limit, hard))
    return limit - soft


def import_onnxruntime() -> None:
    """Import onnxruntime (in a worker, on its first client's model: a worker that only runs
    the exact engine never pays for it), with its mapping added to the limit: its libraries
    are not the run's room. The soft limit is lifted while it loads, then set again above what
    the import took."""
    if "onnxruntime" in sys.modules:
        return
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    before = vm_size()
    resource.setrlimit(resource.RLIMIT_AS, (hard, hard))
    try:
        import onnxruntime  # noqa: F401
    finally:
        after = vm_size()
        grown = after - before if after is not None and before is not None else 0
        if soft != resource.RLIM_INFINITY:
            limit = soft + max(grown, 0)
            if hard != resource.RLIM_INFINITY:
                limit = min(limit, hard)
            resource.setrlimit(resource.RLIMIT_AS, (limit, hard))
