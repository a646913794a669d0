"""Arrays between the server and a fallback worker process: a large one through a shared
memory file (written once by the sender, mapped by the reader), a small one pickled with the
message.

The files live in a private directory in /dev/shm, made per server (FallbackPool) with mode
0700 and removed at its shutdown: no other user can open, list or link them, and no client
shared memory key can name them, since a key is one name directly in /dev/shm (core/
shared_memory.py). Files right in /dev/shm, even 0600 ones, were registered by a client as
shared memory regions and read back with the server's rights, another client's tensors in
them. The reader unlinks a file once it has taken the array, so a file lives only while one
message is in flight; the server also unlinks, after a run, the input files a killed worker
never took. Plain files and mmap rather than multiprocessing.shared_memory: its resource
tracker would count a segment made in one process and removed in another as leaked.
"""

import contextlib
import mmap
import os
import secrets
import shutil
import tempfile
from typing import Any

import numpy as np

SHARED_BYTES = 1024 * 1024
"""Arrays of at least this many bytes (not strings) travel through shared memory."""
SHM_DIR = "/dev/shm"
PREFIX = "opserve-"
"""How the names this server gives in /dev/shm begin (no client key may begin so)."""

Packed = tuple[str, Any]  # ("value", anything pickled) or ("shm", (path, dtype, shape))


def make_directory() -> str | None:
    """A new private directory (0700) in /dev/shm for a server's files; None when there is no
    /dev/shm to make it in (arrays are then pickled)."""
    try:
        return tempfile.mkdtemp(prefix=f"{PREFIX}transport-", dir=SHM_DIR)
    except OSError:
        return None


def remove_directory(directory: str | None) -> None:
    """Remove a directory of `make_directory` and whatever is left in it."""
    if directory is not None:
        shutil.rmtree(directory, ignore_errors=True)


def pack(array: Any, made: list[str], directory: str | None) -> Packed:
    """A value for a message, a large array written to a file in `directory` (None: pickled);
    the paths of the files made are appended to `made`."""
    if (directory is None or not isinstance(array, np.ndarray) or array.dtype.hasobject
            or array.nbytes < SHARED_BYTES):  # fmt: skip
        return ("value", array)
    path = os.path.join(directory, f"{os.getpid()}-{secrets.token_hex(8)}")
    try:
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR | os.O_CLOEXEC, 0o600)
    except OSError:  # the directory removed at shutdown, out of descriptors
        return ("value", array)
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


def unlink_all_of(pid: int, directory: str | None) -> None:
    """Remove the files a (killed) process made in `directory` and no one took."""
    if directory is None:
        return
    start = f"{pid}-"
    try:
        names = [name for name in os.listdir(directory) if name.startswith(start)]
    except OSError:  # removed at shutdown
        return
    for name in names:
        unlink(os.path.join(directory, name))


def packed_nbytes(packed: Packed) -> int:
    """Bytes the value takes once unpacked (what a reader claims first)."""
    kind, value = packed
    if kind == "shm":
        _path, dtype, shape = value
        return int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
    return int(value.nbytes) if isinstance(value, np.ndarray) else 0
