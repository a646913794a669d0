"""How the door takes a call's messages: room asked before a read, memory claimed before a
message is decompressed or parsed, and a malformed message refused in words.

Every method is registered with no deserializer, so grpc.aio hands over each message as the
bytes that came, and (with "grpc.per_message_decompression" off, server.py) still compressed.
The door then:
- asks the message room (core/message_room.py) for a lease before a unary call's read:
  grpc core gathers a whole message, up to the receive limit (OPSERVE_MAX_REQUEST_BYTES),
  once a read is asked for, and only then tells its size. Before the read, HTTP/2 flow control
  holds a call's client to 64 KiB (the BDP probe is off, server.py). A stream's reads are not
  leased: a stream waits for its next message for as long as its client likes, and a lease
  held meanwhile would shut everyone else out; what streams hold before their claim is one
  message each at most (docs/v2.md says what that bounds and what it does not);
- claims, before parsing, twice the bytes of a message over INLINE_BODY_BYTES (its bytes and
  the parsed copy), and gives the first back once they are gone;
- inflates a compressed message step by step, each step claimed before the next
  (codecs/compression.inflate_claimed), so a bomb is refused at the size limit or the budget,
  never held whole; its coding is told by its first bytes, as grpc.aio does not show the
  call's grpc-encoding;
- parses a small message inline, a large or compressed one on a kernel thread.
"""

from collections.abc import Callable
from functools import partial
from typing import Any, NamedTuple

import grpc
from google.protobuf.message import DecodeError

from service.codecs.compression import inflate_claimed, sniffed
from service.core.deadlines import within
from service.core.memory_budget import Reservation
from service.core.message_room import MessageRoom
from service.core.offload import INLINE_BODY_BYTES, Offloader
from service.errors import BadRequest

Parse = Callable[[bytes], Any]
Late = Callable[[], Exception]


class Read(NamedTuple):
    """A message read: the message, its bytes on the wire, and its serialized size (inflated:
    what protobuf's ByteSize would say, which costs a serialization of the message)."""

    message: Any
    wire_bytes: int
    size: int


class Messages:
    """The door's reading of messages, bounded by `room`, the budget and `max_bytes`."""

    def __init__(self, room: MessageRoom, offloader: Offloader, max_bytes: int) -> None:
        self.room = room
        self.offloader = offloader
        self.max_bytes = max_bytes

    async def read(self, context: grpc.aio.ServicerContext, parse: Parse, held: Reservation,
                   timeout: float, late: Late, leased: bool) -> Read | None:  # fmt: skip
        """The call's next message, None at the end of the call; `late()` is raised once
        none has come within `timeout` seconds. What the message holds is claimed in `held`
        (nothing for a small one)."""
        lease = await self.room.enter() if leased else None
        try:
            data = await within(context.read(), timeout, late)
        except BaseException:
            self._leave(lease)
            raise
        if data is grpc.aio.EOF:
            self._leave(lease)
            return None
        size, coding = len(data), sniffed(data)
        if size <= INLINE_BODY_BYTES:
            self._leave(lease)
            if coding is None:
                return Read(_parsed(parse, data), size, size)
            lease = None
        before = held.held
        need = size if coding else 2 * size  # its bytes, and their parsed copy
        if lease is None:
            await held.grow(need)
        else:
            await self.room.claim(lease, held, need)
        if coding is None:
            message, kept = await self.offloader.on_thread(_parsed, parse, data), size
        else:
            message, kept = await held.run(partial(
                self.offloader.on_thread, self._inflated, parse, data, coding, held.claim))  # fmt: skip
        del data  # held by nobody else now: what the bytes took goes back
        held.shrink(held.held - before - kept)
        return Read(message, size, kept)

    def _leave(self, lease: int | None) -> None:
        if lease is not None:
            self.room.leave(lease)

    def _inflated(self, parse: Parse, data: bytes, coding: str,
                  claim: Callable[[int], None]) -> tuple[Any, int]:  # fmt: skip
        """(On a kernel thread.) The message inflated, with its parsed copy claimed too."""
        plain = inflate_claimed(data, coding, self.max_bytes, claim)
        claim(len(plain))
        return _parsed(parse, plain), len(plain)


def _parsed(parse: Parse, data: bytes) -> Any:
    try:
        return parse(data)
    except DecodeError as exc:  # the class is named by the parser: its message's full name
        name = getattr(parse, "__self__", None)
        what = name.DESCRIPTOR.full_name if name is not None else "message"
        raise BadRequest(f"the request is not a valid {what} message ({exc})") from None
