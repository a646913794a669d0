"""A trace's records in Triton's JSON form (its tracer.cc), which its qa/common/trace_summary.py
reads: one object per timestamp, `{"id":N,"timestamps":[{"name":...,"ns":...}]}`, in the order
they happened; the model's `{"id":N,"model_name":...,"model_version":V}` (and "request_id" when
the request has one) just before REQUEST_START; at the TENSORS level one object per tensor,
`{"id":N,"activity":"TENSOR_QUEUE_INPUT","tensor":{"name","data","shape","dtype"}}` (the
inputs, as the request is queued) and TENSOR_BACKEND_OUTPUT (the outputs answered).

A tensor's "data" is its elements as text, comma-separated (BYTES elements each in double
quotes), and never more than `limit` bytes of the tensor (OPSERVE_TRACE_TENSOR_BYTES): a longer
one is cut to its first elements, "shape" then the count written, with "truncated": true and
its "full_shape" (so trace_summary.py can still reshape what it reads)."""

from typing import Any

import numpy as np
import orjson

from service.codecs.dtypes import element_type_of
from service.codecs.v2_types import datatype_of
from service.core.statistics import Timings
from service.core.trace_context import Stamps

Arrays = dict[str, np.ndarray]


def core_stamps(timings: Timings, start: int, end: int, steps: Stamps) -> Stamps:
    """The core's stamps of a request it took at `start` and was done with at `end`
    (perf_counter_ns): Triton's REQUEST_START to REQUEST_END, COMPUTE_* from `timings` when
    the model ran (not on a cache hit), and the core's other `steps`, in time order."""
    within: Stamps = [(name, min(max(ns, start), end)) for name, ns in steps]
    if timings.started:
        began = min(max(timings.started, start), end)
        # COMPUTE_* are the run's start plus its measured parts, which may count a moment the
        # core spent after the run (a busy host put COMPUTE_END past CACHE_INSERT_START): no
        # part reaches past the core's next own step (the cache's insert), nor the end
        last = min((ns for _, ns in within if ns > began), default=end)
        input_end = min(began + timings.compute_input, last)
        output_start = min(input_end + timings.compute_infer, last)
        within += [("COMPUTE_START", began), ("COMPUTE_INPUT_END", input_end),
                   ("COMPUTE_OUTPUT_START", output_start),
                   ("COMPUTE_END", min(output_start + timings.compute_output, last))]  # fmt: skip
    within.sort(key=lambda stamp: stamp[1])  # stable: equal times keep their order
    return [("REQUEST_START", start), ("QUEUE_START", start), *within, ("REQUEST_END", end)]


def head(trace_id: int, name: str, version: str, request_id: str | None) -> dict[str, Any]:
    """The object naming a trace's model (Triton's, at REQUEST_START)."""
    found: dict[str, Any] = {"id": trace_id, "model_name": name,
                             "model_version": int(version) if version.isdigit() else version}  # fmt: skip
    if request_id:
        found["request_id"] = request_id
    return found


def stamp_objects(trace_id: int, stamps: Stamps) -> list[bytes]:
    """One object per timestamp, as Triton writes them."""
    return [b'{"id":%d,"timestamps":[{"name":"%s","ns":%d}]}' % (trace_id, name.encode(), ns)
            for name, ns in stamps]  # fmt: skip


def tensor_objects(trace_id: int, activity: str, arrays: Arrays | None, limit: int) -> list[bytes]:
    """One object per tensor of `arrays`, its data cut to `limit` bytes."""
    if not arrays:
        return []
    return [orjson.dumps({"id": trace_id, "activity": activity,
                          "tensor": tensor(name, array, limit)})
            for name, array in arrays.items()]  # fmt: skip


def tensor(name: str, array: np.ndarray, limit: int) -> dict[str, Any]:
    """A tensor as Triton's record has it: name, data, shape and dtype as text."""
    flat = array.reshape(-1)
    if array.dtype == object:
        data, count = _strings(flat, limit)
    else:
        count = min(flat.size, limit // max(array.itemsize, 1))
        part = flat[:count]
        if part.dtype == np.bool_:
            part = part.view(np.uint8)  # Triton writes 1 and 0
        values = part.tolist() if part.dtype.kind in "iu" else part
        data = ",".join(map(str, values))
    shape = ",".join(map(str, array.shape))
    found: dict[str, Any] = {"name": name, "data": data, "shape": shape,
                             "dtype": datatype_of(element_type_of(array))}  # fmt: skip
    if count < flat.size:
        found |= {"shape": str(count), "truncated": True, "full_shape": shape}
    return found


def _strings(flat: np.ndarray, limit: int) -> tuple[str, int]:
    """BYTES elements in double quotes (a quote within doubled, as CSV reads it), as many as
    `limit` bytes of them hold."""
    texts, used = [], 0
    for element in flat:
        raw = element if isinstance(element, bytes) else str(element).encode()
        used += len(raw)
        if used > limit:
            break
        texts.append('"' + raw.decode("utf-8", "backslashreplace").replace('"', '""') + '"')
    return ",".join(texts), len(texts)
