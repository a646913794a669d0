"""The client shared memory registry, driven with real POSIX shared memory made the way a client
makes it (tritonclient.utils.shared_memory): registering, status, unregistering, keys that are
names and never paths, windows at and past their edges, and regions unregistered or shrunk
under a request in progress."""

import contextlib
import itertools
import os
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.utils.shared_memory as client_shm
from tritonclient.utils import serialize_byte_tensor

from service.codecs.limits import Limits
from service.codecs.v2_binary import decode_binary, encode_binary
from service.codecs.v2_types import from_datatype
from service.core.shared_memory import DISABLED, CudaSharedMemory, SharedMemoryRegions
from service.errors import (
    AlreadyExists,
    InvalidInput,
    NotFound,
    PayloadTooLarge,
    ServiceError,
    Unsupported,
)

PREFIX = f"opserve_test_{os.getpid()}_"  # test runs in other worktrees share /dev/shm
OWN = os.geteuid()  # the registering client's user: this process's, as the objects'
_count = itertools.count()
MakeObject = Callable[..., tuple[str, Any]]


def pattern(size: int) -> bytes:
    return (np.arange(size) % 251).astype(np.uint8).tobytes()


def contents(handle: Any, size: int, offset: int = 0) -> bytes:
    return client_shm.get_contents_as_numpy(handle, np.uint8, [size], offset=offset).tobytes()


def path_of(key: str) -> str:
    return f"/dev/shm/{key.removeprefix('/')}"


def _descriptors_on(key: str) -> int:
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):  # closed since the listing
            count += os.readlink(f"/proc/self/fd/{fd}") == path_of(key)
    return count


_CLIENTS: dict[str, int] = {}  # by key: the descriptors the client's own handle holds


def descriptors_on(key: str) -> int:
    """How many descriptors the registry holds open on the object `key`."""
    return _descriptors_on(key) - _CLIENTS[key]


def refused(kind: type[ServiceError], call: Callable[..., Any], *args: Any, **kw: Any) -> str:
    with pytest.raises(kind) as caught:
        call(*args, **kw)
    return caught.value.detail


@pytest.fixture
def make_object() -> Iterator[MakeObject]:
    """Makes shared memory objects as a client does, filled with `pattern`; destroys them."""
    handles: list[Any] = []

    def make(byte_size: int, key: str | None = None) -> tuple[str, Any]:
        key = key or f"/{PREFIX}{next(_count)}"
        handle = client_shm.create_shared_memory_region(key, key, byte_size, create_only=True)
        handles.append(handle)
        _CLIENTS[key] = _descriptors_on(key)
        client_shm.set_shared_memory_region(handle, [np.frombuffer(pattern(byte_size), np.uint8)])
        return key, handle

    yield make
    for handle in handles:
        client_shm.destroy_shared_memory_region(handle)


@pytest.fixture
def regions() -> Iterator[SharedMemoryRegions]:
    made = SharedMemoryRegions(enabled=True)
    yield made
    made.close()


def test_register_status_and_unregister_by_name(regions: SharedMemoryRegions,
                                                make_object: MakeObject) -> None:  # fmt: skip
    key_b, _ = make_object(128)
    key_a, _ = make_object(64)
    regions.register("output_data", key_b, 64, 64, client_uid=OWN)
    regions.register("input_data", key_a, 0, 64, client_uid=OWN)
    listed = regions.status()
    assert listed == [  # by name, as Triton's std::map
        {"name": "input_data", "key": key_a, "offset": 0, "byte_size": 64},
        {"name": "output_data", "key": key_b, "offset": 64, "byte_size": 64},
    ]
    assert regions.status("") == listed
    assert regions.status("output_data") == [listed[1]]
    assert descriptors_on(key_a) == 1
    regions.unregister("input_data")
    assert [r["name"] for r in regions.status()] == ["output_data"]
    assert descriptors_on(key_a) == 0
    regions.unregister("input_data")  # unknown now: no error, as Triton answers 200
    assert refused(NotFound, regions.status, "input_data") == (
        "Unable to find system shared memory region: 'input_data'"
    )


