"""The test suite (a package, so that tests/grpc/ does not shadow the grpc module)."""
