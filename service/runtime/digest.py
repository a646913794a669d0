"""The digest that names a model's bytes: the key of posted models' sessions (in the server and
in the isolated workers), of the load probe's memory, and of repository models' response
cache entries.

SHA-256, as hashlib's OpenSSL computes it with the CPU's SHA instructions: 0.57 ms for a
786 KB model on the development host, where blake2b took 1.45-1.63 ms (hashlib's blake2 has
no SIMD path); a posted model is hashed once, when first seen (engines/choice.py finds it
again by comparing bytes, which is cheaper still). A client chooses the
bytes, so the digest must resist collisions: a collision would hand one client's request
another client's model.
"""

import hashlib


def model_digest(data: bytes) -> bytes:
    """The SHA-256 digest of `data` (32 bytes)."""
    return hashlib.sha256(data).digest()


def digest_of(*parts: bytes) -> bytes:
    """The SHA-256 digest of `parts` in turn (a model's bytes, then what else the key covers)."""
    found = hashlib.sha256()
    for part in parts:
        found.update(part)
    return found.digest()
