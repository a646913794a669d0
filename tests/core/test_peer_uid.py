"""Telling a local TCP client's user from the kernel's socket tables, against real sockets
opened here: IPv4 and IPv6 loopback, an IPv4 client of a dual-stack listener, a client of
another user (a child process run as nobody), and the cases that must answer None."""

import os
import socket
import sys
from collections.abc import Iterator

import pytest

from service.core import peer_uid
from service.core.peer_uid import endpoint_of_grpc_peer, uid_of

NOBODY = 65534
Pair = tuple[socket.socket, socket.socket, socket.socket]  # listener, client, accepted


def ends(sock: socket.socket) -> tuple[tuple[str, int], tuple[str, int]]:
    """(local, remote) of a socket, as (host, port)."""
    return sock.getsockname()[:2], sock.getpeername()[:2]


@pytest.fixture(params=[(socket.AF_INET, "127.0.0.1"), (socket.AF_INET6, "::1")],
                ids=["ipv4", "ipv6"])  # fmt: skip
def pair(request: pytest.FixtureRequest) -> Iterator[Pair]:
    family, host = request.param
    listener = socket.socket(family)
    listener.bind((host, 0))
    listener.listen()
    client = socket.create_connection(listener.getsockname()[:2])
    accepted, _ = listener.accept()
    yield listener, client, accepted
    for sock in (client, accepted, listener):
        sock.close()


def test_a_loopback_client_is_told_by_its_socket(pair: Pair) -> None:
    _listener, client, accepted = pair
    near, far = ends(client)
    assert accepted.getpeername()[:2] == near  # what the server sees
    assert uid_of(near, far) == os.geteuid()
    assert uid_of(near) == os.geteuid()  # the server's end unknown (gRPC): found by its mirror
    found = {(str(e.local[0]), e.local[1], str(e.remote[0]), e.remote[1], e.state)
             for e in peer_uid.connections(near)}  # fmt: skip
    assert found == {(*near, *far, "01"), (*far, *near, "01")}  # both ends, ESTABLISHED


def test_endpoints_that_name_no_client(pair: Pair) -> None:
    _listener, client, _accepted = pair
    near, far = ends(client)
    assert uid_of(near, (far[0], far[1] + 1 if far[1] < 65535 else 1)) is None  # not our end
    assert uid_of(None) is None
    assert uid_of(("/run/opserve.sock", None)) is None  # an ASGI server on a Unix socket
    assert uid_of(("not an address", 5000)) is None
    assert uid_of((near[0], 70000)) is None
    spare = socket.socket(client.family)
    spare.bind((near[0], 0))  # bound, never connected: no connection
    assert uid_of(spare.getsockname()[:2], far) is None
    spare.close()


def test_an_ipv4_client_of_a_dual_stack_listener() -> None:
    listener = socket.socket(socket.AF_INET6)
    listener.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
    listener.bind(("::", 0))
    listener.listen()
    client = socket.create_connection(("127.0.0.1", listener.getsockname()[1]))
    accepted, seen = listener.accept()
    try:
        assert seen[0] == "::ffff:127.0.0.1"  # as the server sees it (and uvicorn passes it)
        assert uid_of(seen[:2], accepted.getsockname()[:2]) == os.geteuid()
        assert uid_of(seen[:2]) == os.geteuid()
    finally:
        for sock in (client, accepted, listener):
            sock.close()


def _connect_as_nobody(port: int) -> tuple[int, int, int]:
    """A child process that becomes nobody, connects to `port` and waits until its pipe
    closes: (its pid, its end's port, the pipe's end that lets it go)."""
    ready_r, ready_w = os.pipe()
    go_r, go_w = os.pipe()
    pid = os.fork()  # not a new interpreter: nobody may not run one from /root
    if pid == 0:  # the child: socket calls only, then out
        try:
            os.close(go_w)  # else the read below never sees the end
            os.setgid(NOBODY)
            os.setuid(NOBODY)
            sock = socket.create_connection(("127.0.0.1", port))
            os.write(ready_w, b"%d" % sock.getsockname()[1])
            os.read(go_r, 1)
        finally:
            os._exit(0)
    os.close(ready_w)
    os.close(go_r)
    local = int(os.read(ready_r, 16))
    os.close(ready_r)
    return pid, local, go_w


@pytest.mark.skipif(os.geteuid() != 0, reason="runs a child as another user")
def test_a_client_of_another_user_is_told_and_forgotten_once_it_left() -> None:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    pid, local, go = _connect_as_nobody(listener.getsockname()[1])
    accepted, seen = listener.accept()
    try:
        assert seen[1] == local
        server = accepted.getsockname()[:2]
        assert uid_of(seen[:2], server) == NOBODY
        os.close(go)  # the child ends: its socket is no one's now
        os.waitpid(pid, 0)
        assert uid_of(seen[:2], server) is None
    finally:
        accepted.close()
        listener.close()


def test_the_tables_are_read_within_their_bound(pair: Pair,
                                                monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    near, far = ends(pair[1])
    monkeypatch.setattr(peer_uid, "MAX_TABLE_BYTES", 100)  # the heading line only
    assert uid_of(near, far) is None


@pytest.mark.parametrize(("line", "parsed"), [
    (b"  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  "
     b"timeout inode\n", None),
    (b"   0: 0100007F:1F90 0100007F:D431 01 00000000:00000000 00:00000000 00000000  1000 "
     b"       0 4242 1 0000000000000000 20 4 30 10 -1\n",
     ("127.0.0.1", 8080, "127.0.0.1", 54321, "01", 1000, 4242)),
    (b"   1: 00000000000000000000000001000000:1F90 0000000000000000FFFF00000100007F:D431 08 "
     b"00000000:00000000 00:00000000 00000000     0        0 7 1 0 20 4 30 10 -1\n",
     ("::1", 8080, "127.0.0.1", 54321, "08", 0, 7)),
    (b"   2: 0100007F:1F90 0100007F\n", None),
    (b"   3: 0100007F:ZZZZ 0100007F:D431 01 0:0 0:0 0 0 0 1 1\n", None),
    (b"   4: 01007F:1F90 0100007F:D431 01 0:0 0:0 0 0 0 1 1\n", None),
])  # fmt: skip
def test_table_lines(line: bytes, parsed: tuple[object, ...] | None) -> None:
    if sys.byteorder != "little" and parsed is not None:
        pytest.skip("the sample lines are a little-endian host's")
    entry = peer_uid.parse(line)
    if parsed is None:
        assert entry is None
        return
    assert entry is not None
    assert (str(entry.local[0]), entry.local[1], str(entry.remote[0]), entry.remote[1],
            entry.state, entry.uid, entry.inode) == parsed  # fmt: skip


@pytest.mark.parametrize(("peer", "endpoint"), [
    ("ipv4:127.0.0.1:5000", ("127.0.0.1", 5000)),
    ("ipv6:[::1]:5000", ("::1", 5000)),
    ("ipv6:%5B::1%5D:5000", ("::1", 5000)),
    ("ipv6:[::ffff:127.0.0.1]:80", ("::ffff:127.0.0.1", 80)),
    ("unix:/run/opserve.sock", None),
    ("ipv4:127.0.0.1", None),
    ("", None),
])  # fmt: skip
def test_grpc_peers(peer: str, endpoint: tuple[str, int] | None) -> None:
    assert endpoint_of_grpc_peer(peer) == endpoint
