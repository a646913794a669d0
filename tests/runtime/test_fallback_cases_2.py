"""Shard 2 of the onnx backend node cases through `POST /v1/models/run` with the reference
fallback on (see fallback_cases.py: what onnx.reference passes in-process passes here too)."""

from tests.runtime.fallback_cases import shard_tests

client, test_backend_case_with_fallback, test_most_of_the_shard_matched = shard_tests(2)
