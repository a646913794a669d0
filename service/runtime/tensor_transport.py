"""Arrays between the server and a fallback worker process: a large one through a shared
memory file in /dev/shm (written once by the sender, mapped by the reader), a small one
pickled with the message.

The reader unlinks a file once it has taken the array, so a file lives only while one
message is in flight; the server also unlinks, after a run, the input files a killed worker
never took. Plain files and mmap rather than multiprocessing.shared_memory: its resource
tracker would count a segment made in one process and removed in another as leaked.
"""

import contextlib
import mmap
import os
import secrets
from typing import Any

import numpy as np

SHARED_BYTES = 1024 * 1024
"""Arrays of at least this many bytes (not strings) travel through shared memory."""
SHM_DIR = "/dev/shm"
PREFIX = "opserve-"

Packed = tuple[str, Any]  # ("value", anything pickled) or ("shm", (path, dtype, shape))


def pack(array: Any, made: list[str]) -> Packed:
    """A value for a message; the paths of the files made are appended to `made`."""
    if (not isinstance(array, np.ndarray) or array.dtype.hasobject
            or array.nbytes < SHARED_BYTES or not os.path.isdir(SHM_DIR)):  # fmt: skip
        return ("value", array)
    path = os.path.join(SHM_DIR, f"{PREFIX}{os.getpid()}-{secrets.token_hex(8)}")
    fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR | os.O_CLOEXEC, 0o600)
    try:
        # the space taken now, not at the first write through the mapping: a full /dev/shm
        # (64 MiB in a container by default) would be a SIGBUS there, an error here
        os.posix_fallocate(fd, 0, array.nbytes)
    except OSError:
        os.close(fd)
        unlink(path)
        return ("value", array)  # no room: the array goes with the message
    made.append(path)
    try:
        with mmap.mmap(fd, array.nbytes) as mapped:
            target = np.ndarray(array.shape, array.dtype, buffer=mapped)
            target[...] = array
            del target
    finally:
        os.close(fd)
    return ("shm", (path, array.dtype, array.shape))


def unpack(packed: Packed) -> Any:
    """The value of a packed one, in this process's memory; its file is removed."""
    kind, value = packed
    if kind == "value":
        return value
    path, dtype, shape = value
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        size = os.fstat(fd).st_size
        out = np.empty(shape, dtype)
        if size:
            with mmap.mmap(fd, size, prot=mmap.PROT_READ) as mapped:
                source = np.ndarray(shape, dtype, buffer=mapped)
                out[...] = source
                del source
        return out
    finally:
        os.close(fd)
        unlink(path)


def unlink(path: str) -> None:
    """Remove a file if it still exists."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


def unlink_all_of(pid: int) -> None:
    """Remove the files a (killed) process made and no one took."""
    start = f"{PREFIX}{pid}-"
    try:
        names = [name for name in os.listdir(SHM_DIR) if name.startswith(start)]
    except OSError:
        return
    for name in names:
        unlink(os.path.join(SHM_DIR, name))


def packed_nbytes(packed: Packed) -> int:
    """Bytes the value takes once unpacked (what a reader claims first)."""
    kind, value = packed
    if kind == "shm":
        _path, dtype, shape = value
        return int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
    return int(value.nbytes) if isinstance(value, np.ndarray) else 0
