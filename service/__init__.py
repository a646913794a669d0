"""opserve: ONNX operators as a service."""

__version__ = "0.1.0"
