"""Trace files read as Triton's trace tool reads them, for the tests: what Triton's
qa/common/trace_summary.py (github.com/triton-inference-server/server) computes, re-derived
from its documented behaviour, returned as figures rather than printed.

- A request's objects share its `id`; their timestamps are merged, and its model is the one
  an object names. A request belongs to a door when a stamp carries the door's first name
  (HTTP_RECV_START, GRPC_WAITREAD_START); only requests with REQUEST_START and REQUEST_END
  count, per model and version.
- The spans, averaged in microseconds: HTTP's infer request from HTTP_RECV_START to
  HTTP_SEND_END, its receive and send; gRPC's infer request from GRPC_WAITREAD_END to
  GRPC_SEND_END, and its send; the handler (REQUEST_START to REQUEST_END); queue
  (QUEUE_START to COMPUTE_START) and compute (COMPUTE_START to COMPUTE_END) where both ends
  are there (a cache hit has neither), and compute's input, infer and output parts. A span
  whose end comes before its start is an error, as the tool raises one.
- A TENSORS record's tensor: comma-separated values of its `dtype` (BYTES as CSV), reshaped
  to its `shape`.
"""

import csv
from collections.abc import Iterable
from typing import Any

import numpy as np

FIRST_STAMP = {"HTTP": "HTTP_RECV_START", "GRPC": "GRPC_WAITREAD_START"}
DOOR_SPANS = {
    "HTTP": {"infer request": ("HTTP_RECV_START", "HTTP_SEND_END"),
             "receive": ("HTTP_RECV_START", "HTTP_RECV_END"),
             "send": ("HTTP_SEND_START", "HTTP_SEND_END")},
    "GRPC": {"infer request": ("GRPC_WAITREAD_END", "GRPC_SEND_END"),
             "send": ("GRPC_SEND_START", "GRPC_SEND_END")},
}  # fmt: skip
CORE_SPANS = {"handler": ("REQUEST_START", "REQUEST_END"),
              "queue": ("QUEUE_START", "COMPUTE_START"),
              "compute": ("COMPUTE_START", "COMPUTE_END"),
              "input": ("COMPUTE_START", "COMPUTE_INPUT_END"),
              "infer": ("COMPUTE_INPUT_END", "COMPUTE_OUTPUT_START"),
              "output": ("COMPUTE_OUTPUT_START", "COMPUTE_END")}  # fmt: skip
NUMPY = {"BOOL": np.bool_, "UINT8": np.uint8, "UINT16": np.uint16, "UINT32": np.uint32,
         "UINT64": np.uint64, "INT8": np.int8, "INT16": np.int16, "INT32": np.int32,
         "INT64": np.int64, "FP16": np.float16, "FP32": np.float32, "FP64": np.float64,
         "BYTES": np.object_}  # fmt: skip

Summary = dict[str, float]


def summaries(objects: Iterable[dict[str, Any]], door: str) -> dict[tuple[str, int], Summary]:
    """Per (model, version): "count" and each span's average in microseconds, for the requests
    of `door` ("HTTP" or "GRPC")."""
    requests: dict[int, dict[str, Any]] = {}
    for entry in objects:
        if "id" not in entry:
            continue
        request = requests.setdefault(entry["id"], {"stamps": {}})
        for key in ("model_name", "model_version"):
            if key in entry:
                request[key] = entry[key]
        for stamp in entry.get("timestamps", []):
            request["stamps"][stamp["name"]] = stamp["ns"]
    totals: dict[tuple[str, int], dict[str, float]] = {}
    for request in requests.values():
        stamps = request["stamps"]
        if not any(FIRST_STAMP[door] in name for name in stamps):
            continue
        if "REQUEST_START" not in stamps or "REQUEST_END" not in stamps:
            continue
        total = totals.setdefault((request["model_name"], request["model_version"]), {})
        total["count"] = total.get("count", 0) + 1
        for span, (start, end) in {**DOOR_SPANS[door], **CORE_SPANS}.items():
            if start in stamps and end in stamps:
                if stamps[end] < stamps[start]:
                    raise ValueError(f"{end} before {start}: {stamps}")
                total[span] = total.get(span, 0) + stamps[end] - stamps[start]
    return {key: {span: value if span == "count" else value / total["count"] / 1000
                  for span, value in total.items()}
            for key, total in totals.items()}  # fmt: skip


def tensor_array(record: dict[str, Any]) -> np.ndarray:
    """A TENSORS record's tensor as an array."""
    dtype = NUMPY[record["dtype"]]
    if dtype is np.object_:
        values: list[Any] = next(csv.reader([record["data"]], skipinitialspace=True))
    else:
        values = [float(item) for item in record["data"].split(",")] if record["data"] else []
    shape = [int(size) for size in record["shape"].split(",")]
    return np.array(values, dtype=dtype).reshape(shape)
