"""Whole-model execution: screening untrusted ModelProtos, planning and running graphs over the
kernels (or onnx.reference, when the fallback is on), and the model repository."""
