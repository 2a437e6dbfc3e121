"""The ``ctxstore`` command line: tables and JSON that say what is stored, errors in one line.

Commands run in-process (``main([...])``, output captured) against the test
Redis with this run's key prefix, set through the ``CTXSTORE_*`` variables
the command reads; a few run as a subprocess (a closed pipe, the exit status).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import subprocess
import sys
from collections.abc import AsyncIterator
from dataclasses import asdict, fields
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from redis.asyncio import Redis
from redis.exceptions import AuthenticationError, NoPermissionError, ResponseError
from support.cli import one_line, run_cli, run_json, use_settings
from support.config import RUN_PREFIX
from support.helpers import SYSTEM, conversation, turn
from support.servers import ADMIN, ServerPool, load_acl, redis7_binary

import ctxstore.cli
from ctxstore import ContextStore, LocalSummarizer, SessionInfo, Settings, TenantLimits
from ctxstore._tenant.acl import POD_USER, WORKER_USER
from ctxstore.cli import LIMIT_FLAGS, LIMITS, main
from ctxstore.summary_queue import SummaryQueue
from ctxstore.testing import free_port

CTXSTORE = str(Path(sys.executable).with_name("ctxstore"))


@pytest.fixture(autouse=True)
def _store_env(monkeypatch: pytest.MonkeyPatch, settings: Settings) -> None:
    """The command reads its settings from the environment: the test Redis and prefix."""
    use_settings(monkeypatch, settings)


def table_row(output: str, first: str) -> list[str]:
    """The cells of the table row whose first cell is ``first``."""
    for line in output.splitlines():
        cells = re.split(r"\s{2,}", line.strip())
        if cells[0] == first:
            return cells
    raise AssertionError(f"no row {first!r} in:\n{output}")


def local_time(ms: int) -> str:
    """How the command shows a time: local, with the zone's name."""
    return datetime.fromtimestamp(ms / 1000, UTC).astimezone().strftime("%Y-%m-%d %H:%M:%S %Z")


# -- help ---------------------------------------------------------------------------


