"""Settings: read once, from CTXSTORE_* variables, validated."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest

import ctxstore.embedded
from ctxstore import ConfigurationError, EmbeddedRedis, Settings


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
    """Values that cannot work are refused at construction, naming the variable to fix."""
    with pytest.raises(ConfigurationError, match=f"CTXSTORE_{field.upper()}"):
        Settings(**{field: value})


def test_a_bad_environment_variable_is_named_not_echoed(monkeypatch: pytest.MonkeyPatch) -> None:
    """A bad CTXSTORE_* value raises ConfigurationError naming the variable, not its value."""
    monkeypatch.setenv("CTXSTORE_RETRY_ATTEMPTS", "lots-secret")
    monkeypatch.setenv("CTXSTORE_REDIS_URL", "redis://example:6379/0")
    with pytest.raises(ConfigurationError) as refused:
        Settings()
    assert "CTXSTORE_RETRY_ATTEMPTS" in str(refused.value)
    assert "lots-secret" not in str(refused.value)
    assert isinstance(refused.value, ValueError)  # as pydantic's error was


# With no Redis URL configured, the store runs an embedded Redis (ctxstore.embedded).


def test_embedded_redis_that_cannot_start_leaves_no_directory(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """No binary, or one that cannot run: ConfigurationError, and no temporary directory left."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    with pytest.raises(ConfigurationError, match="cannot run redis-server"):
        EmbeddedRedis(binary=str(tmp_path / "no-such-redis-server")).start()
    assert list(tmp_path.iterdir()) == []

    def no_binary() -> str:
        raise ConfigurationError("no redis-server binary was found")

    monkeypatch.setattr(ctxstore.embedded, "redis_server_binary", no_binary)
    with pytest.raises(ConfigurationError, match="no redis-server"):
        EmbeddedRedis().start()
    assert list(tmp_path.iterdir()) == []
