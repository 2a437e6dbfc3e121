"""Exit statuses: one table, the README's, the same for every command.

1 when what a command names is not there (a session, a checkpoint, a tenant)
or what it asked for did not happen; 2 when it could not run (usage, input,
a setting, the server). Commands run in-process against the test Redis,
except the worker, which runs as the process an operator starts.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from support.cli import one_line, run_cli, use_settings
from support.config import REPO
from support.helpers import turn

from ctxstore import (
    BudgetExceededError,
    ConfigurationError,
    ConflictError,
    ContextStore,
    CtxstoreError,
    EntryNotFoundError,
    ForgetIncompleteError,
    InvalidIdError,
    InvalidInputError,
    MalformedArchiveError,
    MessageTooLargeError,
    PermissionDeniedError,
    QuotaExceededError,
    SessionExistsError,
    SessionNotFoundError,
    Settings,
    StoreError,
    StoreUnavailableError,
    TenantLimits,
)
from ctxstore._cli.exits import ExitStatus, status_of
from ctxstore.testing import free_port

CTXSTORE = str(Path(sys.executable).with_name("ctxstore"))


@pytest.fixture(autouse=True)
def _store_env(monkeypatch: pytest.MonkeyPatch, settings: Settings) -> None:
    """The command reads its settings from the environment: the test Redis and prefix."""
    use_settings(monkeypatch, settings)


def readme_table() -> dict[int, str]:
    """The README's exit status table: status -> what it means."""
    text = (REPO / "README.md").read_text()
    rows = re.findall(r"^\| (\d+) \| ([^|]+) \|", text, re.MULTILINE)
    return {int(status): meaning.strip() for status, meaning in rows}


def test_the_readme_table_lists_every_exit_status_and_no_other() -> None:
    """The README's table has a row for each ExitStatus, and only those."""
    assert sorted(readme_table()) == sorted(int(status) for status in ExitStatus)


@pytest.mark.parametrize(
    ("error", "status"),
    [
        (SessionNotFoundError("no such session"), ExitStatus.FAILED),
        (EntryNotFoundError("no checkpoint cp-9"), ExitStatus.FAILED),
        (SessionExistsError("exists"), ExitStatus.FAILED),
        (ConflictError(3, 4), ExitStatus.FAILED),
        (QuotaExceededError("sessions", 1, 2), ExitStatus.FAILED),
        (BudgetExceededError(100, 200), ExitStatus.FAILED),
        (StoreError("refused"), ExitStatus.FAILED),
        (CtxstoreError("nothing to forget"), ExitStatus.FAILED),
        (ConfigurationError("bad URL"), ExitStatus.CANNOT_RUN),
        (InvalidInputError("bad flag"), ExitStatus.CANNOT_RUN),
        (InvalidIdError("bad id"), ExitStatus.CANNOT_RUN),
        (MalformedArchiveError(3, "bad"), ExitStatus.CANNOT_RUN),
        (MessageTooLargeError(2_000, 1_000), ExitStatus.CANNOT_RUN),
        (StoreUnavailableError("no answer"), ExitStatus.CANNOT_RUN),
        (PermissionDeniedError("NOPERM"), ExitStatus.CANNOT_RUN),
        (ForgetIncompleteError(2, ("its limits",), tenant="t"), ExitStatus.CANNOT_RUN),
    ],
    ids=lambda value: type(value).__name__ if isinstance(value, Exception) else str(value),
)
def test_each_kind_of_error_has_the_tables_status(error: CtxstoreError, status: int) -> None:
    """Not there or not done is 1; the command, a setting or the server to fix is 2."""
    assert status_of(error) == status


async def test_a_missing_session_checkpoint_or_entry_exits_1_in_every_command(
    store: ContextStore, capsys: pytest.CaptureFixture[str]
) -> None:
    """A session, checkpoint or entry that is not there: status 1, one line, in every command."""
    await store.append("s", turn(0))
    t = store.tenant
    no_session = f"ctxstore: no session 'nope' for tenant {t!r}"
    no_checkpoint = f"ctxstore: no checkpoint cp-9 in session 's' of tenant {t!r}"
    for argv, said in (
        (["status", "nope"], no_session),
        (["view", "nope"], no_session),
        (["search", "nope", "word"], no_session),
        (["export", "nope"], no_session),
        (["compact", "nope"], no_session),
        (["rewind", "s", "cp-9"], no_checkpoint),
        (["fork", "s", "s2", "--at", "cp-9"], no_checkpoint),
    ):
        assert await run_cli([*argv, "--tenant", t]) == ExitStatus.FAILED, argv
        assert one_line(capsys.readouterr().err) == said, argv
    assert await run_cli(["checkpoint", "s", "--delete", "cp-9", "--tenant", t]) == 1
    assert capsys.readouterr().out == "cp-9 was not there\n"


