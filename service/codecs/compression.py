"""HTTP content codings of V2 bodies: gzip and deflate (zlib), as tritonclient sends them.

A request body is inflated in steps bounded by the body limit, so a small compressed body
cannot expand past it (a "zip bomb" is refused once the limit is passed, never held whole).
"""

import zlib

from service.errors import BadRequest, PayloadTooLarge

_WBITS = {"gzip": 31, "x-gzip": 31, "deflate": 15}  # 31: gzip wrapper; 15: zlib (HTTP deflate)
ENCODINGS = ("gzip", "deflate")


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


def deflate(body: bytes, coding: str) -> bytes:
    """`body` compressed with `coding` (level 1: fast, as large tensors compress poorly)."""
    compressor = zlib.compressobj(1, zlib.DEFLATED, _WBITS[coding])
    return compressor.compress(body) + compressor.flush()


def accepted(header: str) -> str | None:
    """The coding to answer with for an Accept-Encoding header: gzip, deflate or None."""
    offered = {}
    for item in header.lower().split(","):
        name, _, params = item.strip().partition(";")
        q = params.strip().removeprefix("q=") if params.strip().startswith("q=") else "1"
        offered[name.strip()] = q
    for coding in ENCODINGS:
        weight = offered.get(coding)
        if weight is not None and weight not in ("0", "0.0", "0.00", "0.000"):
            return coding
    return None


class UnsupportedEncoding(BadRequest):
    """A Content-Encoding we do not decode."""

    status_code = 415
