"""The response cache (Triton's, issue 33): a repeated request to a model whose configuration
says `response_cache { enable: true }` is answered from a cache when OPSERVE_RESPONSE_CACHE_BYTES
turns one on. What is kept is the model's output arrays, never an encoded answer, so every
request encodes them in its own form (JSON or binary, classification, shared memory, its id).

The key (SHA-256: hashlib's runs on the CPU's SHA instructions, about 3x blake2b's speed
here, runtime/digest.py) covers what can change those arrays: the model, its version and the digest of
the version's model file and configuration (a version reloaded in place is another model), each
input's name, datatype, shape and bytes (Triton's key has only names and bytes: the same bytes
in another shape or datatype collided), the outputs asked for in their order, and the request
parameters the model sees. Never kept: sequence models, models with a random operator, ensembles
(the loader leaves their `cache_tag` None) and failed answers.

Counted as Triton counts: a hit is a success with its `cache_hit` time (looking up and encoding)
and no compute phases, inference or execution; a miss is an ordinary success plus its
`cache_miss` time (looking up and storing). The store is this process's LRU (below) or, in
cluster mode, the cluster's Redis (service/cluster/response_cache.py)."""

import hashlib
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import Any, Protocol, TypeVar

import numpy as np

from service.codecs.v2_binary import encode_binary
from service.core.execution import Execution
from service.core.inference import InferWork, Preparing
from service.core.memory_budget import MemoryBudget, Reservation
from service.core.model import V2Model, model_parameters
from service.core.statistics import ModelStatistics

T = TypeVar("T")
Arrays = dict[str, np.ndarray]
ENTRY_OVERHEAD = 256
"""Bytes counted per entry besides its arrays (its key, the dict and array headers)."""


class CacheStore(Protocol):
    """Where entries are kept: `get` answers None for an entry it does not have (or cannot
    reach); `put` keeps one when it can, and never raises for a store away or full."""

    async def get(self, key: bytes) -> Arrays | None: ...

    async def put(self, key: bytes, arrays: Arrays, nbytes: int) -> None: ...


def cache_key(model: V2Model, tag: bytes, work: InferWork[Any]) -> bytes:
    """The key of a prepared request (its inputs decoded)."""
    call, inputs = work.call, work.inputs
    assert call is not None and inputs is not None
    digest = hashlib.sha256()
    text = [model.name, str(model.version), tag.hex()]
    sent = {item.name: item.datatype for item in call.inputs}
    for name in sorted(inputs):  # the order of the inputs does not change the answer
        array = inputs[name]
        text += ("input", name, sent[name], ",".join(map(str, array.shape)))
        _update(digest, "\0".join(text).encode())
        text = []
        _update(digest, encode_binary(array))
    # the outputs answered, in their order (none named: all of them, as naming them all)
    requested = [output.name for output in call.outputs] if call.outputs is not None else None
    text += ("outputs", *model.entry.io.output_names(requested))  # type: ignore[attr-defined]
    for name, value in sorted(model_parameters(call.parameters).items()):
        text += ("parameter", name, type(value).__name__, str(value))
    _update(digest, "\0".join(text).encode())
    return digest.digest()


def _update(digest: Any, data: bytes | memoryview) -> None:
    digest.update(len(data).to_bytes(8, "little"))  # lengths first: no two splits hash alike
    digest.update(data)


def arrays_nbytes(arrays: Arrays) -> int:
    """What an entry holds: its arrays' bytes (a BYTES array: its elements as Python objects,
    57 bytes each besides their bytes), plus its overhead."""
    total = ENTRY_OVERHEAD
    for array in arrays.values():
        if array.dtype == object:
            total += sum(len(x) for x in array.reshape(-1)) + 57 * array.size
        else:
            total += array.nbytes
    return total