async def test_a_malformed_flag_value_exits_2(
    store: ContextStore, capsys: pytest.CaptureFixture[str]
) -> None:
    """An entry id that is no entry id is input to fix: status 2, one line."""
    await store.append("s", turn(0))
    assert await run_cli(["rewind", "s", "soon", "--tenant", store.tenant]) == 2
    assert "is not a stream entry id" in one_line(capsys.readouterr().err)


async def test_forget_of_a_tenant_with_nothing_exits_1_and_deletes_nothing(
    tenant: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """A tenant id that names nothing (a typo): one line saying so, status 1, no "deleted"."""
    for flags in (["--yes"], ["--dry-run"], []):
        assert await run_cli(["forget", "--tenant", tenant, *flags]) == 1, flags
        captured = capsys.readouterr()
        assert captured.out == ""
        line = one_line(captured.err)
        assert f"tenant {tenant!r} has no sessions and no limits of its own" in line
        assert "nothing to forget" in line


async def test_forget_of_a_tenant_with_only_its_limits_deletes_them(
    store: ContextStore, capsys: pytest.CaptureFixture[str]
) -> None:
    """A tenant with no session but limits of its own has something to forget: status 0."""
    await store.set_limits(TenantLimits(sessions=5))
    assert await run_cli(["forget", "--tenant", store.tenant, "--yes"]) == 0
    assert capsys.readouterr().out.startswith(f"deleted tenant {store.tenant!r}: 0 sessions")
    assert await store.limits() == TenantLimits()


async def test_forget_of_a_tenant_whose_sessions_were_deleted_still_runs(
    store: ContextStore, capsys: pytest.CaptureFixture[str]
) -> None:
    """A tenant that wrote, then deleted every session, is known: forget runs, status 0."""
    await store.append("s", turn(0))
    await store.delete("s")
    assert await run_cli(["forget", "--tenant", store.tenant, "--yes"]) == 0
    assert "deleted tenant" in capsys.readouterr().out


async def test_a_malformed_url_exits_2_naming_its_variable_and_reason(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`redis:/host:port/db` (one slash) is refused before anything connects: status 2, one line."""
    monkeypatch.setenv("CTXSTORE_REDIS_URL", "redis:/10.9.9.9:1/5")
    assert await run_cli(["sessions"]) == ExitStatus.CANNOT_RUN
    captured = capsys.readouterr()
    assert captured.out == ""
    line = one_line(captured.err)
    assert "CTXSTORE_REDIS_URL" in line and "names no host" in line


def cli_env(settings: Settings, **changes: str) -> dict[str, str]:
    """A process environment with these settings (and ``changes``), no other CTXSTORE_*."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CTXSTORE_")}
    assert settings.redis_url is not None
    return env | {
        "CTXSTORE_REDIS_URL": settings.redis_url,
        "CTXSTORE_KEY_PREFIX": settings.key_prefix,
        "CTXSTORE_QUEUE_NAME": settings.queue_name,
        "CTXSTORE_RETRY_ATTEMPTS": "0",
        **changes,
    }


@pytest.mark.parametrize("flags", [["--check"], ["--burst"]], ids=["check", "run"])
def test_a_worker_whose_redis_is_down_exits_2_in_one_line(
    settings: Settings, flags: list[str]
) -> None:
    """`worker` and `worker --check` with no Redis: one line naming the setting, status 2."""
    pytest.importorskip("arq", reason="the worker needs ctxstore[worker]")
    port = free_port()
    env = cli_env(settings, CTXSTORE_REDIS_URL=f"redis://127.0.0.1:{port}/0")
    done = subprocess.run(
        [CTXSTORE, "worker", *flags], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == ExitStatus.CANNOT_RUN, done.stderr
    assert done.stdout == ""
    line = one_line(done.stderr)
    assert f"is Redis running at 127.0.0.1:{port}? Check CTXSTORE_REDIS_URL" in line


def test_a_worker_whose_queue_is_down_names_the_queues_setting(settings: Settings) -> None:
    """The store answers, the queue's Redis does not: one line naming CTXSTORE_QUEUE_URL, 2."""
    pytest.importorskip("arq", reason="the worker needs ctxstore[worker]")
    port = free_port()
    env = cli_env(settings, CTXSTORE_QUEUE_URL=f"redis://127.0.0.1:{port}/0")
    done = subprocess.run(
        [CTXSTORE, "worker", "--burst"], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == ExitStatus.CANNOT_RUN, done.stderr
    line = one_line(done.stderr)
    assert f"is Redis running at 127.0.0.1:{port}? Check CTXSTORE_QUEUE_URL" in line


def test_worker_check_without_a_health_key_exits_1(settings: Settings) -> None:
    """Redis answers and no worker has written its health key: status 1, as its help says."""
    pytest.importorskip("arq", reason="the worker needs ctxstore[worker]")
    env = cli_env(settings, CTXSTORE_WORKER_NAME="nobody-runs-this")
    done = subprocess.run(
        [CTXSTORE, "worker", "--check"], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == ExitStatus.FAILED, done.stderr
    assert done.stdout.startswith("no health check at ")
