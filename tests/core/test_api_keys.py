"""The API-key rule both doors keep (service/core/api_keys.py), value by value."""

import pytest

from service.core.api_keys import authorized, parse_keys

KEYS = parse_keys(" alpha, ,beta-2 ,")


def test_the_setting_names_its_keys_without_blanks() -> None:
    assert KEYS == (b"alpha", b"beta-2")
    assert parse_keys("") == () and parse_keys(" , ") == ()


@pytest.mark.parametrize(("value", "expected"), [
    (b"Bearer alpha", True), (b"bearer beta-2", True), (b"BEARER alpha", True),
    (b"Bearer  alpha ", True),  # spaces around the token are not part of it
    (b"Bearer alph", False), (b"Bearer alphaa", False), (b"Bearer ", False), (b"Bearer", False),
    (b"Basic alpha", False), (b"alpha", False), (b"", False), (b"Bearer alpha,beta-2", False),
    (b"Bearer \xffalpha", False),
])  # fmt: skip
def test_an_authorization_value_carries_a_key_or_not(value: bytes, expected: bool) -> None:
    assert authorized(value, KEYS) is expected


def test_no_keys_authorize_nothing() -> None:
    assert not authorized(b"Bearer ", ()) and not authorized(b"Bearer alpha", ())
