"""Let glibc keep freed output-sized blocks, so the next large output reuses warm pages, and
give the freed memory back to the system once the process is quiet.

A fresh 64 MiB output costs ~16k page faults: by default glibc serves blocks over 128 KiB-32 MiB
with mmap and unmaps them on free, so every large output starts on new, unmapped memory, and
first-touch faults take more time than the copy itself (bench/bench_kernels.py measures it;
onnxruntime avoids the same cost with its own arena). Raising the mmap and trim thresholds keeps
the freed blocks in the heap. The price is resident memory: up to `max_bytes` of freed memory
stays with the process after a large request, and more where a block still in use sits above
freed ones (glibc returns only the top of the heap on free): a burst of eight 32 MiB answers
left 287 MB resident for
over 25 s in CI. `trim_heap` (malloc_trim) returns every freed page, wherever it is;
core/heap_trim.py calls it once the memory budget has been idle for a moment.
"""

import ctypes
import ctypes.util
import platform
from functools import cache

# mallopt parameters from glibc's <malloc.h>
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
_M_ARENA_MAX = -8


@cache
def _libc() -> ctypes.CDLL | None:
    """glibc, or None off it (found once: libc_ver() reads the interpreter's file)."""
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return None
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:
        return None


def configure_allocator(max_bytes: int) -> bool:
    """Serve blocks up to `max_bytes` from the heap and keep that much freed memory; True if
    applied (glibc only: elsewhere a no-op that returns False)."""
    libc = _libc()
    if libc is None:
        return False
    mallopt = libc.mallopt
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    limit = min(max_bytes, 2**31 - 1)  # mallopt takes a C int
    # Kernels run on worker threads too, and a thread's arena cannot hold a block over 64 MiB
    # (glibc's HEAP_MAX_SIZE): one arena, the main heap, lets every thread reuse large blocks.
    # Python holds the GIL around most allocations, so one arena adds little contention.
    return all(
        mallopt(param, value) == 1
        for param, value in (
            (_M_MMAP_THRESHOLD, limit),
            (_M_TRIM_THRESHOLD, limit),
            (_M_ARENA_MAX, 1),
        )
    )


def trim_heap() -> bool:
    """Give every freed page of the heap back to the system (glibc's malloc_trim, which also
    releases holes below blocks still in use); True if glibc did release memory. It holds the
    heap's lock while it works (~20 ms for 256 MiB of freed pages): call it when idle. The call
    releases the GIL (ctypes)."""
    libc = _libc()
    return libc is not None and libc.malloc_trim(0) == 1
