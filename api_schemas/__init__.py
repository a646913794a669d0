"""The wire contract of opserve: Pydantic models of every request and response.

This package imports only pydantic and the standard library, so a client service can
depend on it without pulling in the server, numpy or onnx.
"""

from api_schemas.tensors import DTYPE_NAMES, JsonTensor, ProtoTensor, Tensor

__all__ = ["DTYPE_NAMES", "JsonTensor", "ProtoTensor", "Tensor"]
