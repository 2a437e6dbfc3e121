"""Settings: read once, from CTXSTORE_* variables, validated."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from ctxstore import Settings


def test_environment_is_read_when_called(monkeypatch: pytest.MonkeyPatch) -> None:
    """Settings() reads CTXSTORE_* variables, dicts as JSON."""
    monkeypatch.setenv("CTXSTORE_REDIS_URL", "redis://example:6380/2")
    monkeypatch.setenv("CTXSTORE_DEFAULT_TOKEN_BUDGET", "1234")
    monkeypatch.setenv("CTXSTORE_TOKEN_SAFETY_FACTORS", '{"claude": 1.3}')
    settings = Settings()
    assert settings.redis_url == "redis://example:6380/2"
    assert settings.default_token_budget == 1234
    assert settings.token_safety_factors == {"claude": 1.3}


def test_from_url() -> None:
    """from_url sets the URL and keeps other fields."""
    settings = Settings.from_url("redis://h:1/0", tenant="acme")
    assert (settings.redis_url, settings.tenant) == ("redis://h:1/0", "acme")


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("key_prefix", "bad{prefix"),
        ("tenant", "a:b"),
        ("default_token_budget", 0),
        ("max_message_bytes", -1),
        ("token_safety_factors", {"claude": 0.5}),
        ("retry_attempts", 1000),
    ],
)
def test_invalid_settings_are_refused(field: str, value: object) -> None:
    """Values that cannot work are refused at construction."""
    with pytest.raises(ValidationError):
        Settings(**{field: value})  # type: ignore[arg-type]
