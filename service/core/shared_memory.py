"""Client shared memory (Triton's extension): system regions that a client registers by name,
from which the data plane reads inputs and into which it writes outputs, in the binary tensor
layout (codecs/v2_binary.py); and CUDA regions, answered as a CPU-only Triton answers them.

A key names a POSIX shared memory object and is never a path: it is exactly what shm_open
takes (an optional leading "/", then one file name in /dev/shm), and it is checked before
anything is opened. The object must be the registering client's own, since the server opens
it with its own rights and hands its bytes to whoever registered it (Triton opens any key
with shm_open; here a local user read another client's tensors from the fallback's files):

- a key that begins with the server's prefix ("opserve-") is refused, and the server keeps
  its own files (the fallback's tensors) in a private directory no key can name;
- the object is a regular file, opened without following a link;
- when the client's user is known (peer_uid.py: a client connected over TCP from this
  host's network namespace), the object must be owned by that user;
- when it is not known, the server lends none of its rights: the object may not belong to
  the server's user, and must be one every local user may read and write (what the client
  could open whoever it is).

Still trusted: the server's own user (a client of that user may register its objects, as it
could read them anyway) and root; and the owner of an object, who may change its bytes under
a request (they are copied before use) or shrink it (see below). Client shared memory
(OPSERVE_ALLOW_CLIENT_SHM) stays off by default.

Regions are read and written with pread/pwrite on a descriptor kept open, not through mmap
as Triton does. If a client shrinks its object after registering it, touching a mapping past
the new end raises SIGBUS and kills the whole server; pread only comes back short. A
descriptor stays open while its region is registered and until the last read or write that
leased it has ended. So unregistering never pulls it from under a request, and no later open
can take its number while a read still uses it.

Wiring it (a door parses, the core reads and writes on the request's kernel thread, after
claiming `ref.byte_size` from the memory budget):

    ref = tensor_region(item.name, item.parameters)    # an input's, or output_region(...)
    raw = regions.read(*ref)                           # the input's bytes, decoded as binary
    regions.write(*ref, encode_binary(array), output=name)
"""

import contextlib
import os
import stat
import threading
from collections.abc import Iterator, Mapping
from typing import Any, NamedTuple

from service.engines.workers.transport import PREFIX as SERVER_PREFIX
from service.errors import AlreadyExists, InvalidInput, NotFound, PayloadTooLarge, Unsupported

DIRECTORY = "/dev/shm"
"""Where glibc's shm_open keeps POSIX shared memory objects."""
DISABLED = (
    "Client shared memory is disabled. Start the server with OPSERVE_ALLOW_CLIENT_SHM=true "
    "to enable."
)
_NAME_MAX = 255  # bytes in a file name (Linux NAME_MAX): glibc's shm_open takes no longer key
_MAX_REGION_NAME = 255  # characters
_CHUNK = 1 << 30  # one read or write call on Linux moves at most 2 GiB - 4 KiB
_SHM_KEYS = ("shared_memory_region", "shared_memory_offset", "shared_memory_byte_size")
_NATURAL = "a non-negative integer"
_EVERYONE_RW = stat.S_IROTH | stat.S_IWOTH


class _Region:
    """One registered window: `byte_size` bytes at `offset` in the object open as `fd`."""

    __slots__ = ("byte_size", "fd", "key", "leases", "name", "offset", "registered")

    def __init__(self, name: str, key: str, offset: int, byte_size: int, fd: int) -> None:
        self.name, self.key, self.offset, self.byte_size, self.fd = (
            name, key, offset, byte_size, fd)  # fmt: skip
        self.leases = 0  # reads and writes in progress
        self.registered = True

    def status(self) -> dict[str, Any]:
        return {"name": self.name, "key": self.key, "offset": self.offset,
                "byte_size": self.byte_size}  # fmt: skip

    def close(self) -> None:
        with contextlib.suppress(OSError):  # unregistering never fails
            os.close(self.fd)
        self.fd = -1