@pytest.mark.parametrize("everything", [None, ""])
def test_unregister_all(regions: SharedMemoryRegions, make_object: MakeObject,
                        everything: str | None) -> None:  # fmt: skip
    keys = [make_object(16)[0] for _ in range(3)]
    for n, key in enumerate(keys):
        regions.register(f"r{n}", key, 0, 16, client_uid=OWN)
    regions.unregister(everything)
    assert regions.status() == []
    assert all(descriptors_on(key) == 0 for key in keys)
    regions.unregister()  # nothing left: still no error


def test_when_disabled_only_status_answers(make_object: MakeObject) -> None:
    off = SharedMemoryRegions(enabled=False)
    key, _ = make_object(16)
    assert DISABLED == (
        "Client shared memory is disabled. Start the server with "
        "OPSERVE_ALLOW_CLIENT_SHM=true to enable."
    )
    assert refused(Unsupported, off.register, "r", key, 0, 16, client_uid=OWN) == DISABLED
    assert refused(Unsupported, off.unregister, "r") == DISABLED
    assert refused(Unsupported, off.unregister) == DISABLED
    assert off.status() == []
    assert "Unable to find system" in refused(NotFound, off.status, "r")
    assert "Unable to find shared memory region" in refused(NotFound, off.read, "r", 0, 1)
    cuda = CudaSharedMemory(off)
    assert refused(Unsupported, cuda.register, "r") == DISABLED
    assert refused(Unsupported, cuda.unregister) == DISABLED
    assert cuda.status() == []


# ---- keys are names of shared memory objects, never paths ----------------------------------

BAD_KEYS = ["", "/", "//", "//x", ".", "..", "/.", "/..", "a/b", "/a/b", "/../etc/passwd",
            "/../../tmp/x", "/a\0b", "\0", "/" + "a" * 256, "a" * 256, "/" + "é" * 128,
            "/\ud800"]  # fmt: skip


