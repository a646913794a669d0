"""What tells a client's resend of a sequence step from another step: a fingerprint of its
request. Triton's clients resend a request as it was (the same correlation id, flags, inputs,
and request id when they give one), so a keeper that may have applied a step whose answer never
reached its client (cluster mode's, after its store went away mid-step) recognises the resend
and applies nothing again. Made only when a keeper asks: this process's never does."""

import hashlib
import struct
from collections.abc import Mapping

import numpy as np

from service.core.calls import InferCall

_SIZE = struct.Struct(">Q")


class Resend:
    """One step's request as a resend of it would come again."""

    __slots__ = ("call", "inputs")

    def __init__(self, call: InferCall, inputs: Mapping[str, np.ndarray]) -> None:
        self.call = call
        self.inputs = inputs

    @property
    def named(self) -> bool:
        """Whether the request carries its own id (a resend is then told from any new step)."""
        return bool(self.call.id)

    @property
    def nbytes(self) -> int:
        return sum(int(array.nbytes) for array in self.inputs.values())

    def digest(self) -> bytes:
        """16 bytes of BLAKE2b over the request id, the parameters (sequence id and flags among
        them), the outputs asked for, and each input's name, type, shape and contents."""
        found = hashlib.blake2b(digest_size=16)
        call = self.call
        head = (call.id, sorted((k, repr(v)) for k, v in call.parameters.items()),
                None if call.outputs is None else [repr(o) for o in call.outputs])  # fmt: skip
        _part(found, repr(head).encode())
        for name in sorted(self.inputs):
            array = self.inputs[name]
            _part(found, repr((name, array.dtype.str, array.shape)).encode())
            if array.dtype == object:
                for item in array.flat:
                    _part(found, item if isinstance(item, bytes) else str(item).encode())
            else:
                _part(found, np.ascontiguousarray(array).data)
        return found.digest()


def _part(found: "hashlib.blake2b", data: bytes | memoryview) -> None:
    found.update(_SIZE.pack(memoryview(data).nbytes))  # lengths first: parts never run together
    found.update(data)