class SharedMemoryRegions:
    """The system shared memory regions of the whole process, by name. `enabled` is
    OPSERVE_ALLOW_CLIENT_SHM: when it is off, register and unregister are refused
    (Unsupported), and status answers with no regions."""

    def __init__(self, enabled: bool, max_regions: int = 256) -> None:
        self.enabled = enabled
        self.max_regions = max_regions
        self._regions: dict[str, _Region] = {}
        self._lock = threading.Lock()

    def require_enabled(self) -> None:
        """Refuse when client shared memory is off (Triton's gate on register and unregister)."""
        if not self.enabled:
            raise Unsupported(DISABLED)

    def register(self, name: str, key: str, offset: int, byte_size: int, *,
                 client_uid: int | None) -> None:  # fmt: skip
        """Register `name` as the window [offset, offset + byte_size) of the object `key`,
        for a client whose user is `client_uid` (None: not known; see `_check_owner`)."""
        self.require_enabled()
        _check_name(name)
        _check_key(name, key)
        refused = f"failed to register shared memory region '{_shown(name)}'"
        for field, value in (("offset", offset), ("byte_size", byte_size)):
            if not _is_size(value):
                raise InvalidInput(f"{refused}: '{field}' must be a non-negative integer")
        with self._lock:
            if name in self._regions:
                raise AlreadyExists(f"shared memory region '{_shown(name)}' already in manager")
            if len(self._regions) >= self.max_regions:
                raise PayloadTooLarge(f"{refused}: the server holds {self.max_regions} regions "
                                      "already, its limit; unregister one first")  # fmt: skip
            fd, size = _open(key, client_uid)
            if byte_size == 0 or offset + byte_size > size:  # an empty window is of no use
                os.close(fd)
                raise InvalidInput(f"{refused}: invalid args")
            self._regions[name] = _Region(name, key, offset, byte_size, fd)

    def unregister(self, name: str | None = None) -> None:
        """Unregister `name`, or every region when it is None or "". An unknown name is no
        error. A request that is reading or writing the region still finishes."""
        self.require_enabled()
        self._drop(name)

    def close(self) -> None:
        """Unregister every region, whatever the gate (at shutdown)."""
        self._drop(None)

    def _drop(self, name: str | None) -> None:
        with self._lock:
            for taken in list(self._regions) if not name else [name]:
                region = self._regions.pop(taken, None)
                if region is not None:
                    region.registered = False
                    if not region.leases:
                        region.close()

    def status(self, name: str | None = None) -> list[dict[str, Any]]:
        """`{name, key, offset, byte_size}` of `name`, or of every region (by name) when it
        is None or ""."""
        with self._lock:
            if not name:
                return [self._regions[n].status() for n in sorted(self._regions)]
            region = self._regions.get(name)
        if region is None:
            raise NotFound(f"Unable to find system shared memory region: '{_shown(name)}'")
        return [region.status()]

    def read(self, name: str, offset: int, byte_size: int) -> bytes:
        """A copy of `byte_size` bytes at `offset` in the region `name` (an offset within its
        window). It is a copy because the client may change the memory while we compute."""
        with self._lease(name, offset, byte_size) as (fd, start):
            parts = []
            while byte_size:
                part = _io(os.pread, name, fd, min(byte_size, _CHUNK), start)
                if not part:
                    raise _shrunk(name)
                parts.append(part)
                byte_size -= len(part)
                start += len(part)
        return parts[0] if len(parts) == 1 else b"".join(parts)

    def write(self, name: str, offset: int, byte_size: int, data: bytes | memoryview, *,
              output: str) -> None:  # fmt: skip
        """Write `data` (the results of `output`) at `offset` in the region `name`, within the
        `byte_size` bytes that the request gave it."""
        view = memoryview(data).cast("B")
        with self._lease(name, offset, byte_size) as (fd, start):
            if view.nbytes > byte_size:
                raise InvalidInput(f"shared memory size specified with the request for output "
                                   f"'{_shown(output)}' ({byte_size} bytes) should be at least "
                                   f"{view.nbytes} bytes to hold the results")  # fmt: skip
            if _io(os.fstat, name, fd).st_size < start + view.nbytes:
                raise _shrunk(name)  # pwrite would grow it again
            while view:
                done = _io(os.pwrite, name, fd, view[:_CHUNK], start)
                view, start = view[done:], start + done

    @contextlib.contextmanager
    def _lease(self, name: str, offset: int, byte_size: int) -> Iterator[tuple[int, int]]:
        """The region's descriptor and where [offset, offset + byte_size) of its window starts
        in the object; the descriptor stays open until the block ends."""
        with self._lock:
            region = self._regions.get(name)
            if region is None:
                raise NotFound(f"Unable to find shared memory region: '{_shown(name)}'")
            if not _is_size(offset) or offset >= region.byte_size:
                raise InvalidInput(f"Invalid offset for shared memory region: '{_shown(name)}'")
            if not _is_size(byte_size) or offset + byte_size > region.byte_size:
                raise InvalidInput("Invalid offset + byte size for shared memory region: "
                                   f"'{_shown(name)}'")  # fmt: skip
            region.leases += 1
        try:
            yield region.fd, region.offset + offset
        finally:
            with self._lock:
                region.leases -= 1
                if not region.leases and not region.registered:
                    region.close()


