"""HTTP content codings of V2 bodies: gzip and deflate (zlib), as tritonclient sends them.

A request body is inflated in steps bounded by the body limit, so a small compressed body
cannot expand past it (a "zip bomb" is refused once the limit is passed, never held whole).
"""

import zlib
from collections.abc import Callable, Iterable

from service.errors import BadRequest, PayloadTooLarge

_WBITS = {"gzip": 31, "x-gzip": 31, "deflate": 15}  # 31: gzip wrapper; 15: zlib (HTTP deflate)
ENCODINGS = ("gzip", "deflate")

SHORT_ANSWER_BYTES = 1024
"""An answer shorter than this is sent as it is, whatever coding the client accepts (unless it
refuses `identity`): it fits one TCP segment compressed or not, so compressing saves no
transfer, and zlib's set-up for each answer cost 71-83 us here, more than a small V2 call's
own work. httpx-based clients (the KServe SDK among them) accept gzip on every call. Triton
compresses answers of every size; HTTP leaves the choice to the server (RFC 9110, 12.5.3), and
tritonclient reads either."""

INLINE_COMPRESSED_BYTES = 64 * 1024
"""The longest answer compressed on the event loop (a small request's, made inline); a longer
one is compressed on a kernel thread. zlib at level 1 took 1.1 ms for 64 KiB of float JSON
here, 9.7 ms for 512 KiB, and 34 ms for 1 MiB of random float32 (binary data, the inline
output allowance): each would have held every other client's request that long."""


def inflate(body: bytes, coding: str, max_bytes: int) -> bytes:
    """The decompressed body, refused (413) as soon as it passes `max_bytes`."""
    coding = coding.strip().lower()
    if coding in ("", "identity"):
        return body
    if coding not in _WBITS:
        raise UnsupportedEncoding(f"Content-Encoding {coding[:40]!r} is not supported; "
                                  "use gzip, deflate or identity")  # fmt: skip
    inflater = zlib.decompressobj(wbits=_WBITS[coding])
    try:
        out = inflater.decompress(body, max_bytes + 1)
    except zlib.error as exc:
        raise BadRequest(f"the {coding} body cannot be decompressed: {exc}") from None
    if len(out) > max_bytes:
        raise PayloadTooLarge(f"the decompressed body is over the limit of {max_bytes} bytes "
                              "(OPSERVE_MAX_REQUEST_BYTES)")  # fmt: skip
    if not inflater.eof or inflater.unused_data:
        raise BadRequest(f"the {coding} body is truncated or has bytes after its end")
    return out


INFLATE_STEP = 1024 * 1024
"""What inflating hands over at a time, for its caller to claim before it takes more."""


def sniffed(message: bytes) -> str | None:
    """The coding a message is compressed with, told by its first bytes: gzip's magic number,
    or a zlib header with a 32 KiB window (what zlib and grpc's deflate write); None for
    anything else. Used where the coding is not said (grpc.aio hides grpc-encoding): neither
    can begin a protocol buffer of a message we take (0x1f is wire type 7, which does not
    exist; 0x78 is field 15, which none has, and fields are written in number order)."""
    if len(message) < 2:
        return None
    head = message[0]
    if head == 0x1F and message[1] == 0x8B:
        return "gzip"
    if head == 0x78 and (head << 8 | message[1]) % 31 == 0:
        return "deflate"
    return None


def inflate_claimed(body: bytes, coding: str, max_bytes: int,
                    claim: Callable[[int], object]) -> bytes:  # fmt: skip
    """The decompressed body, `claim`ed step by step as it grows (INFLATE_STEP at a time, so
    a bomb holds at most one step more than it was granted), then for its joined copy; 413
    once past `max_bytes`, 400 when it is not a whole stream of `coding`."""
    inflater = zlib.decompressobj(wbits=_WBITS[coding])
    pieces, size, rest = [], 0, body
    try:
        while True:
            piece = inflater.decompress(rest, INFLATE_STEP)
            rest = inflater.unconsumed_tail
            if not piece:
                break
            size += len(piece)
            if size > max_bytes:
                raise PayloadTooLarge(f"the decompressed message is over the limit of "
                                      f"{max_bytes} bytes (OPSERVE_MAX_REQUEST_BYTES)")  # fmt: skip
            claim(len(piece))
            pieces.append(piece)
    except zlib.error as exc:
        raise BadRequest(f"the {coding} message cannot be decompressed: {exc}") from None
    if not inflater.eof or inflater.unused_data:
        raise BadRequest(f"the {coding} message is truncated or has bytes after its end")
    if len(pieces) == 1:
        return pieces[0]
    claim(size)  # the joined copy, while the pieces still exist
    return b"".join(pieces)


def unclaimed(nbytes: int) -> None:
    """The claims of an answer compressed on the event loop (a small request's): nothing of the
    budget is held for them."""


def deflate(pieces: Iterable[bytes | memoryview], coding: str,
            claim: Callable[[int], None] = unclaimed) -> list[bytes]:  # fmt: skip
    """`pieces` compressed with `coding` (level 1: fast, as large tensors compress poorly), one
    at a time as they come. Claimed: every piece (as if the text were whole) and what they
    compress to."""
    compressor = zlib.compressobj(1, zlib.DEFLATED, _WBITS[coding])
    packed = []
    for piece in pieces:
        claim(len(piece))
        packed.append(compressor.compress(piece))
    packed.append(compressor.flush())
    claim(sum(map(len, packed)))
    return [part for part in packed if part]


def accepted(header: str) -> str | None:
    """The coding to answer with for an Accept-Encoding header: gzip, deflate or None. Only a
    coding named with a weight above zero is used (`gzip;q=0`, `gzip; Q=0.000` refuse it; an
    unreadable weight counts as zero); `*` is not taken as a wish for compression."""
    weights = _weights(header)
    for coding in ENCODINGS:
        if weights.get(coding, 0.0) > 0:
            return coding
    return None


def answer_coding(header: str, coding: str | None, size: int) -> str | None:
    """The coding an answer of `size` bytes is sent with: `coding` (what `header`, the
    Accept-Encoding, accepted) unless the answer is short (SHORT_ANSWER_BYTES) and the header
    does not refuse `identity`."""
    if coding is None or size >= SHORT_ANSWER_BYTES:
        return coding
    return coding if _refuses_identity(header) else None


def _refuses_identity(header: str) -> bool:
    """Whether an Accept-Encoding header refuses an answer sent as it is: `identity;q=0`, or
    `*;q=0` without `identity` named (RFC 9110, 12.5.3)."""
    weights = _weights(header)
    if "identity" in weights:
        return weights["identity"] == 0.0
    return weights.get("*", 1.0) == 0.0


def _weights(header: str) -> dict[str, float]:
    """An Accept-Encoding header's codings (lower case) and their weights."""
    weights: dict[str, float] = {}
    for item in header.lower().split(","):
        name, *params = (part.strip() for part in item.split(";"))
        weight = 1.0
        for param in params:
            key, _, value = (part.strip() for part in param.partition("="))
            if key == "q":
                weight = _weight(value)
        if name:
            weights[name] = weight
    return weights


def _weight(value: str) -> float:
    """An RFC 9110 qvalue (0 to 1, three decimals at most); anything else is 0."""
    if not value or len(value) > 5 or value[0] not in "01" or value.strip("0123456789."):
        return 0.0
    try:
        weight = float(value)
    except ValueError:
        return 0.0
    return weight if 0.0 <= weight <= 1.0 else 0.0


class UnsupportedEncoding(BadRequest):
    """A Content-Encoding we do not decode."""

    status_code = 415
