"""Export and import on real Redis: faithful, idempotent, all or nothing, flat in memory."""

from __future__ import annotations

import json
import tracemalloc
from collections.abc import Iterator
from typing import Any

import pytest
from redis.asyncio import Redis
from support.config import BACKENDS
from support.helpers import conversation, turn
from support.servers import ServerPool

from ctxstore import (
    ContextStore,
    DecryptionError,
    InvalidIdError,
    Keyring,
    LocalSummarizer,
    MalformedArchiveError,
    QuotaExceededError,
    SessionExistsError,
    SessionNotFoundError,
    Settings,
    TenantLimits,
)

pytestmark = pytest.mark.parametrize("backend", BACKENDS, indirect=True)


async def exported(store: ContextStore, session: str, **kwargs: Any) -> list[str]:
    return [line async for line in store.export_session(session, **kwargs)]


async def state(store: ContextStore, session: str) -> tuple[Any, ...]:
    """What an import must carry over: messages and ids, pins, checkpoints, the summary."""
    info = await store.info(session)
    return (
        [(m.entry_id, m.message, m.tokens) async for m in store.iter_history(session)],
        info.pinned,
        [
            (c.checkpoint_id, c.entry_id, c.count, c.tokens, c.name, c.summary_covers)
            for c in await store.checkpoints(session)
        ],
        (info.count, info.tokens, info.summary_covers, info.tokens_unsummarized),
    )


async def summarized(store: ContextStore, session: str, size: int) -> None:
    """A session of ``size`` turns with a pin, a summary (of its start) and two checkpoints."""
    await store.append_many(session, [turn(i) for i in range(200)])
    first = (await store.read(session, limit=1)).messages[0]
    await store.pin(session, first.entry_id)
    await store.checkpoint(session, name="before")
    await store.summarize(session, LocalSummarizer())
    await store.checkpoint(session, name="after the summary")
    for start in range(200, size, 1_000):
        await store.append_many(session, [turn(i) for i in range(start, min(size, start + 1_000))])


async def test_an_export_imports_elsewhere_identical_and_only_once(
    summary_settings: Settings, tenant: str
) -> None:
    """10,000 messages with a pin, a summary and checkpoints: the same after import; twice: once."""
    async with (
        ContextStore.from_settings(summary_settings, tenant=tenant) as source,
        ContextStore.from_settings(summary_settings, tenant=tenant + "b") as target,
    ):
        await summarized(source, "s", 10_000)
        lines = await exported(source, "s")
        read: list[int] = []
        results = await target.import_sessions(lines, progress=read.append)
        assert [(r.session, r.status, r.count, r.checkpoints) for r in results] == [
            ("s", "imported", 10_000, 2)
        ]
        assert sum(read) == 10_000
        assert await state(target, "s") == await state(source, "s")
        view_a = await source.view("s", token_budget=2_000)
        view_b = await target.view("s", token_budget=2_000)
        assert view_a.messages == view_b.messages
        before = await target.info("s")
        again = await target.import_sessions(lines)
        assert again[0].status == "unchanged"
        assert await target.info("s") == before


async def test_an_import_reaches_another_deployment(
    servers: ServerPool, summary_settings: Settings, tenant: str, backend: str
) -> None:
    """From the test Redis (or cluster) to a server of its own, under another session id."""
    other = servers.start()
    elsewhere = Settings(redis_url=other.url(), key_prefix="imported", summary_trigger_tokens=0)
    async with (
        ContextStore.from_settings(summary_settings, tenant=tenant) as source,
        ContextStore.from_settings(elsewhere, tenant="acme") as target,
    ):
        await summarized(source, "s", 300)
        lines = await exported(source, "s")
        await target.import_sessions(lines, session="moved")
        got, want = await state(target, "moved"), await state(source, "s")
        assert got == want


