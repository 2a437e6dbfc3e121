"""The ``ctxstore`` command run in-process, on settings read from its environment."""

from __future__ import annotations

import asyncio
import json
import os
from typing import Any

import pytest

from ctxstore import Settings
from ctxstore.cli import main


def use_settings(monkeypatch: pytest.MonkeyPatch, settings: Settings, **extra: str) -> None:
    """Make the command read exactly these settings (and ``extra`` variables) from its env."""
    for name in [n for n in os.environ if n.startswith("CTXSTORE_")]:
        monkeypatch.delenv(name)
    assert settings.redis_url is not None
    values = {
        "CTXSTORE_REDIS_URL": settings.redis_url,
        "CTXSTORE_KEY_PREFIX": settings.key_prefix,
        "CTXSTORE_QUEUE_NAME": settings.queue_name,
        "CTXSTORE_SUMMARY_TRIGGER_TOKENS": str(settings.summary_trigger_tokens),
        "CTXSTORE_SUMMARY_KEEP_TOKENS": str(settings.summary_keep_tokens),
        **extra,
    }
    for name, value in values.items():
        monkeypatch.setenv(name, value)


async def run_cli(argv: list[str]) -> int:
    """main() in a thread: it runs its own event loop."""
    return await asyncio.to_thread(main, argv)


async def run_json(argv: list[str], capsys: pytest.CaptureFixture[str]) -> Any:
    """Run a command with --json; its output, parsed."""
    assert await run_cli([*argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def one_line(err: str) -> str:
    """The single line of an error report (fails if there are more, or a traceback)."""
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert "Traceback" not in err
    assert lines[0].startswith("ctxstore: "), err
    return lines[0]
