"""Which local user a TCP client is: the uid that owns the client's end of its connection,
found in the kernel's socket tables (/proc/net/tcp and /proc/net/tcp6), or None when it
cannot be told (the client is not in this network namespace, or came through a proxy).

Written by hand: no library maps a TCP peer to its uid (SO_PEERCRED is for Unix sockets
only; psutil walks every process's descriptors, which needs the rights this check exists to
withhold). The tables list every socket of this network namespace with its local and remote
address, state, owner uid and inode. The client's end is the socket whose local address is
the client's address as the server sees it; it counts only if its remote address is the
server's end (when the door knows it) and the server's own end, the mirror entry, is in the
table too: then both ends are in this namespace and the entry is the client's socket, not a
stranger's with the same address on another host. A socket's uid is its creator's and
cannot be changed later; only a process that was handed the descriptor can use it.

The tables are read as lines, at most MAX_TABLE_BYTES of each (a busy host lists hundreds of
thousands of sockets); only lines that carry the client's address are parsed.
"""

import ipaddress
import struct
import urllib.parse
from collections.abc import Iterator
from typing import Any, NamedTuple

Endpoint = tuple[str, int]
"""An address and a port as a door sees them: ("127.0.0.1", 5000), ("::1", 5000)."""

TABLES = ("/proc/net/tcp", "/proc/net/tcp6")
MAX_TABLE_BYTES = 64 * 1024 * 1024
"""Read of each table at most (about 400,000 sockets); a client not found within it is not
told apart."""
_LIVE = frozenset({"01", "04", "05", "08"})
"""ESTABLISHED, FIN_WAIT1, FIN_WAIT2, CLOSE_WAIT: a connection still open at one end. A
TIME_WAIT entry (06) has no owner and shows uid 0; LISTEN (0A) and half-open requests are no
connection."""

Address = ipaddress.IPv4Address | ipaddress.IPv6Address


class Entry(NamedTuple):
    """One line of a table: both ends, the state (two hex digits), the owner's uid and the
    socket's inode (0 once no process holds it)."""

    local: tuple[Address, int]
    remote: tuple[Address, int]
    state: str
    uid: int
    inode: int


def uid_of(client: Any, server: Any = None) -> int | None:
    """The uid of the local user whose socket is the client's end of the connection from
    `client` to `server` (Endpoints; server None: any address of this host); None when
    `client` is None or no endpoint, or no such socket is found, or the ones found disagree."""
    if client is None:
        return None
    try:
        near = _normal(client)
        far = _normal(server) if server is not None else None
    except (TypeError, ValueError):  # an ASGI server's ("/path/to.sock", None), say
        return None
    entries = list(connections(near))
    mirrors = {(e.local, e.remote) for e in entries}
    uids = {e.uid for e in entries
            if e.local == near and (far is None or e.remote == far)
            and (e.remote, e.local) in mirrors}  # fmt: skip
    return uids.pop() if len(uids) == 1 else None


def connections(client: Endpoint | tuple[Address, int]) -> Iterator[Entry]:
    """The live, owned entries of both tables that have `client` at either end."""
    address, port = _normal(client)
    needles = _needles(address, port)
    for table, needle in zip(TABLES, needles, strict=True):
        if needle is None:
            continue
        for line in _lines(table):
            if needle in line:
                entry = parse(line)
                if entry is not None and entry.state in _LIVE and entry.inode:
                    yield entry


def parse(line: bytes) -> Entry | None:
    """One table line as an Entry; None for the heading or a line of another shape."""
    fields = line.split()
    if len(fields) < 10 or not fields[0].endswith(b":"):
        return None
    try:
        return Entry(_endpoint(fields[1]), _endpoint(fields[2]), fields[3].decode(),
                     int(fields[7]), int(fields[9]))  # fmt: skip
    except ValueError:
        return None


def endpoint_of_grpc_peer(peer: str) -> Endpoint | None:
    """The endpoint in gRPC's peer text ("ipv4:127.0.0.1:5000", "ipv6:[::1]:5000", the
    brackets maybe %-encoded); None for another kind of peer (a Unix socket)."""
    kind, _, rest = peer.partition(":")
    if kind not in ("ipv4", "ipv6"):
        return None
    host, _, port = urllib.parse.unquote(rest).rpartition(":")
    try:
        return host.strip("[]"), int(port)
    except ValueError:
        return None


def _normal(endpoint: Any) -> tuple[Address, int]:
    """An endpoint as the tables show it: an IPv4 address mapped into IPv6 as IPv4, no zone."""
    host, port = endpoint
    address = ipaddress.ip_address(host if not isinstance(host, str) else host.partition("%")[0])
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    if not 0 <= int(port) <= 0xFFFF:
        raise ValueError(f"port {port}")
    return address, int(port)


def _needles(address: Address, port: int) -> tuple[bytes | None, bytes | None]:
    """How the endpoint is written in /proc/net/tcp and in /proc/net/tcp6 (None: not there)."""
    if isinstance(address, ipaddress.IPv4Address):
        mapped = ipaddress.IPv6Address(b"\0" * 10 + b"\xff\xff" + address.packed)
        return _hex(address.packed, port), _hex(mapped.packed, port)
    return None, _hex(address.packed, port)


def _hex(packed: bytes, port: int) -> bytes:
    # the kernel prints each 32-bit word of the address as a number in the host's byte order
    words = struct.unpack(f"={len(packed) // 4}I", packed)
    return b"".join(b"%08X" % word for word in words) + b":%04X" % port


def _endpoint(text: bytes) -> tuple[Address, int]:
    hex_address, _, hex_port = text.partition(b":")
    raw = bytes.fromhex(hex_address.decode())
    if len(raw) not in (4, 16):
        raise ValueError("address size")
    words = struct.unpack(f">{len(raw) // 4}I", raw)  # the printed numbers, digits first
    packed = struct.pack(f"={len(words)}I", *words)  # each word's bytes as the host holds them
    return _normal((ipaddress.ip_address(packed), int(hex_port, 16)))


def _lines(table: str) -> Iterator[bytes]:
    read = 0
    try:
        with open(table, "rb") as lines:
            for line in lines:
                read += len(line)
                if read > MAX_TABLE_BYTES:
                    return
                yield line
    except OSError:  # no such table (no IPv6, no /proc): nothing of it
        return