async def test_a_malformed_line_is_refused_with_its_number_and_writes_nothing(
    store: ContextStore, raw_redis: Redis
) -> None:
    """Each kind of bad line: MalformedArchiveError naming it; no session, no staged keys."""
    ids = [r.entry_id for r in await store.append_many("s", conversation(30))]
    await store.checkpoint("s")
    lines = await exported(store, "s")
    message_at = 1 + 3  # the 4th message's line (line numbers count from 1)

    def with_line(number: int, replaced: str) -> list[str]:
        """The export with one line replaced, edited by hand: no digest on its end line."""
        out = list(lines)
        out[number - 1] = replaced
        end = json.loads(out[-1])
        end.pop("digest", None)
        return [*out[:-1], json.dumps(end)] if end.get("ctxstore") == "end" else out

    record = json.loads(lines[message_at])
    bad_message = json.dumps({**record, "message": {"role": "wizard", "content": "x"}})
    bad_point = json.dumps({**json.loads(lines[-2]), "entry_id": "1-0"})
    edited = list(lines)
    edited[message_at] = json.dumps({**record, "message": {"role": "user", "content": "?"}})
    cases = [
        (message_at + 1, with_line(message_at + 1, "{not json")),
        (message_at + 1, with_line(message_at + 1, json.dumps({**record, "id": ids[0]}))),
        (message_at + 1, with_line(message_at + 1, bad_message)),
        (len(lines) - 1, with_line(len(lines) - 1, bad_point)),
        (len(lines), with_line(len(lines), json.dumps({"ctxstore": "end", "count": 2}))),
        (2, with_line(2, json.dumps({"ctxstore": "gossip"}))),
        (len(lines), edited),  # an edit its digest catches
    ]
    for number, bad in cases:
        with pytest.raises(MalformedArchiveError) as refused:
            await store.import_sessions(bad, session="copy")
        assert refused.value.line == number, (number, refused.value)
        assert f"line {number}:" in str(refused.value)
    truncated = lines[:-1]
    with pytest.raises(MalformedArchiveError, match="no end line"):
        await store.import_sessions(truncated, session="copy")
    assert not (await store.info("copy")).exists
    assert [k async for k in raw_redis.scan_iter(match=f"*{store.tenant}:copy}}*")] == []
    assert {s.session for s in await store.list_sessions()} == {"s"}
    await store.import_sessions(lines, session="copy")  # the good lines go in
    assert await store.get_messages("copy") == conversation(30)


async def test_an_import_never_writes_over_a_session(store: ContextStore) -> None:
    """A session of that id with other content: SessionExistsError, it stays as it was."""
    await store.append_many("s", [turn(i) for i in range(5)])
    await store.append("taken", turn(99))
    lines = await exported(store, "s")
    with pytest.raises(SessionExistsError):
        await store.import_sessions(lines, session="taken")
    assert await store.get_messages("taken") == [turn(99)]
    with pytest.raises(SessionNotFoundError):
        await exported(store, "nobody")
    with pytest.raises(InvalidIdError):
        await store.import_sessions(lines, session="no/slash")


async def test_one_target_id_takes_one_session(store: ContextStore) -> None:
    """A named target with an input of two sessions is refused; without it both go in."""
    await store.append_many("a", [turn(i) for i in range(3)])
    await store.append_many("b", [turn(i) for i in range(3, 6)])
    lines = [*await exported(store, "a"), *await exported(store, "b")]
    await store.delete("a")
    await store.delete("b")
    with pytest.raises(MalformedArchiveError):
        await store.import_sessions(lines, session="one")
    results = await store.import_sessions(lines)
    assert [r.session for r in results] == ["a", "b"]
    assert await store.get_messages("b") == [turn(i) for i in range(3, 6)]


async def test_quotas_hold_on_import(store: ContextStore) -> None:
    """An import that would pass the session's token quota writes nothing."""
    await store.append_many("s", [turn(i) for i in range(20)])
    lines = await exported(store, "s")
    await store.set_limits(TenantLimits(session_tokens=100))
    with pytest.raises(QuotaExceededError):
        await store.import_sessions(lines, session="copy")
    assert not (await store.info("copy")).exists


async def test_a_forks_export_is_a_plain_session(settings: Settings, tenant: str) -> None:
    """A fork's shared history is exported whole and comes back as a session of its own."""
    small = settings.model_copy(update={"bridge_entries": 20, "bridge_tokens": 500})
    async with ContextStore.from_settings(small, tenant=tenant) as store:
        await store.append_many("s", [turn(i) for i in range(100)])
        await store.fork("s", "f")
        await store.append("f", turn(500))
        lines = await exported(store, "f")
        await store.import_sessions(lines, session="g")
        assert await store.get_messages("g") == [*(turn(i) for i in range(100)), turn(500)]
        assert (await store.info("g")).shared_messages == 0


