"""opserve: ONNX operators as a service."""