class CudaSharedMemory:
    """CUDA shared memory, answered as a CPU-only Triton answers it: no region can be
    registered, status lists none, and unregistering succeeds (every Triton shared memory
    example unregisters first). Register and unregister share the system regions' gate."""

    def __init__(self, system: SharedMemoryRegions) -> None:
        self.system = system

    def register(self, name: str) -> None:
        """Refused: there are no GPUs."""
        self.system.require_enabled()
        raise InvalidInput(f"failed to register CUDA shared memory region: '{_shown(name)}', "
                           "GPUs not supported")  # fmt: skip

    def unregister(self, name: str | None = None) -> None:
        """Nothing to do: no region is ever registered."""
        self.system.require_enabled()

    def status(self, name: str | None = None) -> list[dict[str, Any]]:
        """No regions; a named one is not found."""
        if not name:
            return []
        try:
            self.system.status(name)
        except NotFound:
            raise NotFound(f"Unable to find cuda shared memory region: '{_shown(name)}'") from None
        raise NotFound(f"The region named '{_shown(name)}' is registered as system shared "
                       "memory, not CUDA shared memory")  # fmt: skip


class SharedMemoryRef(NamedTuple):
    """Where a tensor's bytes are: `byte_size` bytes at `offset` in the region `region`."""

    region: str
    offset: int
    byte_size: int


def tensor_region(tensor: str, parameters: Mapping[str, Any]) -> SharedMemoryRef | None:
    """The region that an input's or an output's parameters name, or None. An offset or a
    byte size without a region, or a region without a byte size, is refused (gRPC's rules,
    which Triton's documentation gives for HTTP too)."""
    if not parameters:  # most tensors: no scan of the keys
        return None
    given = [key for key in _SHM_KEYS if key in parameters]
    if not given:
        return None
    if "shared_memory_region" not in parameters:
        raise InvalidInput(f"'{given[0]}' can not be specified without 'shared_memory_region' "
                           f"parameter for tensor '{_shown(tensor)}'")  # fmt: skip
    if "shared_memory_byte_size" not in parameters:
        raise InvalidInput("'shared_memory_byte_size' must be specified along with "
                           "'shared_memory_region' parameter for tensor "
                           f"'{_shown(tensor)}'")  # fmt: skip
    region = parameters["shared_memory_region"]
    offset = parameters.get("shared_memory_offset", 0)
    byte_size = parameters["shared_memory_byte_size"]
    checks = (("shared_memory_region", isinstance(region, str), "a string"),
              ("shared_memory_offset", _is_size(offset), _NATURAL),
              ("shared_memory_byte_size", _is_size(byte_size), _NATURAL))  # fmt: skip
    for key, fits, expected in checks:
        if not fits:
            raise InvalidInput(f"invalid value type for '{key}' parameter for tensor "
                               f"'{_shown(tensor)}', expected {expected}")  # fmt: skip
    return SharedMemoryRef(region, offset, byte_size)


def output_region(output: str, parameters: Mapping[str, Any]) -> SharedMemoryRef | None:
    """`tensor_region` of a requested output, whose parameters (as sent) may not also ask for
    classification or binary data (tritonclient sends `binary_data: false`)."""
    if "shared_memory_region" in parameters:
        for other in ("classification", "binary_data"):
            if parameters.get(other, False) is not False:
                raise InvalidInput(f"Output can't set both 'shared_memory_region' and '{other}'")
    return tensor_region(output, parameters)


def check_input_source(has_data: bool, parameters: Mapping[str, Any]) -> None:
    """Over HTTP an input sets exactly one of `data`, `binary_data_size` and
    `shared_memory_region` (the last two in its parameters)."""
    given = {"data": has_data, "binary_data_size": "binary_data_size" in parameters,
             "shared_memory_region": "shared_memory_region" in parameters}  # fmt: skip
    found = [f"'{field}'" for field, present in given.items() if present]
    if len(found) != 1:
        but = f"set {' '.join(found)}" if found else "no field is set"
        raise InvalidInput("Input must set only one of the following fields: 'data', "
                           "'binary_data_size' in 'parameters', 'shared_memory_region' in "
                           f"'parameters'. But {but}")  # fmt: skip