def subcommands() -> dict[str, argparse.ArgumentParser]:
    """Every subcommand's parser, by name."""
    parser = ctxstore.cli._parser()
    (choices,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(choices.choices)


def test_every_command_and_flag_has_help_and_examples() -> None:
    """Each subcommand has a summary, a description and examples; each of its flags has help."""
    parser = ctxstore.cli._parser()
    (choices,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    summaries = {action.dest: action.help for action in choices._choices_actions}
    for name, sub in subcommands().items():
        assert summaries[name], name
        if name == "demo":
            continue  # its own parser, in ctxstore._cli.demo, answers `ctxstore demo --help`
        assert sub.description, name
        assert sub.epilog is not None and sub.epilog.startswith("examples:\n  ctxstore "), name
        for action in sub._actions:
            assert action.help, (name, action.dest)


def test_limit_flags_are_the_tenant_limits_fields() -> None:
    """`limits` has one flag, one unit and one setting per TenantLimits field, and no other."""
    assert list(LIMIT_FLAGS) == list(TenantLimits.model_fields) == list(LIMITS)
    for field, *_ in LIMITS.values():
        assert field in Settings.model_fields, field


def test_help_loads_nothing_heavy() -> None:
    """`ctxstore --help` imports neither rich, pydantic nor redis: it answers at once."""
    code = (
        "import sys\n"
        "from ctxstore.cli import main\n"
        "try:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
        "print(sorted(m for m in ('rich', 'pydantic', 'redis', 'arq') if m in sys.modules))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.splitlines()[-1] == "[]"
    assert "sessions" in done.stdout and "limits" in done.stdout


# -- sessions -------------------------------------------------------------------------


@pytest.fixture
async def small(
    summary_settings: Settings, tenant: str, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[ContextStore]:
    """A store with a small summary window; the command reads the same settings."""
    use_settings(monkeypatch, summary_settings)
    async with ContextStore.from_settings(summary_settings, tenant=tenant) as store:
        yield store


async def two_sessions(store: ContextStore) -> tuple[SessionInfo, SessionInfo]:
    """A summarized session and a short one; their counters."""
    await store.append_many("long", conversation(12))
    await store.summarize("long", LocalSummarizer())
    await store.append_many("short", [SYSTEM, turn(0), turn(1)])
    return await store.info("long"), await store.info("short")


async def test_sessions_table_shows_counts_coverage_and_zoned_times(
    small: ContextStore, capsys: pytest.CaptureFixture[str]
) -> None:
    """Each session is a row: id, messages, tokens, summary coverage, last activity with zone."""
    long, short = await two_sessions(small)
    assert long.summary_covers is not None and not short.summary_covers
    listed = {row.session: row.last_active_ms for row in await small.list_sessions()}

    assert await run_cli(["sessions", "--tenant", small.tenant]) == 0
    out = capsys.readouterr().out

    assert out.splitlines()[0] == f"sessions of tenant {small.tenant!r}"
    covered = long.tokens - long.tokens_unsummarized
    assert 0 < covered < long.tokens
    assert table_row(out, "long") == [
        "long",
        f"{long.count:,}",
        f"{long.tokens:,}",
        f"{covered / long.tokens:.0%} ({covered:,} tokens)",
        local_time(listed["long"]),
    ]
    assert table_row(out, "short") == [
        "short",
        "3",
        f"{short.tokens:,}",
        "-",
        local_time(listed["short"]),
    ]


async def test_sessions_json_has_stable_keys(
    small: ContextStore, capsys: pytest.CaptureFixture[str]
) -> None:
    """`sessions --json` gives each session's counts, coverage and activity, under fixed keys."""
    long, short = await two_sessions(small)
    data = await run_json(["sessions", "--tenant", small.tenant], capsys)
    assert data["tenant"] == small.tenant
    rows = {row["session"]: row for row in data["sessions"]}
    assert set(rows) == {"long", "short"}
    for row in rows.values():
        assert list(row) == [
            "session",
            "messages",
            "tokens",
            "summarized_tokens",
            "summary_coverage",
            "last_active_ms",
            "last_active",
        ]
    covered = long.tokens - long.tokens_unsummarized
    assert rows["long"]["messages"] == long.count and rows["long"]["tokens"] == long.tokens
    assert rows["long"]["summarized_tokens"] == covered
    assert rows["long"]["summary_coverage"] == round(covered / long.tokens, 4)
    assert rows["short"]["summarized_tokens"] == 0 and rows["short"]["messages"] == short.count
    stamp = datetime.fromisoformat(rows["short"]["last_active"])
    assert stamp.utcoffset() is not None
    assert int(stamp.timestamp() * 1000) == rows["short"]["last_active_ms"]


async def test_sessions_of_an_empty_tenant_say_so(
    tenant: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """A tenant with no session gets a sentence, not an empty table (and [] in JSON)."""
    assert await run_cli(["sessions", "--tenant", tenant]) == 0
    assert capsys.readouterr().out == f"tenant {tenant!r} has no sessions\n"
    assert (await run_json(["sessions", "--tenant", tenant], capsys))["sessions"] == []


# -- status and view ------------------------------------------------------------------


async def test_status_shows_times_with_their_zone_beside_entry_ids(
    small: ContextStore, capsys: pytest.CaptureFixture[str]
) -> None:
    """`status` shows the history's times and the summary's entry as a zoned time, then its id."""
    long, _ = await two_sessions(small)
    assert long.summary_covers is not None and long.first_at_ms is not None
    assert await run_cli(["status", "long", "--tenant", small.tenant]) == 0
    out = capsys.readouterr().out

    assert table_row(out, "messages")[1] == f"{long.count:,} ({long.tokens:,} tokens)"
    assert table_row(out, "first message")[1] == local_time(long.first_at_ms)
    covers_ms = int(long.summary_covers.split("-")[0])
    assert table_row(out, "summary covers")[1] == (
        f"{local_time(covers_ms)} (entry {long.summary_covers})"
    )
    assert table_row(out, "jobs")[1] == "1 committed, 0 failed"


async def test_status_json_has_every_session_field(
    small: ContextStore, capsys: pytest.CaptureFixture[str]
) -> None:
    """`status --json` is every SessionInfo field as stored, plus the job's state."""
    long, _ = await two_sessions(small)
    data = await run_json(["status", "long", "--tenant", small.tenant], capsys)
    info = await small.info("long")
    assert {f.name for f in fields(SessionInfo)} <= data.keys()
    assert {k: data[k] for k in asdict(info)} == {**asdict(info), "pinned": list(info.pinned)}
    assert (data["job"] is None) == (not info.summary_due)  # the queue is asked when one is due
    assert data["summary_covers_at_ms"] == int(str(long.summary_covers).split("-")[0])


async def test_status_reads_the_due_jobs_state_from_the_queue(
    summary_settings: Settings,
    tenant: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A due summary shows "queued" while its job is queued, and "not_found" when there is none."""
    use_settings(monkeypatch, summary_settings)
    async with ContextStore.from_settings(summary_settings, tenant=tenant) as store:
        generations = {}
        for session in ("lost", "queued"):
            await store.append_many(session, [SYSTEM, turn(0), turn(1)])
            generations[session] = await store.request_summary(session)  # flagged, not queued
            assert generations[session]
        queue = await SummaryQueue.connect(summary_settings)
        try:
            assert await queue.enqueue(tenant, "queued", generations["queued"])
        finally:
            await queue.aclose()

    for session, state in (("lost", "not_found"), ("queued", "queued")):
        data = await run_json(["status", session, "--tenant", tenant], capsys)
        assert (data["summary_due"], data["job"]) == (True, state), session
    assert await run_cli(["status", "lost", "--tenant", tenant]) == 0
    assert table_row(capsys.readouterr().out, "job")[1].startswith("none on the queue")


async def test_status_and_view_of_an_unknown_session_exit_1(
    tenant: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """No session: one line naming it and its tenant, exit status 1, nothing on stdout."""
    for command in ("status", "view"):
        assert await run_cli([command, "nope", "--tenant", tenant]) == 1
        captured = capsys.readouterr()
        assert captured.out == ""
        assert one_line(captured.err) == f"ctxstore: no session 'nope' for tenant {tenant!r}"


async def test_view_table_and_json_agree_with_the_store(
    store: ContextStore, capsys: pytest.CaptureFixture[str]
) -> None:
    """`view --budget` shows what was sent of the history; --json has its stats and messages."""
    await store.append_many("s", conversation(12))
    expected = await store.view("s", token_budget=300)
    assert expected.stats.dropped > 0

    data = await run_json(["view", "s", "--tenant", store.tenant, "--budget", "300"], capsys)
    assert list(data) == ["tenant", "session", "stats", "messages"]
    assert data["stats"] == asdict(expected.stats)
    assert data["messages"] == expected.messages

    assert (
        await run_cli(
            ["view", "s", "--tenant", store.tenant, "--budget", "300", "--messages"],
        )
        == 0
    )
    out = capsys.readouterr().out
    stats = expected.stats
    assert table_row(out, "budget")[1] == f"300 model tokens ({stats.budget_cl100k:,} cl100k)"
    assert table_row(out, "sent")[1] == f"{stats.messages} messages, {stats.tokens:,} tokens"
    assert table_row(out, "history")[1] == (
        f"{stats.history_messages} messages, {stats.history_tokens:,} tokens"
    )
    for number, message in enumerate(expected.messages, 1):
        assert table_row(out, str(number))[1] == message["role"]


async def test_search_table_and_json_agree_with_the_store(
    store: ContextStore, capsys: pytest.CaptureFixture[str]
) -> None:
    """`search` lists the store's matches, best first; a missing session is exit status 1."""
    await store.append_many("s", conversation(12))
    planted = await store.append("s", {"role": "user", "content": "The kiln runs at 1,280 C."})
    expected = await store.search("s", "kiln temperature", limit=3)
    assert expected[0].entry_id == planted.entry_id

    argv = ["search", "s", "kiln temperature", "--tenant", store.tenant, "--limit", "3"]
    data = await run_json(argv, capsys)
    assert data == {
        "tenant": store.tenant,
        "session": "s",
        "query": "kiln temperature",
        "hits": [asdict(hit) for hit in expected],
    }
    assert await run_cli(argv) == 0
    out = capsys.readouterr().out
    assert table_row(out, "1")[1:3] == [planted.entry_id, local_time(int(planted.entry_id[:13]))]
    assert "The kiln runs at 1,280 C." in out
    assert await run_cli(["search", "absent", "kiln", "--tenant", store.tenant]) == 1
    assert "no session 'absent'" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exited:
        await run_cli(["search", "s", "kiln", "--tenant", store.tenant, "--limit", "0"])
    assert exited.value.code == 2


async def test_budget_zero_is_refused_in_words(
    store: ContextStore, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--budget 0` and `--budget many` are argparse errors in words, exit status 2."""
    for value, words in (("0", "not 0"), ("many", "not 'many'"), ("10000000000", "at most")):
        with pytest.raises(SystemExit) as exited:
            await run_cli(["view", "s", "--tenant", store.tenant, "--budget", value])
        assert exited.value.code == 2
        err = capsys.readouterr().err
        assert "--budget: must be" in err and "tokens" in err and words in err, err
        assert "int" not in err.split("error:")[1]


# -- limits ---------------------------------------------------------------------------


async def test_limits_sets_integers_and_rates(store: ContextStore) -> None:
    """Whole numbers for the integer fields, a decimal for the rate; the rest is kept."""
    await store.set_limits(TenantLimits(ttl_seconds=3600))
    argv = ["limits", "--tenant", store.tenant, "--sessions", "3", "--appends-per-second", "2.5"]
    assert await run_cli(argv) == 0
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
        await run_cli(["limits", "--tenant", store.tenant, "--sessions", value])
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
    assert await run_cli(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("ctxstore: invalid limits: " + flag + ":")
    assert "Traceback" not in err and "--append-burst" not in err
    assert await store.limits() == TenantLimits(sessions=5)


async def test_limits_show_each_value_in_force_and_its_source(
    store: ContextStore, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The tenant's own limit, a CTXSTORE_* variable, the built-in default, or none."""
    await store.set_limits(TenantLimits(sessions=5))
    monkeypatch.setenv("CTXSTORE_SESSION_TOKENS", "5000")
    data = await run_json(["limits", "--tenant", store.tenant], capsys)
    limits = data["limits"]
    assert list(limits) == list(TenantLimits.model_fields)
    for row in limits.values():
        assert list(row) == ["value", "unit", "source", "variable", "tenant_value", "default"]
    assert limits["sessions"] | {"unit": None} == {
        "value": 5,
        "unit": None,
        "source": "tenant",
        "variable": "CTXSTORE_MAX_SESSIONS",
        "tenant_value": 5,
        "default": None,
    }
    assert (limits["session_tokens"]["value"], limits["session_tokens"]["source"]) == (
        5000,
        "setting",
    )
    assert (limits["append_burst"]["value"], limits["append_burst"]["source"]) == (100, "default")
    assert (limits["session_bytes"]["value"], limits["session_bytes"]["source"]) == (None, "none")

    assert await run_cli(["limits", "--tenant", store.tenant]) == 0
    out = capsys.readouterr().out
    assert table_row(out, "sessions")[1:3] == ["5 sessions", "the tenant's own limit"]
    assert table_row(out, "session_tokens")[1:3] == ["5,000 tokens", "CTXSTORE_SESSION_TOKENS"]
    assert table_row(out, "append_burst")[1:3] == [
        "100 appends",
        "default (CTXSTORE_APPEND_BURST unset)",
    ]
    assert table_row(out, "session_bytes")[1:3] == [
        "no limit",
        "none (CTXSTORE_SESSION_BYTES unset)",
    ]


async def test_limits_shown_are_the_limits_the_store_enforces(
    store: ContextStore,
    settings: Settings,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """What `limits` says is in force is what the store's quotas resolve (0 there: no limit)."""
    cap = 4096
    monkeypatch.setenv("CTXSTORE_MAX_MESSAGE_BYTES", str(cap))
    monkeypatch.setenv("CTXSTORE_SESSION_TTL_SECONDS", "600")
    monkeypatch.setenv("CTXSTORE_APPENDS_PER_SECOND", "7.5")
    own = TenantLimits(message_bytes=cap * 2, session_tokens=900, append_burst=3)
    await store.set_limits(own)
    data = await run_json(["limits", "--tenant", store.tenant], capsys)
    shown = {name: row["value"] for name, row in data["limits"].items()}

    capped = settings.model_copy(
        update={"max_message_bytes": cap, "session_ttl_seconds": 600, "appends_per_second": 7.5}
    )
    async with ContextStore.from_settings(capped, tenant=store.tenant) as same:
        enforced = await same._quotas.resolved()
    assert shown == {
        "message_bytes": enforced.message_bytes,
        "session_bytes": enforced.session_bytes or None,
        "session_tokens": enforced.session_tokens or None,
        "sessions": enforced.sessions or None,
        "appends_per_second": enforced.appends_per_second or None,
        "append_burst": enforced.append_burst,
        "ttl_seconds": enforced.ttl_ms // 1000 or None,
        "checkpoints": enforced.checkpoints or None,
    }
    assert shown["message_bytes"] == cap and data["limits"]["message_bytes"]["source"] == "setting"


async def test_limits_unset_drops_the_tenants_own_value(
    store: ContextStore, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--unset sessions` removes the tenant's own limit, keeps the others; the default shows."""
    await store.set_limits(TenantLimits(sessions=3, ttl_seconds=3600, append_burst=7))
    argv = ["limits", "--tenant", store.tenant, "--unset", "sessions", "--unset", "ttl-seconds"]
    data = await run_json(argv, capsys)
    assert await store.limits() == TenantLimits(append_burst=7)
    assert data["limits"]["sessions"]["source"] == "none"
    assert data["limits"]["ttl_seconds"]["source"] == "none"
    assert data["limits"]["append_burst"]["source"] == "tenant"


async def test_limits_refuse_to_set_and_unset_one_limit(
    store: ContextStore, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--sessions 3 --unset sessions` (or an unknown name) is a usage error; nothing is written."""
    await store.set_limits(TenantLimits(sessions=5))
    for extra, words in (
        (["--sessions", "3", "--unset", "sessions"], "--sessions and --unset sessions"),
        (["--unset", "session"], "'session' is not a limit; one of: message-bytes"),
    ):
        with pytest.raises(SystemExit) as exited:
            await run_cli(["limits", "--tenant", store.tenant, *extra])
        assert exited.value.code == 2
        err = capsys.readouterr().err
        assert "usage: ctxstore limits" in err and words in err, err
    assert await store.limits() == TenantLimits(sessions=5)


# -- forget ---------------------------------------------------------------------------


async def test_forget_never_picks_the_default_tenant(
    store: ContextStore, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Without --tenant, `forget --yes` is refused even when CTXSTORE_TENANT names one."""
    monkeypatch.setenv("CTXSTORE_TENANT", store.tenant)
    await store.append("s", turn(0))
    with pytest.raises(SystemExit) as exited:
        await run_cli(["forget", "--yes"])
    assert exited.value.code == 2
    assert "the following arguments are required: --tenant" in capsys.readouterr().err
    assert [row.session for row in await store.list_sessions()] == ["s"]


async def test_forget_without_yes_says_what_it_would_delete(
    store: ContextStore, capsys: pytest.CaptureFixture[str]
) -> None:
    """Without --yes: one line naming the tenant and its session count, exit 2, nothing deleted."""
    for session in ("a", "b"):
        await store.append(session, turn(0))
    assert await run_cli(["forget", "--tenant", store.tenant]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    line = one_line(captured.err)
    assert f"forget would delete tenant {store.tenant!r}: 2 sessions" in line
    assert "--yes" in line
    assert len(await store.list_sessions()) == 2


async def test_forget_dry_run_lists_the_sessions_and_deletes_nothing(
    store: ContextStore, capsys: pytest.CaptureFixture[str]
) -> None:
    """--dry-run lists each session with its last activity; --json too; all are still there."""
    for session in ("a", "b"):
        await store.append(session, turn(0))
    listed = {row.session: row.last_active_ms for row in await store.list_sessions()}
    assert await run_cli(["forget", "--tenant", store.tenant, "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0].startswith(f"forget would delete tenant {store.tenant!r}: 2 ")
    assert "nothing was deleted" in out.splitlines()[0]
    for session, ms in listed.items():
        assert table_row(out, session) == [session, local_time(ms)]
    data = await run_json(["forget", "--tenant", store.tenant, "--dry-run"], capsys)
    assert data["dry_run"] is True and data["more"] is False
    assert {row["session"]: row["last_active_ms"] for row in data["sessions"]} == listed
    assert len(await store.list_sessions()) == 2


async def test_forget_yes_deletes_and_says_how_many(
    store: ContextStore, capsys: pytest.CaptureFixture[str]
) -> None:
    """--yes deletes every session and the tenant's limits, and says how many sessions went."""
    for session in ("a", "b", "c"):
        await store.append(session, turn(0))
    await store.set_limits(TenantLimits(sessions=9))
    assert await run_cli(["forget", "--tenant", store.tenant, "--yes"]) == 0
    assert capsys.readouterr().out == (
        f"deleted tenant {store.tenant!r}: 3 sessions, its limits and its index\n"
    )
    assert await store.list_sessions() == []
    assert await store.limits() == TenantLimits()


@pytest.mark.parametrize(
    ("rules", "words"),
    [
        # May read (so it lists the sessions) but delete nothing.
        ("~* +@read +@transaction +@connection +time", "may not do this"),
        # May delete the sessions, not the tenant's entry in the tenants set.
        ("~* &* +@all -srem", "is incomplete: deleted 2 sessions, but could not delete"),
    ],
    ids=["read-only", "no-srem"],
)
async def test_forget_as_a_user_lacking_permission_claims_nothing(
    servers: ServerPool,
    tenant: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    rules: str,
    words: str,
) -> None:
    """A refused forget is one error line naming CTXSTORE_REDIS_URL, exit 2, no "deleted" claim."""
    server = servers.start(acl=ADMIN + f"user limited on >limited-pw {rules}\n")
    admin = Settings(redis_url=server.url(), key_prefix="clip", queue_name="clip:q")
    async with ContextStore.from_settings(admin, tenant=tenant) as store:
        for session in ("a", "b"):
            await store.append(session, turn(0))
    limited = admin.model_copy(update={"redis_url": server.url("limited", "limited-pw")})
    use_settings(monkeypatch, limited, CTXSTORE_RETRY_ATTEMPTS="0")

    assert await run_cli(["forget", "--tenant", tenant, "--yes"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    line = one_line(captured.err)
    assert words in line and "CTXSTORE_REDIS_URL" in line
    assert "limited-pw" not in line


# -- errors ---------------------------------------------------------------------------


def url_with(url: str, *, auth: str = "", port: int | None = None) -> str:
    """``url`` with another user:password, or another port."""
    parts = urlsplit(url)
    netloc = f"{auth + '@' if auth else ''}{parts.hostname}:{port or parts.port or 6379}"
    return parts._replace(netloc=netloc).geturl()


@pytest.mark.parametrize("case", ["http", "bad-port", "wrong-password", "nothing-listening"])
async def test_connection_and_url_errors_are_one_line_naming_the_setting(
    case: str,
    settings: Settings,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A bad URL, a wrong password or no Redis: one line naming CTXSTORE_REDIS_URL, exit 2."""
    assert settings.redis_url is not None
    url, words = {
        "http": ("http://127.0.0.1:6379", "must be a redis://, rediss:// or unix:// URL, not http"),
        "bad-port": ("redis://127.0.0.1:sixty/0", "is not a valid URL"),
        "wrong-password": (
            url_with(settings.redis_url, auth="nobody:s3cret-pw"),
            "refused the credentials",
        ),
        "nothing-listening": (
            url_with(settings.redis_url, port=free_port()),
            "is Redis running at 127.0.0.1:",
        ),
    }[case]
    monkeypatch.setenv("CTXSTORE_REDIS_URL", url)
    monkeypatch.setenv("CTXSTORE_RETRY_ATTEMPTS", "0")
    for argv in (["sessions"], ["limits"], ["forget", "--tenant", "x", "--dry-run"]):
        assert await run_cli(argv) == 2, argv
        captured = capsys.readouterr()
        line = one_line(captured.err)
        assert words in line and "CTXSTORE_REDIS_URL" in line, line
        assert "s3cret-pw" not in line and captured.out == ""


async def test_invalid_settings_are_one_line_naming_the_variable(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A setting that cannot work is named by its variable, exit 2."""
    monkeypatch.setenv("CTXSTORE_REPLICA_ACKS", "-1")
    assert await run_cli(["sessions"]) == 2
    assert "CTXSTORE_REPLICA_ACKS" in one_line(capsys.readouterr().err)


def cli_env(settings: Settings) -> dict[str, str]:
    """A subprocess environment with exactly these settings (no other CTXSTORE_*)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CTXSTORE_")}
    assert settings.redis_url is not None
    env |= {
        "CTXSTORE_REDIS_URL": settings.redis_url,
        "CTXSTORE_KEY_PREFIX": settings.key_prefix,
        "CTXSTORE_QUEUE_NAME": settings.queue_name,
    }
    return env


def test_a_bad_url_exits_2_with_one_line(settings: Settings) -> None:
    """As a process: an http:// URL is exit status 2 and one line on stderr, no traceback."""
    env = cli_env(settings) | {"CTXSTORE_REDIS_URL": "http://localhost:6379"}
    done = subprocess.run(
        [CTXSTORE, "sessions"], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 2
    assert done.stdout == ""
    assert "CTXSTORE_REDIS_URL" in one_line(done.stderr)


@pytest.mark.parametrize("argv", [["view", "s", "--json"], ["sessions"], ["status", "s"]])
async def test_a_closed_pipe_ends_the_command_quietly(
    store: ContextStore, settings: Settings, argv: list[str]
) -> None:
    """`ctxstore view s | head -1` with head gone: no traceback, no message, exit 1."""
    await store.append_many("s", conversation(40))
    read, write = os.pipe()
    os.close(read)  # the reader is gone before the command writes a byte
    try:
        done = await asyncio.to_thread(
            subprocess.run,
            [CTXSTORE, *argv, "--tenant", store.tenant],
            env=cli_env(settings),
            stdout=write,
            stderr=subprocess.PIPE,
            timeout=60,
        )
    finally:
        os.close(write)
    assert done.stderr.decode() == ""
    assert done.returncode == 1


# -- other commands -------------------------------------------------------------------


def test_worker_flags_become_the_workers_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    """--log-level and --log-format reach the worker as settings; the rest of them are kept."""
    pytest.importorskip("arq", reason="the worker needs ctxstore[worker]")
    import workers

    built: list[tuple[Settings, dict[str, Any]]] = []

    class Recorded:
        def run(self) -> None:
            return None

    def build_worker(settings: Settings, **options: Any) -> Recorded:
        built.append((settings, options))
        return Recorded()

    monkeypatch.setattr(workers, "build_worker", build_worker)
    monkeypatch.setenv("CTXSTORE_LOG_LEVEL", "ERROR")
    assert main(["worker", "--burst", "--log-level", "debug", "--log-format", "json"]) == 0
    assert main(["worker"]) == 0
    (first, options), (second, _) = built
    assert (first.log_level, first.log_format, options) == ("DEBUG", "json", {"burst": True})
    assert (second.log_level, second.log_format) == ("ERROR", "text")  # the environment's
    assert first.key_prefix == second.key_prefix == RUN_PREFIX


def test_worker_refuses_an_unknown_log_level(capsys: pytest.CaptureFixture[str]) -> None:
    """--log-level takes DEBUG, INFO, WARNING or ERROR only (argparse's error, exit 2)."""
    with pytest.raises(SystemExit) as exited:
        main(["worker", "--log-level", "loud"])
    assert exited.value.code == 2
    assert "invalid choice: 'LOUD'" in capsys.readouterr().err


async def test_sweep_queues_a_due_summary_and_says_so(
    summary_settings: Settings,
    tenant: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`sweep` queues a session past the trigger whose flag is down; a second sees it waiting."""
    use_settings(monkeypatch, summary_settings)
    untriggered = summary_settings.model_copy(update={"summary_trigger_tokens": 0})
    async with ContextStore.from_settings(untriggered, tenant=tenant) as store:
        await store.append_many("s", [SYSTEM, *(turn(i) for i in range(20))])
        info = await store.info("s")
    assert not info.summary_due
    assert info.tokens_unsummarized >= summary_settings.summary_trigger_tokens

    assert await run_json(["sweep"], capsys) == {"sessions": 1, "queued": 1, "waiting": 0}
    assert await run_cli(["sweep"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0] == "sweep"
    assert out.splitlines()[-1].split() == ["1", "0", "1"]  # looked at, queued, waiting


async def test_functions_show_prints_the_library(capsys: pytest.CaptureFixture[str]) -> None:
    """`functions show` prints the Lua library that `functions load` loads."""
    from ctxstore._redis.scripts import library

    assert await run_cli(["functions", "show"]) == 0
    assert capsys.readouterr().out == library()


async def test_functions_prune_deletes_only_other_versions_libraries(
    servers: ServerPool, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`functions prune` deletes an older ctxstore's library, and no other, on every node.

    The pods of this version still run by FCALL after it; libraries named otherwise (a
    user's own, one only shaped like ours) stay; a second prune finds nothing.
    """
    from ctxstore._redis.functions import library_names
    from ctxstore._redis.scripts import LIBRARY_NAME

    server = servers.start()
    settings = Settings(
        redis_url=server.url(), script_mode="functions", key_prefix="fn", queue_name="fn:q"
    )
    use_settings(monkeypatch, settings, CTXSTORE_SCRIPT_MODE="functions")
    raw = Redis.from_url(server.url())
    older, others = "ctxstore_0123456789ab", {"ctxstore_custom", "ctxstore_0123456789abc", "mine"}
    try:
        for name in (older, *others):
            body = f"redis.register_function('{name}_f', function() return 1 end)"
            await raw.execute_command("FUNCTION", "LOAD", f"#!lua name={name}\n{body}")
        assert await run_cli(["functions", "load"]) == 0
        assert await run_cli(["functions", "prune"]) == 0
        out = capsys.readouterr().out
        assert f"deleted on the store's Redis: {older} (kept {LIBRARY_NAME})" in out
        listed = await raw.execute_command("FUNCTION", "LIST")
        assert set(library_names(listed)) == {LIBRARY_NAME, *others}
        async with ContextStore.from_settings(settings, tenant="acme") as pod:
            assert (await pod.append("s", turn(0))).seq == 1  # by FCALL, of the kept library
        assert await run_cli(["functions", "prune"]) == 0
        assert "deleted on the store's Redis: none" in capsys.readouterr().out
    finally:
        await raw.aclose()


# -- acl --------------------------------------------------------------------------------


@pytest.mark.skipif(redis7_binary() is None, reason="the rendered users need Redis 7")
async def test_acl_with_admin_and_probe_is_a_complete_acl_file(
    servers: ServerPool, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--admin and --probe: `default` is off, the admin may do anything, the probe only PING."""
    out, credentials = tmp_path / "users.acl", tmp_path / "creds.json"
    argv = ["acl", "--out", str(out), "--credentials", str(credentials)]
    assert await run_cli([*argv, "--admin", "admin", "--probe", "probe", "--tenant", "acme"]) == 0
    passwords = json.loads(credentials.read_text())
    assert set(passwords) == {"admin", "probe", POD_USER, WORKER_USER, "ctxstore-t-acme"}
    text = out.read_text()
    assert text.splitlines()[0] == "user default off"
    assert not any(password in text for password in passwords.values())

    server = servers.start(acl=ADMIN)
    await load_acl(server, text)

    async def client(user: str | None) -> Redis:
        password = None if user is None else passwords[user]
        return Redis.from_url(server.url(user, password))

    anonymous = await client(None)
    with pytest.raises((AuthenticationError, ResponseError)):
        await anonymous.ping()  # NOAUTH: the default user is off
    await anonymous.aclose()
    admin = await client("admin")
    assert await admin.set("any-key", "1") and await admin.get("any-key") == b"1"
    await admin.aclose()
    probe = await client("probe")
    assert await probe.ping()
    with pytest.raises(NoPermissionError):
        await probe.get("any-key")
    await probe.aclose()
    pod = await client(POD_USER)
    assert await pod.ping()
    await pod.aclose()
    capsys.readouterr()


async def test_acl_refuses_an_operator_named_like_a_rendered_user(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--admin ctxstore-pod would give the pods every right: refused in one line, nothing kept."""
    credentials = tmp_path / "creds.json"
    argv = ["acl", "--credentials", str(credentials), "--admin", POD_USER]
    assert await run_cli(argv) == 2
    assert "may not name a rendered user: ctxstore-pod" in one_line(capsys.readouterr().err)
    assert not credentials.exists()


def test_embedded_stop_stops_the_users_embedded_redis(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`ctxstore embedded stop` stops the server of CTXSTORE_DATA_DIR; its data stays."""
    from ctxstore.embedded import shared_embedded_url

    monkeypatch.delenv("CTXSTORE_REDIS_URL", raising=False)
    monkeypatch.setenv("CTXSTORE_DATA_DIR", str(tmp_path))
    url = shared_embedded_url(tmp_path)
    capsys.readouterr()
    assert main(["embedded", "stop"]) == 0
    assert capsys.readouterr().out == f"stopped embedded Redis in {tmp_path}\n"
    assert main(["embedded", "stop"]) == 0
    assert capsys.readouterr().out == f"no embedded Redis runs in {tmp_path}\n"
    assert url.startswith("unix://") and list(tmp_path.iterdir())  # the data stays
