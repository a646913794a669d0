"""Let glibc keep freed output-sized blocks, so the next large output reuses warm pages.

A fresh 64 MiB output costs ~16k page faults: by default glibc serves blocks over 128 KiB-32 MiB
with mmap and unmaps them on free, so every large output starts on new, unmapped memory, and
first-touch faults take more time than the copy itself (bench/bench_kernels.py measures it;
onnxruntime avoids the same cost with its own arena). Raising the mmap and trim thresholds keeps
the freed blocks in the heap. The price is resident memory: up to `max_bytes` of freed memory
stays with the process after a large request.
"""

import ctypes
import ctypes.util
import platform

# mallopt parameters from glibc's <malloc.h>
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
_M_ARENA_MAX = -8


def configure_allocator(max_bytes: int) -> bool:
    """Serve blocks up to `max_bytes` from the heap and keep that much freed memory; True if
    applied (glibc only: elsewhere a no-op that returns False)."""
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return False
    try:
        mallopt = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").mallopt
    except (OSError, AttributeError):
        return False
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
