"""Apps built by the tests keep no access log: its lines would only clutter the test output
(tests/api/test_access_log.py tests the log itself)."""

import os

os.environ.setdefault("OPSERVE_ACCESS_LOG", "false")
