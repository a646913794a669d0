"""The request id: the client's `X-Request-ID` when it is a sane token, else a new random one.

nginx (deploy/nginx/) makes one when a client sent none, so a request keeps the same id from
the load balancer's log to the service's log line and back to the client in the response."""

import itertools
import os
import re

HEADER = b"x-request-id"
# Printable ASCII without spaces, bounded: a client's id goes into headers and log lines as is.
_SANE = re.compile(rb"[\x21-\x7e]{1,128}")
# Made ids: a random prefix per process and a counter, unique without a system call per request.
_PREFIX = os.urandom(8).hex().encode()
_COUNTER = itertools.count()


def request_id(sent: bytes | None) -> bytes:
    """The id of a request whose `X-Request-ID` was `sent`: that if sane, else 32 new hex digits."""
    if sent is not None and _SANE.fullmatch(sent):
        return bytes(sent)
    return b"%s%016x" % (_PREFIX, next(_COUNTER))  # bytes formatting: no str to encode


def _new_prefix() -> None:
    global _PREFIX
    _PREFIX = os.urandom(8).hex().encode()


os.register_at_fork(after_in_child=_new_prefix)  # forked workers must not repeat ids