@pytest.mark.parametrize("key", BAD_KEYS)
def test_invalid_keys_are_refused_before_anything_is_opened(
    regions: SharedMemoryRegions, key: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    opened: list[Any] = []
    monkeypatch.setattr(os, "open", lambda *args, **kw: opened.append(args))
    detail = refused(InvalidInput, regions.register, "r", key, 0, 1, client_uid=OWN)
    shown = key if len(key) <= 100 else key[:100] + "..."  # a long one is cut
    assert detail == f"cannot register shared memory region 'r' - invalid shm key '{shown}'"
    assert opened == []
    assert regions.status() == []


FULL = {"ascii": "k" * (255 - len(PREFIX)),  # keys of 255 bytes, the most a name holds
        "utf-8": "k" * (255 - len(PREFIX) - 128) + "é" * 64}  # fmt: skip


@pytest.mark.parametrize("tail", ["plain", "with spaces and ~!@#$%^&*()", "é", *FULL])
@pytest.mark.parametrize("slash", ["/", ""])
def test_valid_keys_register(regions: SharedMemoryRegions, tail: str, slash: str) -> None:
    base = PREFIX + FULL.get(tail, tail)
    assert len(base.encode()) == 255 if tail in FULL else len(base.encode()) < 255
    # made here rather than by tritonclient: its resource tracker only takes ASCII names
    fd = os.open(path_of(base), os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.write(fd, pattern(32))
        regions.register("r", slash + base, 0, 32, client_uid=OWN)
        assert regions.status("r")[0]["key"] == slash + base
        assert regions.read("r", 0, 32) == pattern(32)
    finally:
        os.close(fd)
        os.unlink(path_of(base))


def test_a_missing_object_is_the_clients_error(regions: SharedMemoryRegions) -> None:
    key = f"/{PREFIX}never_made"
    detail = refused(InvalidInput, regions.register, "r", key, 0, 1, client_uid=OWN)
    assert detail == f"Unable to open shared memory region: '{key}'"


def test_a_symlink_in_dev_shm_is_not_followed(regions: SharedMemoryRegions,
                                              tmp_path: Path) -> None:  # fmt: skip
    target = tmp_path / "secret"
    target.write_bytes(b"x" * 64)
    link = f"{PREFIX}link"
    os.symlink(target, path_of(link))
    try:
        detail = refused(InvalidInput, regions.register, "r", link, 0, 64, client_uid=OWN)
    finally:
        os.unlink(path_of(link))
    assert detail.startswith(f"Unable to open shared memory region: '{link}': ")
    assert regions.status() == []


def _register_in_thread(regions: SharedMemoryRegions, key: str) -> str:
    """The refusal of registering `key`, which must come at once (never blocking)."""
    answer: list[str] = []
    worker = threading.Thread(target=lambda: answer.append(
        refused(InvalidInput, regions.register, "r", key, 0, 1, client_uid=OWN)))  # fmt: skip
    worker.start()
    worker.join(timeout=10)
    assert not worker.is_alive(), f"registering {key!r} blocked"
    return answer[0]


def test_a_fifo_or_a_directory_in_dev_shm_is_refused_without_blocking(
    regions: SharedMemoryRegions,
) -> None:
    fifo, folder = f"{PREFIX}fifo", f"{PREFIX}dir"
    os.mkfifo(path_of(fifo))
    os.mkdir(path_of(folder))
    try:
        assert _register_in_thread(regions, "/" + fifo) == (
            f"Unable to open shared memory region: '/{fifo}': it is not a regular file"
        )
        assert _register_in_thread(regions, folder) == (
            f"Unable to open shared memory region: '{folder}': it is not a regular file"
        )
    finally:
        os.unlink(path_of(fifo))
        os.rmdir(path_of(folder))
    assert regions.status() == []


# ---- an object is the registering client's own ----------------------------------------------

NOBODY = 65534


@pytest.mark.parametrize("key", ["opserve-1234-00ff", "/opserve-1234-00ff.node",
                                 "opserve-transport-x1y2", "/opserve-"])  # fmt: skip
def test_keys_with_the_servers_prefix_are_refused_before_anything_is_opened(
    regions: SharedMemoryRegions, key: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    opened: list[Any] = []
    monkeypatch.setattr(os, "open", lambda *args, **kw: opened.append(args))
    detail = refused(InvalidInput, regions.register, "r", key, 0, 1, client_uid=OWN)
    assert detail == (f"cannot register shared memory region 'r' - shm key '{key}' names the "
                      "server's own files (its names begin with 'opserve-')")  # fmt: skip
    assert opened == []


@pytest.fixture
def owned_object() -> Iterator[Callable[[int, int], str]]:
    """Makes a 64-byte object in /dev/shm owned by `uid` with `mode`; removes them."""
    made: list[str] = []

    def make(uid: int, mode: int) -> str:
        key = f"{PREFIX}owned{next(_count)}"
        fd = os.open(path_of(key), os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        made.append(key)
        os.write(fd, pattern(64))
        os.fchown(fd, uid, -1)
        os.fchmod(fd, mode)
        os.close(fd)
        return key

    yield make
    for key in made:
        os.unlink(path_of(key))


@pytest.mark.skipif(OWN != 0, reason="makes objects of another user")
def test_a_known_client_registers_only_its_own_objects(
    regions: SharedMemoryRegions, owned_object: Callable[[int, int], str]
) -> None:
    theirs = owned_object(NOBODY, 0o666)  # even open to everyone: not this client's
    detail = refused(InvalidInput, regions.register, "r", theirs, 0, 64, client_uid=OWN)
    assert detail == (f"Unable to open shared memory region: '{theirs}': it is owned by uid "
                      f"{NOBODY}, not by the registering client's user (uid {OWN})")  # fmt: skip
    mine = owned_object(OWN, 0o600)
    assert "owned by uid 0, not" in refused(InvalidInput, regions.register, "r", mine, 0, 64,
                                            client_uid=NOBODY)  # fmt: skip
    assert regions.status() == []
    regions.register("r", theirs, 0, 64, client_uid=NOBODY)  # its owner's
    regions.register("s", mine, 0, 64, client_uid=OWN)
    assert regions.read("r", 0, 64) == regions.read("s", 0, 64) == pattern(64)


@pytest.mark.skipif(OWN != 0, reason="makes objects of another user")
@pytest.mark.parametrize(("uid", "mode", "why"), [
    (OWN, 0o600, "it is owned by the server's user and the registering client's user could "
                 "not be told"),
    (OWN, 0o666, "it is owned by the server's user"),
    (NOBODY, 0o600, "so only an object that every local user may read and write is opened"),
    (NOBODY, 0o664, "so only an object that every local user may read and write is opened"),
    (NOBODY, 0o606, None),
    (NOBODY, 0o666, None),
])  # fmt: skip
def test_an_unknown_client_gets_none_of_the_servers_rights(
    regions: SharedMemoryRegions, owned_object: Callable[[int, int], str], uid: int, mode: int,
    why: str | None,
) -> None:  # fmt: skip
    key = owned_object(uid, mode)
    if why is None:  # what any local user could open itself
        regions.register("r", key, 0, 64, client_uid=None)
        assert regions.read("r", 0, 64) == pattern(64)
        return
    detail = refused(InvalidInput, regions.register, "r", key, 0, 64, client_uid=None)
    assert detail.startswith(f"Unable to open shared memory region: '{key}': ") and why in detail
    assert regions.status() == []


# ---- names, numbers, limits -----------------------------------------------------------------


@pytest.mark.parametrize(("name", "expected"), [
    ("", "'region name' is necessary to register system shared memory region"),
    ("x" * 256, "cannot register shared memory region 'xxxxx"),
    ("a\nb", "cannot register shared memory region 'a\\nb': a region name is 1 to 255 "
             "printable characters"),
])  # fmt: skip
def test_region_names(regions: SharedMemoryRegions, make_object: MakeObject, name: str,
                      expected: str) -> None:  # fmt: skip
    key, _ = make_object(16)
    assert refused(InvalidInput, regions.register, name, key, 0, 16, client_uid=OWN).startswith(
        expected
    )
    regions.register("any printable text: é ✓ / ?", key, 0, 16, client_uid=OWN)
    regions.register("x" * 255, key, 0, 16, client_uid=OWN)


@pytest.mark.parametrize(("offset", "byte_size", "fits"), [
    (0, 100, True), (1, 99, True), (99, 1, True), (4096, 0, False), (0, 101, False),
    (1, 100, False), (100, 1, False), (50, 51, False), (0, 0, False), (10**30, 1, False),
])  # fmt: skip
def test_register_windows_at_and_past_the_end(regions: SharedMemoryRegions,
                                              make_object: MakeObject, offset: int,
                                              byte_size: int, fits: bool) -> None:  # fmt: skip
    key, _ = make_object(100)  # not a whole page: the object's own size counts
    if fits:
        regions.register("r", key, offset, byte_size, client_uid=OWN)
        assert regions.read("r", 0, byte_size) == pattern(100)[offset : offset + byte_size]
    else:
        detail = refused(
            InvalidInput, regions.register, "r", key, offset, byte_size, client_uid=OWN
        )
        assert detail == "failed to register shared memory region 'r': invalid args"
        assert descriptors_on(key) == 0


@pytest.mark.parametrize(("offset", "byte_size", "field"), [
    (-1, 1, "offset"), (0, -1, "byte_size"), (True, 1, "offset"), (0, 1.0, "byte_size"),
    ("0", 1, "offset"),
])  # fmt: skip
def test_register_numbers(regions: SharedMemoryRegions, make_object: MakeObject, offset: Any,
                          byte_size: Any, field: str) -> None:  # fmt: skip
    key, _ = make_object(16)
    assert refused(InvalidInput, regions.register, "r", key, offset, byte_size, client_uid=OWN) == (
        f"failed to register shared memory region 'r': '{field}' must be a non-negative integer"
    )


def test_a_name_is_registered_once(regions: SharedMemoryRegions,
                                   make_object: MakeObject) -> None:  # fmt: skip
    key, _ = make_object(16)
    regions.register("r", key, 0, 16, client_uid=OWN)
    assert refused(AlreadyExists, regions.register, "r", key, 0, 8, client_uid=OWN) == (
        "shared memory region 'r' already in manager"
    )
    assert descriptors_on(key) == 1
    regions.unregister("r")
    regions.register("r", key, 0, 8, client_uid=OWN)
    assert regions.status("r")[0]["byte_size"] == 8


def test_max_regions(make_object: MakeObject) -> None:
    regions = SharedMemoryRegions(enabled=True, max_regions=2)
    key, _ = make_object(16)
    try:
        regions.register("a", key, 0, 16, client_uid=OWN)
        regions.register("b", key, 0, 16, client_uid=OWN)
        detail = refused(PayloadTooLarge, regions.register, "c", key, 0, 16, client_uid=OWN)
        assert detail == ("failed to register shared memory region 'c': the server holds 2 "
                          "regions already, its limit; unregister one first")  # fmt: skip
        assert descriptors_on(key) == 2
        regions.unregister("a")
        regions.register("c", key, 0, 16, client_uid=OWN)
    finally:
        regions.close()
    assert descriptors_on(key) == 0


# ---- reading and writing --------------------------------------------------------------------

WINDOW = (10, 50)  # the registered window: 50 bytes from byte 10 of a 64-byte object
EDGES = [
    (0, 50, None), (49, 1, None), (0, 0, None), (20, 30, None),
    (50, 0, "Invalid offset for shared memory region: 'r'"),
    (50, 1, "Invalid offset for shared memory region: 'r'"),
    (-1, 1, "Invalid offset for shared memory region: 'r'"),
    (True, 1, "Invalid offset for shared memory region: 'r'"),
    (10**30, 1, "Invalid offset for shared memory region: 'r'"),
    (0, 51, "Invalid offset + byte size for shared memory region: 'r'"),
    (49, 2, "Invalid offset + byte size for shared memory region: 'r'"),
    (1, 50, "Invalid offset + byte size for shared memory region: 'r'"),
    (0, -1, "Invalid offset + byte size for shared memory region: 'r'"),
    (0, 10**30, "Invalid offset + byte size for shared memory region: 'r'"),
]  # fmt: skip


@pytest.mark.parametrize(("offset", "byte_size", "error"), EDGES)
def test_read_at_and_past_the_edges(regions: SharedMemoryRegions, make_object: MakeObject,
                                    offset: int, byte_size: int, error: str | None) -> None:  # fmt: skip
    key, _ = make_object(64)
    regions.register("r", key, *WINDOW, client_uid=OWN)
    if error is None:
        start = WINDOW[0] + offset
        assert regions.read("r", offset, byte_size) == pattern(64)[start : start + byte_size]
    else:
        assert refused(InvalidInput, regions.read, "r", offset, byte_size) == error


@pytest.mark.parametrize(("offset", "byte_size", "error"), EDGES)
def test_write_at_and_past_the_edges(regions: SharedMemoryRegions, make_object: MakeObject,
                                     offset: int, byte_size: int, error: str | None) -> None:  # fmt: skip
    key, handle = make_object(64)
    regions.register("r", key, *WINDOW, client_uid=OWN)
    data = b"\xff" * byte_size if error is None else b"\xff"
    if error is None:
        regions.write("r", offset, byte_size, data, output="OUT")
        start = WINDOW[0] + offset
        expected = pattern(64)[:start] + data + pattern(64)[start + byte_size :]
        assert contents(handle, 64) == expected
    else:
        assert refused(InvalidInput, regions.write, "r", offset, byte_size, data,
                       output="OUT") == error  # fmt: skip
        assert contents(handle, 64) == pattern(64)


def test_unknown_region_for_read_and_write(regions: SharedMemoryRegions) -> None:
    expected = "Unable to find shared memory region: 'nope'"
    assert refused(NotFound, regions.read, "nope", 0, 1) == expected
    assert refused(NotFound, regions.write, "nope", 0, 1, b"x", output="OUT") == expected


def test_results_longer_than_the_byte_size_given(regions: SharedMemoryRegions,
                                                 make_object: MakeObject) -> None:  # fmt: skip
    key, handle = make_object(64)
    regions.register("r", key, 0, 64, client_uid=OWN)
    detail = refused(InvalidInput, regions.write, "r", 0, 16, b"x" * 17, output="OUTPUT0")
    assert detail == ("shared memory size specified with the request for output 'OUTPUT0' "
                      "(16 bytes) should be at least 17 bytes to hold the results")  # fmt: skip
    regions.write("r", 0, 16, memoryview(b"y" * 8), output="OUTPUT0")  # shorter is fine
    assert contents(handle, 17) == b"y" * 8 + pattern(17)[8:]


def test_windows_that_start_off_a_page_boundary(regions: SharedMemoryRegions,
                                                make_object: MakeObject) -> None:  # fmt: skip
    page = os.sysconf("SC_PAGE_SIZE")
    key, handle = make_object(3 * page)
    regions.register("r", key, page + 1, page + 100, client_uid=OWN)  # ends in the third page
    assert regions.read("r", 0, page + 100) == pattern(3 * page)[page + 1 : 2 * page + 101]
    regions.write("r", page - 3, 8, b"ABCDEFGH", output="OUT")  # straddles a page boundary
    assert contents(handle, 8, offset=2 * page - 2) == b"ABCDEFGH"


def test_bytes_tensors_are_in_the_binary_layout(regions: SharedMemoryRegions,
                                                make_object: MakeObject) -> None:  # fmt: skip
    strings = np.array([b"a", b"\x00bc", "é".encode(), b""], dtype=object).reshape(2, 2)
    serialized = serialize_byte_tensor(strings).item()
    key, handle = make_object(len(serialized) + 8)
    client_shm.set_shared_memory_region(handle, [np.frombuffer(serialized, np.uint8)], offset=8)
    regions.register("r", key, 8, len(serialized), client_uid=OWN)
    raw = memoryview(regions.read("r", 0, len(serialized)))
    decoded = decode_binary(from_datatype("BYTES"), [2, 2], raw, Limits())
    assert decoded.tolist() == [["a", "\x00bc"], ["é", ""]]

    regions.write("r", 0, len(serialized), encode_binary(decoded), output="OUT")
    assert client_shm.get_contents_as_numpy(handle, np.object_, [2, 2], offset=8).tolist() == (
        strings.tolist()
    )


# ---- regions unregistered or shrunk under a request ----------------------------------------


def test_unregister_while_a_read_is_in_progress(regions: SharedMemoryRegions,
                                                make_object: MakeObject,
                                                monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    key, _ = make_object(64)
    regions.register("r", key, 0, 64, client_uid=OWN)
    reading, go_on = threading.Event(), threading.Event()
    real_pread = os.pread

    def paused_pread(fd: int, size: int, at: int) -> bytes:
        reading.set()
        assert go_on.wait(10)
        return real_pread(fd, size, at)

    monkeypatch.setattr(os, "pread", paused_pread)
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(regions.read("r", 8, 16)))
    reader.start()
    try:
        assert reading.wait(10)
        regions.unregister("r")  # returns at once; the read keeps its descriptor
        assert regions.status() == []
        assert descriptors_on(key) == 1
        assert "Unable to find" in refused(NotFound, regions.read, "r", 0, 1)
        regions.register(
            "r", key, 0, 32, client_uid=OWN
        )  # the name is free again, with a descriptor of its own
        assert descriptors_on(key) == 2
    finally:
        go_on.set()
        reader.join(10)
    assert got == [pattern(64)[8:24]]
    assert descriptors_on(key) == 1  # the first one closed when its read ended
    monkeypatch.undo()
    assert regions.read("r", 0, 32) == pattern(32)
    regions.unregister()
    assert descriptors_on(key) == 0


def test_an_object_shrunk_by_its_client_is_refused_not_a_crash(
    regions: SharedMemoryRegions, make_object: MakeObject
) -> None:
    page = os.sysconf("SC_PAGE_SIZE")
    key, _ = make_object(4 * page)
    regions.register("r", key, 0, 4 * page, client_uid=OWN)
    os.truncate(path_of(key), 100)  # through a mapping, the next read would raise SIGBUS
    assert regions.read("r", 0, 100) == pattern(100)
    expected = ("shared memory region 'r' is smaller than when it was registered: its client "
                "truncated it")  # fmt: skip
    assert refused(InvalidInput, regions.read, "r", 2 * page, 16) == expected
    assert refused(InvalidInput, regions.read, "r", 0, 101) == expected
    assert refused(InvalidInput, regions.write, "r", 2 * page, 16, b"x" * 16,
                   output="OUT") == expected  # fmt: skip
    assert os.stat(path_of(key)).st_size == 100  # not grown back
    regions.write("r", 0, 100, b"z" * 100, output="OUT")


def test_reads_writes_and_registrations_from_many_threads(regions: SharedMemoryRegions,
                                                          make_object: MakeObject) -> None:  # fmt: skip
    threads, slot, rounds = 8, 4096 + 7, 100
    key, handle = make_object(threads * slot)
    other, _ = make_object(16)
    regions.register("r", key, 0, threads * slot, client_uid=OWN)
    errors: list[BaseException] = []

    def worker(n: int) -> None:
        try:
            for i in range(rounds):
                data = bytes([(n * 31 + i) % 256]) * slot
                regions.write("r", n * slot, slot, data, output="OUT")
                assert regions.read("r", n * slot, slot) == data
        except BaseException as exc:
            errors.append(exc)

    def churn() -> None:
        try:
            for i in range(rounds):
                regions.register(f"other{i}", other, 0, 16, client_uid=OWN)
                assert regions.read(f"other{i}", 0, 16) == pattern(16)
                regions.status()
                regions.unregister(f"other{i}")
        except BaseException as exc:
            errors.append(exc)

    workers = [threading.Thread(target=worker, args=(n,)) for n in range(threads)]
    workers.append(threading.Thread(target=churn))
    for thread in workers:
        thread.start()
    for thread in workers:
        thread.join(60)
    assert errors == []
    last = b"".join(bytes([(n * 31 + rounds - 1) % 256]) * slot for n in range(threads))
    assert contents(handle, threads * slot) == last
    assert descriptors_on(other) == 0


def test_unregister_all_while_threads_read(regions: SharedMemoryRegions,
                                           make_object: MakeObject) -> None:  # fmt: skip
    key, _ = make_object(1 << 20)
    regions.register("r", key, 0, 1 << 20, client_uid=OWN)
    errors: list[BaseException] = []
    reads = [0] * 4

    def reader(n: int) -> None:
        try:
            while True:
                assert len(regions.read("r", 0, 1 << 20)) == 1 << 20
                reads[n] += 1
        except NotFound:
            return  # unregistered: the only refusal expected
        except BaseException as exc:
            errors.append(exc)

    readers = [threading.Thread(target=reader, args=(n,)) for n in range(4)]
    for thread in readers:
        thread.start()
    deadline = time.monotonic() + 30
    while sum(reads) < 20 and not errors and time.monotonic() < deadline:
        time.sleep(0.001)
    regions.unregister()
    for thread in readers:
        thread.join(30)
    assert errors == []
    assert not any(thread.is_alive() for thread in readers)
    assert descriptors_on(key) == 0


# ---- CUDA shared memory: answered as a CPU-only Triton answers -------------------------------


def test_cuda_shared_memory(regions: SharedMemoryRegions, make_object: MakeObject) -> None:
    cuda = CudaSharedMemory(regions)
    key, _ = make_object(16)
    regions.register("system", key, 0, 16, client_uid=OWN)
    assert cuda.status() == cuda.status("") == []
    assert (
        refused(NotFound, cuda.status, "gpu") == "Unable to find cuda shared memory region: 'gpu'"
    )
    assert refused(NotFound, cuda.status, "system") == (
        "The region named 'system' is registered as system shared memory, not CUDA shared memory"
    )
    assert refused(InvalidInput, cuda.register, "gpu") == (
        "failed to register CUDA shared memory region: 'gpu', GPUs not supported"
    )
    cuda.unregister()
    cuda.unregister("gpu")
    assert regions.status("system")  # the system regions are not touched
