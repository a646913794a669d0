"""Apps built by the tests keep no access log: its lines would only clutter the test output
(tests/api/test_access_log.py tests the log itself); and serve no gRPC unless a test gives
them a port (two apps of parallel tests would both bind 8001)."""

import os

os.environ.setdefault("OPSERVE_ACCESS_LOG", "false")
os.environ.setdefault("OPSERVE_GRPC_PORT", "0")
