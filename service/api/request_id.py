"""The request id: the client's `X-Request-ID` when it is a sane token, else a new random one.

nginx (deploy/nginx/) makes one when a client sent none, so a request keeps the same id from
the load balancer's log to the service's log line and back to the client in the response."""

import os
import re

from starlette.types import Scope

HEADER = b"x-request-id"
# Printable ASCII without spaces, bounded: a client's id goes into headers and log lines as is.
_SANE = re.compile(rb"[\x21-\x7e]{1,128}")


def request_id(scope: Scope) -> bytes:
    """The id of this request: the client's `X-Request-ID` if sane, else 32 random hex digits."""
    for name, value in scope["headers"]:
        if name == HEADER:
            if _SANE.fullmatch(value):
                return bytes(value)
            break
    return os.urandom(16).hex().encode()
