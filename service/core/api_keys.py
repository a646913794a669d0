"""API keys (OPSERVE_API_KEYS), the rule both doors keep: the keys the setting names, and
whether an `Authorization: Bearer <key>` value carries one of them. The HTTP door reads the
header (service/api/api_keys.py), the gRPC door the call's metadata (service/grpc/api_keys.py);
each decides which of its paths stay open to probes and tools."""

import hmac

UNAUTHORIZED = "unauthorized"
"""The route label of a call refused for its key (its path never reached a route)."""
REFUSED = "a valid API key is required: send 'Authorization: Bearer <key>'"
"""What a refused call is told, on either door."""


def parse_keys(setting: str) -> tuple[bytes, ...]:
    """The keys of the OPSERVE_API_KEYS setting: comma-separated, blanks ignored."""
    return tuple(key.strip().encode() for key in setting.split(",") if key.strip())


def authorized(value: bytes, keys: tuple[bytes, ...]) -> bool:
    """Whether an Authorization value is `Bearer <one of keys>` (the scheme in any case)."""
    scheme, _, token = value.partition(b" ")
    if scheme.lower() != b"bearer":
        return False
    token = token.strip()
    # compare with every key, always: the time taken says nothing of which one matched
    return any([hmac.compare_digest(token, key) for key in keys])
