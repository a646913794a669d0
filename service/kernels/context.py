"""What a kernel may know of its caller: the output budget."""

import math
import time
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

import numpy as np

from service.codecs.dtypes import dtype_name, element_type, string_bytes
from service.codecs.wire import answer_bytes, answer_memory
from service.errors import InvalidInput, PayloadTooLarge, shown_int, shown_shape

MAX_RANK = 64  # numpy's NPY_MAXDIMS: np.empty refuses more axes with a bare ValueError


INLINE_JSON_ANSWER_BYTES = 512 * 1024
"""The most JSON answer text (as `answer_bytes` bounds it) an answer's outputs may take to be
encoded inline, on the event loop, a model's or an operator's: measured, orjson writes this
bound's worth of float16, float32 or float64 values in 1.8-2.7 ms, where a 1 MiB float16 output
(the inline allowance) took 29-45 ms, past the inline leash (a Tile call's 1 MiB of float32
held every other client's request 19-24 ms). A larger JSON answer is made on a thread, in
slices; binary and base64 answers are copies, and keep the inline allowance (but strings:
INLINE_STRINGS)."""
INLINE_STRINGS = 8192
"""The most string elements an answer's outputs may hold to be encoded inline in a binary or
base64 form (V2 binary data, tensor_proto, gRPC's contents): each is written by Python code,
one element at a time (numpy_helper.from_array made 131,072 empty strings into a TensorProto in
27-31 ms on the event loop, every other client's request waiting); 8,192 take about 2 ms. On a
thread such a loop lets the event loop in between (Python's switch interval). JSON's strings
are written by orjson in C, and its byte bound above holds them."""
JSON_FORMATS = ("json", "v2_json")


class MemoryClaims(Protocol):
    """What a kernel claims its memory from (service/core/memory_budget.Reservation)."""

    def claim(self, nbytes: int) -> None:
        """Claim `nbytes` before allocating them (may raise NeedMemory or 413)."""

    def unclaim(self, nbytes: int) -> None:
        """Give back a claim whose memory was freed (a graph's released intermediate)."""


class RunChecks(Protocol):
    """What stops a graph run between nodes (service/runtime/run_control.RunControl)."""

    fallback: Any  # the worker pool that runs graphs needing onnx.reference (or None)

    def check(self, node: str) -> None:
        """Raise if the run must stop before `node` (cancelled, or past its deadline)."""


class RunOffLoop(Exception):
    """Raised by `KernelContext.reserve` when an inline run would produce a large output.

    The caller runs the same (pure) kernel again on a worker thread, so large outputs
    never stall the event loop, while small requests skip the thread hop.
    """


class InlineAttempt:
    """When the event loop's current inline attempt began (core/execution.py sets it before
    each one). What may hold the loop for long inside an attempt (a run on onnxruntime) bounds
    the attempt as a whole by it, not its own run alone: an ensemble's steps all run in one
    attempt, and each step's quick run would otherwise add its own hold allowed to the loop's.
    One per loop: attempts run on the loop one at a time, start to end, so a plain attribute
    does."""

    __slots__ = ("started",)

    def __init__(self) -> None:
        self.started = time.perf_counter_ns()

    def begin(self) -> None:
        self.started = time.perf_counter_ns()

    def seconds(self) -> float:
        """How long the attempt has held the loop so far."""
        return (time.perf_counter_ns() - self.started) / 1e9


