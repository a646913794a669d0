"""Whole-model execution: screening untrusted ModelProtos, planning and running graphs over the
kernels (or onnx.reference, when the fallback is on: the exact engine), the model repository,
and Triton's model configuration (config/). The onnxruntime engine and the isolated worker
processes are in service/engines/."""
