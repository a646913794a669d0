"""A V2 infer call in tritonclient.http's binary form (binary inputs, one binary output), its
body made by tritonclient itself, for the test client's `post`; and that answer's output."""

from typing import Any

import numpy as np
import tritonclient.http as httpclient
from tritonclient.utils import np_to_triton_dtype


def binary_call(inputs: dict[str, np.ndarray], output: str,
                accept: str | None = "gzip") -> dict[str, Any]:  # fmt: skip
    """`post`'s keyword arguments for a call of `inputs` asking for `output` as binary data,
    with `Accept-Encoding: accept` (none when None)."""
    items = []
    for name, array in inputs.items():
        item = httpclient.InferInput(name, list(array.shape), np_to_triton_dtype(array.dtype))
        item.set_data_from_numpy(array, binary_data=True)
        items.append(item)
    wanted = [httpclient.InferRequestedOutput(output, binary_data=True)]
    body, json_length = httpclient.InferenceServerClient.generate_request_body(items, wanted)
    headers = {"Inference-Header-Content-Length": str(json_length)}
    if accept is not None:
        headers["Accept-Encoding"] = accept
    return {"content": body, "headers": headers}


def binary_output(answer: Any, dtype: type = np.float32) -> np.ndarray:
    """The one binary output of an answer (an httpx response, inflated by httpx)."""
    length = int(answer.headers["inference-header-content-length"])
    return np.frombuffer(answer.content[length:], dtype)