def _open(key: str, client_uid: int | None) -> tuple[int, int]:
    """A read-write descriptor of the object `key` (a checked key) and the object's size.

    It is first opened as a bare reference (O_PATH) and reopened for reading and writing only
    once it is known to be a regular file that the client may have (`_check_owner`): a FIFO,
    a device or another user's object is never really opened."""
    path = os.path.join(DIRECTORY, key.removeprefix("/"))
    try:
        ref = os.open(path, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        raise _unable_to_open(key, exc) from None
    try:
        info = os.fstat(ref)
        if not stat.S_ISREG(info.st_mode):
            raise InvalidInput(f"Unable to open shared memory region: '{_shown(key)}': it is "
                               "not a regular file")  # fmt: skip
        _check_owner(key, info, client_uid)
        fd = os.open(f"/proc/self/fd/{ref}", os.O_RDWR | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise _unable_to_open(key, exc) from None
    finally:
        os.close(ref)
    return fd, os.fstat(fd).st_size  # a regular file's fstat fails only on a bad descriptor


def _check_owner(key: str, info: os.stat_result, client_uid: int | None) -> None:
    """Refuse an object the client may not have. When its user is known, the object must be
    owned by it. When not, the server lends none of its rights: the object may not be the
    server's user's, and must be one every local user may read and write."""
    refused = f"Unable to open shared memory region: '{_shown(key)}': "
    if client_uid is not None:
        if info.st_uid != client_uid:
            raise InvalidInput(f"{refused}it is owned by uid {info.st_uid}, not by the "
                               f"registering client's user (uid {client_uid})")  # fmt: skip
        return
    unknown = (
        "the registering client's user could not be told (it is told for a client "
        "connected over TCP from this host's network namespace, not through a proxy)"
    )
    if info.st_uid == os.geteuid():
        raise InvalidInput(f"{refused}it is owned by the server's user and {unknown}")
    if info.st_mode & _EVERYONE_RW != _EVERYONE_RW:
        raise InvalidInput(f"{refused}{unknown}, so only an object that every local user may "
                           "read and write is opened")  # fmt: skip


def _unable_to_open(key: str, exc: OSError) -> InvalidInput:
    # our contract: a missing key is the client's error (Triton answers 500)
    reason = "" if isinstance(exc, FileNotFoundError) else f": {exc.strerror}"
    return InvalidInput(f"Unable to open shared memory region: '{_shown(key)}'{reason}")


def _io(call: Any, name: str, *args: Any) -> Any:
    """`call(*args)` on a region's descriptor; an OSError is refused as the client's."""
    try:
        return call(*args)
    except OSError as exc:
        raise InvalidInput(f"shared memory region '{_shown(name)}': {exc.strerror}") from None


def _shrunk(name: str) -> InvalidInput:
    return InvalidInput(f"shared memory region '{_shown(name)}' is smaller than when it was "
                        "registered: its client truncated it")  # fmt: skip


def _check_name(name: str) -> None:
    if not name:
        raise InvalidInput("'region name' is necessary to register system shared memory region")
    if len(name) > _MAX_REGION_NAME or not name.isprintable():
        raise InvalidInput(f"cannot register shared memory region {_shown(name)!r}: a region "
                           f"name is 1 to {_MAX_REGION_NAME} printable characters")  # fmt: skip


def _check_key(name: str, key: str) -> None:
    """What shm_open takes as a portable name: one leading "/" at most, then one file name
    of 1 to 255 bytes (no "/", no NUL, not "." or "..")."""
    base = key.removeprefix("/")
    try:
        size = len(base.encode())
    except UnicodeEncodeError:  # a lone surrogate is no file name
        size = 0
    if not 0 < size <= _NAME_MAX or "/" in base or "\0" in base or base in (".", ".."):
        raise InvalidInput(f"cannot register shared memory region '{_shown(name)}' - invalid "
                           f"shm key '{_shown(key)}'")  # fmt: skip
    if base.startswith(SERVER_PREFIX):
        raise InvalidInput(f"cannot register shared memory region '{_shown(name)}' - shm key "
                           f"'{_shown(key)}' names the server's own files (its names begin "
                           f"with '{SERVER_PREFIX}')")  # fmt: skip


def _is_size(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _shown(text: str) -> str:
    """A client's name or key for a message: a long one is cut."""
    return text if len(text) <= 100 else text[:100] + "..."
