"""The address-space limit of a process that runs what the server must not (an isolated
worker, the load probe): RLIMIT_AS set to what the process holds once started plus its room,
so an allocation past it fails there (MemoryError, onnxruntime's bad_alloc) instead of taking
the host's memory."""

import resource
import sys


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
