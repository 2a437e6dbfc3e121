"""Checkpoints on real Redis: what they record, their cost, quota, lifetime and races."""

from __future__ import annotations

import asyncio

import pytest
from redis.asyncio import Redis
from support.config import BACKENDS
from support.faults import drop_reply
from support.helpers import conversation
from support.servers import Monitor, ServerPool
from support.tenant import raw_bytes

from ctxstore import (
    ContextStore,
    EntryNotFoundError,
    InvalidInputError,
    LocalSummarizer,
    QuotaExceededError,
    SessionNotFoundError,
    Settings,
    TenantLimits,
)
from ctxstore._redis.scripts import SCRIPTS

pytestmark = pytest.mark.parametrize("backend", BACKENDS, indirect=True)


def user(i: int) -> dict[str, str]:
    return {"role": "user", "content": f"message {i} about the deploy"}


async def test_a_checkpoint_records_the_position_and_the_summary(
    summary_settings: Settings, tenant: str
) -> None:
    """Entry, seq, epoch, counters and the summary's coverage are those of the moment."""
    async with ContextStore.from_settings(summary_settings, tenant=tenant) as store:
        await store.append_many("s", conversation(40))
        await store.summarize("s", LocalSummarizer())
        info = await store.info("s")
        point = await store.checkpoint("s", name="before the refactor")
        assert point.checkpoint_id == "cp-1" and point.name == "before the refactor"
        assert (point.seq, point.epoch, point.count, point.tokens) == (
            info.seq,
            info.epoch,
            info.count,
            info.tokens,
        )
        assert point.entry_id == (await store.tail("s", 1))[0].entry_id
        assert point.summary_covers == info.summary_covers is not None
        assert point.branch is None
        again = await store.checkpoint("s")
        assert again.checkpoint_id == "cp-2" and again.name is None
        assert [c.checkpoint_id for c in await store.checkpoints("s")] == ["cp-1", "cp-2"]


async def test_checkpoints_survive_summaries(summary_settings: Settings, tenant: str) -> None:
    """A summary committed after a checkpoint leaves it, and its copy, as they were."""
    async with ContextStore.from_settings(summary_settings, tenant=tenant) as store:
        await store.append_many("s", conversation(20))
        await store.summarize("s", LocalSummarizer())
        point = await store.checkpoint("s")
        await store.append_many("s", conversation(30)[1:])
        outcome = await store.summarize("s", LocalSummarizer())
        assert outcome.covers_upto is not None and outcome.covers_upto != point.summary_covers
        assert await store.checkpoints("s") == [point]


async def test_the_count_quota_refuses_a_checkpoint_and_writes_nothing(store: ContextStore) -> None:
    """Past the tenant's ``checkpoints`` limit: QuotaExceededError; a delete makes room."""
    await store.set_limits(TenantLimits(checkpoints=2))
    await store.append("s", user(0))
    first = await store.checkpoint("s")
    await store.checkpoint("s")
    bytes_before = await raw_bytes(store, "s")
    with pytest.raises(QuotaExceededError) as refused:
        await store.checkpoint("s")
    assert refused.value.quota == "checkpoints" and refused.value.limit == 2
    assert len(await store.checkpoints("s")) == 2
    assert await raw_bytes(store, "s") == bytes_before
    assert await store.delete_checkpoint("s", first.checkpoint_id)
    assert not await store.delete_checkpoint("s", first.checkpoint_id)
    assert (await store.checkpoint("s")).checkpoint_id == "cp-3"


async def test_a_summary_copy_counts_against_the_byte_quota(
    summary_settings: Settings, tenant: str
) -> None:
    """The copy's bytes are added to the session's, and a delete gives them back."""
    async with ContextStore.from_settings(summary_settings, tenant=tenant) as store:
        await store.append_many("s", conversation(20))
        await store.summarize("s", LocalSummarizer())
        before = await raw_bytes(store, "s")
        point = await store.checkpoint("s")
        grown = await raw_bytes(store, "s") - before
        assert grown > 100  # the record and the summary's ledger
        await store.delete_checkpoint("s", point.checkpoint_id)
        assert await raw_bytes(store, "s") == before