async def test_sealed_sessions_export_sealed_unless_asked_and_keyed(
    settings: Settings, tenant: str, raw_redis: Redis
) -> None:
    """Sealed by default; in clear only with the key and asked; sealed imports: key and tenant."""
    key = Keyring.generate_key()
    keyed = Settings(
        **{**settings.model_dump(), "encryption_keys": {"k1": key}, "encryption_active_key": "k1"}
    )
    async with (
        ContextStore.from_settings(keyed, tenant=tenant) as store,
        ContextStore.from_settings(settings, tenant=tenant) as keyless,
    ):
        await store.append_many("s", [turn(i) for i in range(10)])
        sealed = await exported(store, "s")
        assert "quick brown" not in "".join(sealed)
        assert "quick brown" in "".join(await exported(store, "s", clear=True))
        with pytest.raises(DecryptionError):
            await exported(keyless, "s", clear=True)
        assert (await exported(keyless, "s"))[1:] == sealed[1:]  # as stored, key or not
        with pytest.raises(MalformedArchiveError, match="no encryption key"):
            await keyless.import_sessions(sealed, session="copy")
        assert not (await keyless.info("copy")).exists
        other = store.for_tenant(tenant + "x")
        with pytest.raises(MalformedArchiveError, match="opens only for it"):
            await other.import_sessions(sealed, session="copy")  # another tenant's seal
        assert not (await other.info("copy")).exists
        await store.import_sessions(sealed, session="copy")  # sealed again for its new home
        assert await store.get_messages("copy") == [turn(i) for i in range(10)]
        for _, fields in await raw_redis.xrange(store.keys("copy").log):
            assert b"quick brown" not in fields[b"m"]
        await other.import_sessions(await exported(store, "s", clear=True), session="copy")
        assert await other.get_messages("copy") == [turn(i) for i in range(10)]


async def test_an_export_reads_in_constant_memory(store: ContextStore) -> None:
    """Peak memory while exporting 8,000 messages is not 4x that of 2,000 (pages, not lists)."""
    peaks = []
    for size in (2_000, 8_000):
        for start in range(0, size, 1_000):
            await store.append_many(f"s{size}", [turn(i) for i in range(start, start + 1_000)])
        tracemalloc.start()
        lines = 0
        async for _ in store.export_session(f"s{size}"):
            lines += 1
        peaks.append(tracemalloc.get_traced_memory()[1])
        tracemalloc.stop()
        assert lines == size + 2
    assert peaks[1] < 1.5 * peaks[0], peaks


async def test_a_summary_line_larger_than_a_message_may_be_is_refused(
    summary_settings: Settings, tenant: str
) -> None:
    """An archive cannot store megabytes in the summary, past every quota: its line is refused."""
    small = summary_settings.model_copy(update={"max_message_bytes": 20_000})
    async with ContextStore.from_settings(small, tenant=tenant) as store:
        await summarized(store, "s", 300)
        lines = await exported(store, "s")
        at = next(i for i, line in enumerate(lines) if json.loads(line)["ctxstore"] == "summary")
        for name in ("ledger", "narrative", "state"):
            record = json.loads(lines[at])
            record.pop(f"{name}_sealed", None)
            record[name] = "x" * 20_001
            bad = [*lines[:at], json.dumps(record), *lines[at + 1 : -1]]
            end = json.loads(lines[-1])
            end.pop("digest", None)
            with pytest.raises(MalformedArchiveError, match=f"summary's {name} is over 20000"):
                await store.import_sessions([*bad, json.dumps(end)], session="copy")
            assert not (await store.info("copy")).exists


async def test_an_endless_import_over_the_quota_is_refused_as_soon_as_it_is_over(
    settings: Settings, tenant: str, raw_redis: Redis
) -> None:
    """Messages past session_bytes end the import there: the rest of the input is not read."""
    capped = settings.model_copy(update={"session_bytes": 100_000})
    read = 0

    def endless() -> Iterator[str]:
        nonlocal read
        header = {"ctxstore": "session", "version": 1, "tenant": tenant, "session": "big"}
        yield json.dumps({**header, "count": 0, "tokens": 0, "epoch": 0, "ttl_seconds": None})
        for i in range(5_000):  # 10 MB, far past the quota (a stand-in for no end at all)
            read += 1
            message = {"role": "user", "content": f"{i} " + "x" * 2_000}
            yield json.dumps({"ctxstore": "message", "id": f"{1_000 + i}-0", "message": message})
        yield json.dumps({"ctxstore": "end", "session": "big", "count": 5_000})

    async with ContextStore.from_settings(capped, tenant=tenant) as store:
        with pytest.raises(QuotaExceededError) as refused:
            await store.import_sessions(endless())
        assert refused.value.quota == "session_bytes"
        assert 45 <= read <= 52  # 100,000 bytes of ~2 KB messages, and not one batch more
        assert not (await store.info("big")).exists
        assert [k async for k in raw_redis.scan_iter(match=f"*{tenant}:big}}*")] == []
