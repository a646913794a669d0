"""Schemathesis over the OpenAPI document, in-process: requests generated from the schema
(valid and invalid) never get a 5xx, and every response conforms to the documented schema."""

from collections import Counter

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import (
    positive_data_acceptance,
)

from service.main import create_app
from service.settings import Settings

schema = schemathesis.openapi.from_asgi("/openapi.json", create_app(Settings()))

# A schema-valid body may still break a type constraint or an operator rule: 422 by design.
EXCLUDED = [positive_data_acceptance]
CALLS: Counter[str] = Counter()


@schema.parametrize()
@settings(max_examples=12, deadline=None, suppress_health_check=list(HealthCheck))
def test_generated_requests(case: schemathesis.Case) -> None:
    CALLS[f"{case.operation.method.upper()} {case.operation.path}"] += 1
    response = case.call_and_validate(excluded_checks=EXCLUDED)
    assert response.status_code < 500


def test_a_few_hundred_requests_covered_every_operation() -> None:
    operations = {f"{r.ok().method.upper()} {r.ok().path}" for r in schema.get_all_operations()}
    if set(CALLS) != operations:
        pytest.skip("runs after the whole generated set, in the same process")
    print(f"schemathesis: {sum(CALLS.values())} requests over {len(CALLS)} operations")
    assert sum(CALLS.values()) >= 300, CALLS
