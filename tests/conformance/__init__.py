"""Conformance of the kernels: onnx backend cases and differential oracles (a package, so its
module names cannot clash with other tests')."""
