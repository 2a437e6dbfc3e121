"""The ``ctxstore`` command line: bad flags are refused clearly, and nothing is written."""

from __future__ import annotations

import asyncio

import pytest
from conftest import RUN_PREFIX

from ctxstore import ContextStore, TenantLimits
from ctxstore.cli import main


@pytest.fixture(autouse=True)
def _store_env(monkeypatch: pytest.MonkeyPatch, redis_url: str) -> None:
    """The command reads its settings from the environment: the test Redis and prefix."""
    monkeypatch.setenv("CTXSTORE_REDIS_URL", redis_url)
    monkeypatch.setenv("CTXSTORE_KEY_PREFIX", RUN_PREFIX)
    monkeypatch.setenv("CTXSTORE_QUEUE_NAME", f"{RUN_PREFIX}:summaries")


async def test_limits_sets_integers_and_rates(store: ContextStore) -> None:
    """Whole numbers for the integer fields, a decimal for the rate; the rest is kept."""
    await store.set_limits(TenantLimits(ttl_seconds=3600))
    argv = ["limits", "--tenant", store.tenant, "--sessions", "3", "--appends-per-second", "2.5"]
    assert await _run(argv) == 0
    assert await store.limits() == TenantLimits(
        sessions=3, appends_per_second=2.5, ttl_seconds=3600
    )


@pytest.mark.parametrize("value", ["2.7", "2.0", "inf", "nan", "1e3", "two"])
async def test_limits_refuses_a_non_integer_for_an_integer_field(
    store: ContextStore, value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--sessions 2.7` is refused (it was stored as 2), with argparse's exit status 2."""
    before = await store.limits()
    with pytest.raises(SystemExit) as exited:
        await _run(["limits", "--tenant", store.tenant, "--sessions", value])
    assert exited.value.code == 2
    assert "--sessions: must be a whole number" in capsys.readouterr().err
    assert await store.limits() == before


@pytest.mark.parametrize(
    ("flag", "value"),
    [
        ("--sessions", "0"),
        ("--sessions", "-4"),
        ("--message-bytes", str(2**53)),
        ("--ttl-seconds", str(10**12)),
        ("--appends-per-second", "inf"),
        ("--appends-per-second", "nan"),
        ("--appends-per-second", "0"),
    ],
)
async def test_limits_out_of_range_is_a_clear_error_not_a_traceback(
    store: ContextStore, flag: str, value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """A value the limits refuse exits 2 with one line naming the flag; nothing is written."""
    await store.set_limits(TenantLimits(sessions=5))
    argv = ["limits", "--tenant", store.tenant, "--append-burst", "9", flag, value]
    assert await _run(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("ctxstore: invalid limits: " + flag + ":")
    assert "Traceback" not in err and "--append-burst" not in err
    assert await store.limits() == TenantLimits(sessions=5)


async def _run(argv: list[str]) -> int:
    """main() in a thread: it runs its own event loop."""
    return await asyncio.to_thread(main, argv)