class ResponseCache:
    """Answers a cached model's requests from `store`, or runs them (`run`) and keeps the
    outputs; entries past `entry_bytes` are not kept."""

    def __init__(self, store: CacheStore, execution: Execution, entry_bytes: int) -> None:
        self.store = store
        self.execution = execution
        self.entry_bytes = entry_bytes

    @staticmethod
    def tag(model: V2Model) -> bytes | None:
        """The version's digest when its answers may be cached (else None)."""
        entry = getattr(model, "entry", None)
        return getattr(entry, "cache_tag", None) if model.plan is None else None

    async def serve(self, work: InferWork[T], tag: bytes, held: Reservation, small: bool,
                    stats: ModelStatistics, run: Callable[[], Awaitable[T]]) -> T:  # fmt: skip
        """The request's answer: from the cache, or from `run` (which counts it) and kept; a
        traced one's lookup and insert stamped (Triton's trace has no names for them)."""
        arrived = time.perf_counter_ns()
        trace = work.trace
        try:
            await self.execution.run(Preparing(work), held, small)  # decoded once, kept for run
            looked = time.perf_counter_ns()
            key = cache_key(work.model, tag, work)
            arrays = await self.store.get(key)
            if trace is not None:
                trace.steps += [("CACHE_LOOKUP_START", looked)]
                trace.step("CACHE_LOOKUP_END")
            if arrays is not None:
                work.produced = arrays  # only encoded: InferWork._encoded
                answer = await self.execution.run(work, held, small)
                stats.cache_hit(arrived, time.perf_counter_ns() - looked)
                return answer
        except Exception as exc:
            stats.failed(arrived, exc)
            raise
        missed = time.perf_counter_ns() - looked
        answer = await run()  # counted there, a failure too; a failed answer is never kept
        stored = time.perf_counter_ns()
        outputs = work.produced if work.produced is not None else work.outputs
        if outputs is not None:
            nbytes = arrays_nbytes(outputs)
            if nbytes <= self.entry_bytes:
                if trace is not None:
                    trace.step("CACHE_INSERT_START")
                await self.store.put(key, {n: _owned(a) for n, a in outputs.items()}, nbytes)
                if trace is not None:
                    trace.step("CACHE_INSERT_END")
        stats.cache_miss(missed + time.perf_counter_ns() - stored)
        return answer


def _owned(array: np.ndarray) -> np.ndarray:
    """The array in memory of its own, read-only (an output may be a view of the request's
    body, which the entry must not keep alive; a hit must not change it)."""
    owned = array if array.flags.owndata and array.base is None else array.copy()
    owned.flags.writeable = False
    return owned


class LocalStore:
    """This process's entries, least recently used dropped first past `total_bytes`; each kept
    `seconds` at most. What they hold is kept in the memory budget: an entry the budget cannot
    take now is not kept. On the event loop only (no lock)."""

    def __init__(self, total_bytes: int, seconds: float, budget: MemoryBudget) -> None:
        self.total_bytes = total_bytes
        self.seconds = seconds
        self.budget = budget
        self.used = 0
        self.entries: OrderedDict[bytes, tuple[Arrays, int, float]] = OrderedDict()

    async def get(self, key: bytes) -> Arrays | None:
        found = self.entries.get(key)
        if found is None:
            return None
        if found[2] < time.monotonic():
            self._drop(key)
            return None
        self.entries.move_to_end(key)
        return found[0]

    async def put(self, key: bytes, arrays: Arrays, nbytes: int) -> None:
        if nbytes > self.total_bytes:
            return
        if key in self.entries:
            self._drop(key)
        while self.used + nbytes > self.total_bytes:
            self._drop(next(iter(self.entries)))
        if not self.budget.try_keep(nbytes, self.budget.total_bytes):
            return  # requests hold the budget now: they come first
        self.entries[key] = (arrays, nbytes, time.monotonic() + self.seconds)
        self.used += nbytes

    def _drop(self, key: bytes) -> None:
        _, nbytes, _ = self.entries.pop(key)
        self.used -= nbytes
        self.budget.unkeep(nbytes)

    def clear(self) -> None:
        """Drop every entry (the server stops)."""
        while self.entries:
            self._drop(next(iter(self.entries)))
