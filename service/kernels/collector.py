"""Python's cyclic garbage collector, kept off what start-up made.

A full collection walks every object the collector tracks, with the interpreter's lock held,
on whichever thread the collection falls: measured on a started server (Triton's example
repository loaded, the OpenAPI document built), 106,000 objects took 77-82 ms a collection,
the operators' schemas, onnx, pydantic and FastAPI's routes among them, and every other
request waited that long. A review's probe found two ways a client brings one on: the heap
trim's collection about 1 s after any large request (48-60 ms), and the full collections the
interpreter starts itself when refused requests leave cyclic garbage (a gRPC call of 2,500
one-element inputs, answered INVALID_ARGUMENT, ten times: 66-96 ms).

So once start-up is done, what exists is collected and frozen (gc.freeze, OPSERVE_GC_FREEZE):
full collections then walk only what came after (0.0 ms on that server). A frozen object is
never collected as cyclic garbage; one outside any cycle is freed by its reference count,
frozen or not. What start-up made lives as long as the process, but for the repository's
models: when a version is freed (unloaded, or replaced by a new load), everything frozen is
given back to the collector, collected and frozen again (`refreeze`), where a thaw for good
brought back the long collections after every large request (a review's probe: 36-44 ms after
one load). It is one full collection (about 80 ms) on a timer's thread REFREEZE_SECONDS after
the first version freed, for all those freed meanwhile: an unload of a model with a thousand
versions would otherwise have cost a thousand.
"""

import gc
import threading

REFREEZE_SECONDS = 0.5
_pending: threading.Timer | None = None  # the refreeze to come, if any
_frozen = False  # whether freeze_start_up ran (gc.get_freeze_count() walks every frozen
# object: 4 ms for 500,000 of them, too slow to ask at each version freed)
_lock = threading.Lock()


def freeze_start_up() -> None:
    """Collect what start-up left as garbage, then freeze what is left."""
    global _frozen
    gc.collect()
    gc.freeze()
    _frozen = True


def refreeze() -> None:
    """In REFREEZE_SECONDS, once for every call until then: give what was frozen back to the
    collector (a model made at start-up may now be garbage held in a cycle), collect, and
    freeze what is left. Nothing when nothing is frozen (OPSERVE_GC_FREEZE off)."""
    global _pending
    if not _frozen:
        return
    with _lock:
        if _pending is None:
            _pending = threading.Timer(REFREEZE_SECONDS, _refreeze_now)
            _pending.daemon = True  # never holds the process's exit
            _pending.start()


def _refreeze_now() -> None:
    global _pending
    with _lock:
        _pending = None
    gc.unfreeze()
    freeze_start_up()
