"""Whole-model execution: screening untrusted ModelProtos, planning and running graphs over the
kernels (or onnx.reference, when the fallback is on), the model repository, and Triton's model
configuration (config_files, model_config, config_checks, config_graph, config_json, config_io)."""