@dataclass(frozen=True)
class KernelContext:
    """Per-call limits: the output byte budget, how much may be produced inline, the element
    types the node's output may take, the limit on its encoded answer and the memory budget
    it must claim its share from before allocating."""

    max_output_bytes: int
    inline_bytes: int | None = None  # None: already off the event loop
    output_types: frozenset[str] | None = None  # canonical dtype names; None: unchecked
    output_param: str = "T"
    output_format: str | None = "json"  # None: an intermediate of a graph, never answered
    max_answer_bytes: int | None = None  # None: the encoded answer is not bounded
    one_piece_bytes: int | None = None  # the one step's: an answer that could take more is
    # not made here (RunOffLoop), but by the general path, which sends it in slices
    claims: MemoryClaims | None = None  # the request's reservation; None: unbudgeted
    control: RunChecks | None = None  # a graph run's deadline and stop signal; None: none
    attempt: InlineAttempt | None = None  # an inline attempt's start (None: not timed)

    variants: dict[tuple, "KernelContext"] = field(default_factory=dict, compare=False,
                                                   repr=False)  # fmt: skip
    """A shared inline context's variants (for_format, variant, for_output), each made once:
    building (or hashing) a context costs a small call more than the lookup."""

    def for_format(self, output_format: str | None) -> "KernelContext":
        """This context for answers in `output_format`."""
        if output_format == self.output_format:
            return self
        return self.variant(output_format=output_format)

    def variant(self, **changes: Any) -> "KernelContext":
        """This context with `changes`; a shared inline one (no claims, no run control) made
        once per variant, then reused."""
        return self._variant(tuple(changes.items()), changes)

    def for_output(self, types: frozenset[str], param: str) -> "KernelContext":
        """This context for a node whose output may take `types` (type parameter `param`),
        without run control (a kernel's own), as `variant` makes it: on every node run, so
        keyed by the frozenset, whose hash is cached, rather than by variant's items."""
        changes = {"output_types": types, "output_param": param, "control": None}
        return self._variant((types, param), changes)

    def _variant(self, key: tuple, changes: dict[str, Any]) -> "KernelContext":
        if self.claims is not None or self.control is not None:
            return replace(self, **changes, variants={})
        found = self.variants.get(key)
        if found is None:
            found = self.variants[key] = replace(self, **changes, variants={})
        return found

    def reserve(
        self,
        shape: tuple[int, ...] | list[int],
        dtype: np.dtype,
        what: str = "output",
        loc: tuple = (),
        payload_bytes: int = 0,
    ) -> None:
        """Refuse (413) an output over budget, or (422) one numpy cannot hold, before it is
        allocated. `payload_bytes` adds what the elements point to (the UTF-8 of strings).
        The answer's encoded bytes are bounded too (413 over `max_answer_bytes`), and off
        the event loop the output and its encoding are claimed from the memory budget (which
        may wait, then 503).

        Zero dimensions count as 1, as in `Limits.check_shape`: numpy sizes an empty array by
        its other dimensions too, and refuses (0, 2**62, 2**62) as too big.
        """
        if len(shape) > MAX_RANK:
            raise InvalidInput(
                f"{what} would have rank {len(shape)}, over the limit of {MAX_RANK}", loc=loc
            )
        span = 1
        for dim in shape:
            if dim < 0:
                raise InvalidInput(f"{what} would have a negative dimension", loc=loc)
            span *= int(dim) or 1
        dtype = np.dtype(dtype)
        nbytes = span * dtype.itemsize + payload_bytes  # itemsize 8 for strings: the pointers
        if nbytes > self.max_output_bytes:
            raise PayloadTooLarge(
                f"{what} of shape {shown_shape(shape)} and {dtype_name(dtype)} would take "
                f"{shown_int(nbytes)} bytes, over the limit of {self.max_output_bytes}",
                loc=loc,
            )
        # No element type writes more than 17 answer bytes per tensor byte (a float8 as JSON):
        # below that, the answer limit cannot be reached and its exact bound is not worked out.
        rough = 17 * nbytes + 6 * payload_bytes + 11 * len(shape) + 1024
        if self.output_format is None:  # an intermediate: held while the graph runs, not answered
            if self.claims is not None:
                self.claims.claim(nbytes)
            elif self.inline_bytes is not None and nbytes > self.inline_bytes:
                raise RunOffLoop
        elif (
            self.claims is not None
            or (self.max_answer_bytes is not None and rough > self.max_answer_bytes)
            or (self.one_piece_bytes is not None and rough > self.one_piece_bytes)
            or (self.inline_bytes is not None and rough > INLINE_JSON_ANSWER_BYTES)
        ):
            self._answer(shape, dtype, what, loc, payload_bytes, nbytes)
        elif self.inline_bytes is not None and nbytes > self.inline_bytes:
            raise RunOffLoop

    def _answer(
        self, shape: tuple[int, ...] | list[int], dtype: np.dtype, what: str, loc: tuple,
        payload: int, nbytes: int,
    ) -> None:  # fmt: skip
        et = element_type(dtype_name(dtype))
        count, fmt = math.prod(int(dim) for dim in shape), self.output_format
        assert fmt is not None
        encoded = answer_bytes(et, count, len(shape), payload, fmt)  # type: ignore[arg-type]
        if self.max_answer_bytes is not None and encoded > self.max_answer_bytes:
            raise PayloadTooLarge(
                f"{what} of shape {shown_shape(shape)} and {et.name} could take {shown_int(encoded)}"
                f" bytes as {fmt}, over the answer limit of {self.max_answer_bytes} bytes "
                "(OPSERVE_MAX_ANSWER_BYTES)",
                loc=loc,
            )
        if self.inline_bytes is not None and (nbytes > self.inline_bytes
                                              or _long_inline(encoded, fmt, count if et.is_string else 0)):  # fmt: skip
            raise RunOffLoop
        if self.one_piece_bytes is not None and encoded > self.one_piece_bytes:
            raise RunOffLoop
        if self.claims is not None:
            self.claims.claim(nbytes + answer_memory(et, count, len(shape), payload, fmt))  # type: ignore[arg-type]

    def check_answer(self, *arrays: np.ndarray, what: str = "the output") -> None:
        """Bound (413 over `max_answer_bytes`, all of them together) and claim the answer of
        arrays made without `reserve` (a graph's outputs and trace): their own memory was
        claimed when they were made."""
        if self.output_format is None:
            return
        fmt: Any = self.output_format
        encoded = memory = strings = 0
        for array in arrays:
            et = element_type(dtype_name(array.dtype))
            payload = 0
            if et.is_string:
                payload = sum(string_bytes(text) for text in array.reshape(-1))
            strings += array.size if et.is_string else 0
            encoded += answer_bytes(et, array.size, array.ndim, payload, fmt)
            memory += answer_memory(et, array.size, array.ndim, payload, fmt)
        if self.max_answer_bytes is not None and encoded > self.max_answer_bytes:
            shape = f" of shape {shown_shape(arrays[0].shape)}" if len(arrays) == 1 else ""
            raise PayloadTooLarge(
                f"{what}{shape} takes {shown_int(encoded)} bytes as {self.output_format}, "
                f"over the answer limit of {self.max_answer_bytes} bytes "
                "(OPSERVE_MAX_ANSWER_BYTES)"
            )
        if self.inline_bytes is not None and _long_inline(encoded, fmt, strings):
            raise RunOffLoop  # too long to write on the event loop: a thread makes it
        if self.claims is not None:
            self.claims.claim(memory)

    def check_output_type(self, dtype: np.dtype, loc: tuple) -> None:
        """Refuse, before anything is allocated, an output type the version does not allow
        (e.g. a bfloat16 ConstantOfShape `value` at version 9), naming the field that chose it."""
        name = dtype_name(np.dtype(dtype))
        if self.output_types is not None and name not in self.output_types:
            allowed = ", ".join(sorted(self.output_types))
            raise InvalidInput(
                f"the output cannot be {name} (type {self.output_param} allows: {allowed})",
                loc=loc,
            )


def _long_inline(encoded: int, fmt: str, strings: int) -> bool:
    """Whether an answer of `encoded` bytes at most in `fmt`, `strings` of its elements
    strings, is too long to write on the event loop: JSON past INLINE_JSON_ANSWER_BYTES,
    strings in another form past INLINE_STRINGS."""
    if fmt in JSON_FORMATS:
        return encoded > INLINE_JSON_ANSWER_BYTES
    return strings > INLINE_STRINGS
