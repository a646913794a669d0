"""Calls a process serves at once (gRPC's: OPSERVE_GRPC_MAX_CALLS), and how many of them one
client may hold (OPSERVE_GRPC_MAX_CALLS_PER_CLIENT), so that one client opening streams and
leaving them silent cannot lock every other client out. A client is its address without the
port: one host's connections count together, as a client that opens many does."""

from service.errors import Overloaded


class CallSlots:
    """At most `total` calls, and at most `per_client` of them for one client address."""

    def __init__(self, total: int, per_client: int) -> None:
        self.total = total
        self.per_client = per_client
        self.taken = 0
        self.by_client: dict[str, int] = {}  # only clients holding a slot: bounded by `total`

    def take(self, client: str) -> Overloaded | None:
        """Take a slot for `client`; the refusal when none is free for it (nothing taken)."""
        if self.taken >= self.total:
            return Overloaded(f"the server is answering {self.total} gRPC calls, as many as it "
                              "may (OPSERVE_GRPC_MAX_CALLS); retry later")  # fmt: skip
        held = self.by_client.get(client, 0)
        if held >= self.per_client:
            return Overloaded(f"this client ({client}) has {held} gRPC calls open, as many as "
                              "one client may (OPSERVE_GRPC_MAX_CALLS_PER_CLIENT); end some, or "
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
