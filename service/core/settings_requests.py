"""Requests that read or change settings, or ask the repository (its index, an unload,
shared memory registration, trace and log settings), are small, at every door: their bodies
are at most SETTINGS_BODY_BYTES, 413 (RESOURCE_EXHAUSTED over gRPC) past it.

What they carry is a few fields, but a body is parsed into Python objects, and these routes
used to take any body up to OPSERVE_MAX_REQUEST_BYTES: a 60 MiB JSON body of numbers, under
every limit, held the event loop 280-437 ms while it was parsed, counted and freed (a health
probe beside it), and a gRPC TraceSetting of a million settings was turned into a dict there.
A load carries a model's files and is not one of these: its body is parsed on a kernel
thread when large (api/v2_routes.py; gRPC's messages always are: grpc/messages.py)."""

from service.errors import PayloadTooLarge

SETTINGS_BODY_BYTES = 64 * 1024


def check_settings_size(size: int) -> None:
    """413 for a settings or repository request's body of `size` bytes over the limit."""
    if size > SETTINGS_BODY_BYTES:
        raise settings_too_large(f"of {size} bytes is")


def settings_too_large(what: str) -> PayloadTooLarge:
    """The 413 of a settings or repository request whose body `what` over the limit."""
    return PayloadTooLarge(
        f"the request body {what} over the limit of {SETTINGS_BODY_BYTES} bytes for a "
        "settings or repository request (index, unload, shared memory, trace and log settings)"
    )
