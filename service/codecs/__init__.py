"""Codecs: wire tensors (JSON, TensorProto, V2) <-> numpy arrays."""