async def test_bad_input_is_refused(store: ContextStore) -> None:
    """A missing session, a bad name or a malformed id raise typed errors."""
    with pytest.raises(SessionNotFoundError):
        await store.checkpoint("nobody")
    await store.append("s", user(0))
    for name in ("", "x" * 201, "line\nbreak", 7):
        with pytest.raises(InvalidInputError):
            await store.checkpoint("s", name=name)  # type: ignore[arg-type]
    for bad in ("cp-0", "cp-x", "1-0", "", "cp-1 ", None):
        with pytest.raises(InvalidInputError):
            await store.delete_checkpoint("s", bad)  # type: ignore[arg-type]
    with pytest.raises(EntryNotFoundError):
        await store._checkpoints.get("s", "cp-9")
    assert await store.checkpoints("s") == []


async def test_checkpoints_live_and_die_with_their_session(
    store: ContextStore, raw_redis: Redis
) -> None:
    """They take the session's TTL, and go with replace, clear, delete and forget."""
    keys = store.keys("s")
    await store.append("s", user(0))
    await store.set_ttl("s", 600)
    await store.checkpoint("s")
    assert 0 < await raw_redis.pttl(keys.checkpoints) <= 600_000
    await store.set_ttl("s", None)
    assert await raw_redis.pttl(keys.checkpoints) == -1
    await store.replace("s", [user(1)])
    assert await store.checkpoints("s") == []
    await store.checkpoint("s")
    await store.clear("s")
    assert await store.checkpoints("s") == []
    await store.append("s", user(2))
    await store.checkpoint("s")
    await store.delete("s")
    assert not await raw_redis.exists(keys.checkpoints)
    await store.append("t", user(3))
    await store.checkpoint("t")
    await store.forget_tenant()
    assert not await raw_redis.exists(store.keys("t").checkpoints)


async def test_a_pop_takes_the_checkpoints_at_the_message_it_took(store: ContextStore) -> None:
    """A checkpoint at the popped entry points at nothing: it goes; older ones stay."""
    await store.append("s", user(0))
    kept = await store.checkpoint("s")
    await store.append("s", user(1))
    await store.checkpoint("s")
    await store.pop("s")
    assert await store.checkpoints("s") == [kept]


async def test_a_retried_checkpoint_is_not_doubled(
    store: ContextStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A checkpoint whose reply was lost is answered, on retry, with the one it made."""
    await store.append("s", user(0))
    dropped = drop_reply(store, monkeypatch, SCRIPTS.checkpoint)
    point = await store.checkpoint("s")
    assert dropped == [True]
    assert await store.checkpoints("s") == [point]


async def test_checkpoints_racing_appends_record_true_positions(
    settings: Settings, tenant: str
) -> None:
    """Pods appending and checkpointing at once: each checkpoint's counters are its entry's."""
    pods = [ContextStore.from_settings(settings, tenant=tenant) for _ in range(4)]
    try:

        async def pod(number: int) -> list[str]:
            made = []
            for i in range(25):
                await pods[number].append("s", user(number * 100 + i))
                if i % 5 == number % 5:
                    made.append((await pods[number].checkpoint("s")).checkpoint_id)
            return made

        made = [c for ids in await asyncio.gather(*(pod(n) for n in range(4))) for c in ids]
        points = await pods[0].checkpoints("s")
        assert sorted(c.checkpoint_id for c in points) == sorted(made)
        assert len(set(made)) == len(made)
        history = [m.entry_id async for m in pods[0].iter_history("s")]
        for point in points:
            position = history.index(point.entry_id) + 1
            assert point.count == position
            stored = await pods[0].read("s", limit=position)
            assert point.tokens == sum(m.tokens for m in stored.messages)
    finally:
        for each in pods:
            await each.aclose()


async def test_a_checkpoint_reads_nothing_of_the_stream(servers: ServerPool, backend: str) -> None:
    """Under MONITOR, its script runs the same few commands at 10 and at 2,000 messages."""
    if backend != "single":
        pytest.skip("one private server is enough to watch the commands")
    server = servers.start()
    settings = Settings(redis_url=server.url(), key_prefix="cp", summary_trigger_tokens=0)
    async with ContextStore.from_settings(settings, tenant="acme") as store:
        commands = []
        for size in (10, 2_000):
            session = f"s{size}"
            for start in range(0, size, 500):
                batch = range(start, min(size, start + 500))
                await store.append_many(session, [user(i) for i in batch])
            async with Monitor(server.port) as monitor:
                await store.checkpoint(session)
                logged = await monitor.drain()
            inner = [e.args[0].upper() for e in logged if e.source == "lua"]
            assert not any(name.startswith(b"X") for name in inner), inner
            commands.append(inner)
        assert commands[0] == commands[1]
