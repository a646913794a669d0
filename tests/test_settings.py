"""Settings: the OPSERVE_ prefix, a description per field, finite limits."""

import pytest
from pydantic import ValidationError

from service.settings import Settings

LIMITS = ["max_request_bytes", "max_output_bytes", "max_elements", "max_string_bytes",
          "max_json_depth"]  # fmt: skip


def test_every_field_is_documented() -> None:
    for name, field in Settings.model_fields.items():
        assert field.description, f"{name} has no docstring"


@pytest.mark.parametrize("name", LIMITS)
def test_limits_have_finite_defaults(name: str) -> None:
    value = getattr(Settings(), name)
    assert isinstance(value, int) and 0 < value < 2**40


def test_environment_prefix(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPSERVE_PORT", "9123")
    monkeypatch.setenv("OPSERVE_MAX_REQUEST_BYTES", "2048")
    monkeypatch.setenv("PORT", "1")
    settings = Settings()
    assert (settings.port, settings.max_request_bytes) == (9123, 2048)


def test_nonsense_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPSERVE_MAX_REQUEST_BYTES", "-5")
    with pytest.raises(ValidationError):
        Settings()
