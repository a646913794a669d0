"""Calls a process serves at once (gRPC's: OPSERVE_GRPC_MAX_CALLS), and how many of them one
client may hold (OPSERVE_GRPC_MAX_CALLS_PER_CLIENT), so that one client cannot lock every other
client out. Open streams are counted the same way in counts of their own
(OPSERVE_GRPC_MAX_STREAMS, OPSERVE_GRPC_MAX_STREAMS_PER_CLIENT), apart from calls: a stream
takes a call slot only while one of its messages is served (service/grpc/door.py), so streams
left silent, however many, hold nothing another client's call needs, behind a proxy too
(where every client has the proxy's address); their own count bounds the tasks and buffers
they hold. A client is its address without the
port, so one host's connections count together, and further: every loopback address is one
client (a local user may connect from any of 127.0.0.0/8), and an IPv6 client is its /64 (one
host is given a whole /64 to choose from)."""

import ipaddress
from functools import lru_cache

from service.errors import Overloaded


@lru_cache(maxsize=4096)  # bounded: a client's calls ask for it again and again
def client_of(host: str) -> str:
    """The client an address counts as: "loopback", an IPv6 /64, or the address itself."""
    try:
        address = ipaddress.ip_address(host)
    except ValueError:  # not an address (a Unix socket's path): as it is
        return host
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    if address.is_loopback:
        return "loopback"
    if isinstance(address, ipaddress.IPv6Address):
        return str(ipaddress.IPv6Network((address, 64), strict=False))
    return str(address)


CALLS = "OPSERVE_GRPC_MAX_CALLS"
STREAMS = "OPSERVE_GRPC_MAX_STREAMS"


class CallSlots:
    """At most `total` calls (or streams), and at most `per_client` of them for one client
    address; `setting` names the total's setting, and with `_PER_CLIENT` the other's."""

    def __init__(self, total: int, per_client: int, what: str = "gRPC calls",
                 setting: str = CALLS) -> None:  # fmt: skip
        self.total = total
        self.per_client = per_client
        self.what = what  # what the calls are, in a refusal
        self.setting = setting
        self.taken = 0
        self.by_client: dict[str, int] = {}  # only clients holding a slot: bounded by `total`

    def take(self, client: str) -> Overloaded | None:
        """Take a slot for `client` (client_of's name for it); the refusal when none is free
        for it (nothing taken)."""
        if self.taken >= self.total:
            return Overloaded(f"the server is answering {self.total} {self.what}, as many as it "
                              f"may ({self.setting}); retry later")  # fmt: skip
        held = self.by_client.get(client, 0)
        if held >= self.per_client:
            return Overloaded(f"this client ({client}) has {held} {self.what} open, as many as "
                              f"one client may ({self.setting}_PER_CLIENT); end some, or "
                              "retry later")  # fmt: skip
        self.taken += 1
        self.by_client[client] = held + 1
        return None

    def give(self, client: str) -> None:
        """Give back a slot `take` gave `client`."""
        self.taken -= 1
        held = self.by_client[client] - 1
        if held:
            self.by_client[client] = held
        else:
            del self.by_client[client]
