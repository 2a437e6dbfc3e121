"""An append moves a session's expiry only when it is due, and every key of it along.

The promise (README, Retention and deletion; append.lua's ``stretch``): a session's keys
expire no sooner than its TTL after its last write and no later than the TTL plus
min(TTL/10, 60 s) after it; every key of the session that exists expires with meta;
the segments a fork's history starts in outlive the sessions that read them.

Time is never slept through: it is "passed" by moving keys' expiries back (PEXPIREAT),
and absolute expiries are read with PEXPIRETIME. Tests that fail name a defect.
"""

from __future__ import annotations

import pytest
from redis.asyncio import Redis
from support.append_forms import FULL, LEAN, sent
from support.config import BACKENDS
from support.expiry import (
    NINE,
    age,
    change_default,
    expiries,
    fork_settings,
    nine,
    now_ms,
    segment_keys,
    together,
    with_ttl,
)
from support.faults import drop_reply
from support.helpers import SYSTEM, ttl_span, turn
from support.pods import pods_on

from ctxstore import ContextStore, LocalSummarizer, Settings, TenantLimits
from ctxstore._redis.scripts import SCRIPTS


async def written_within(
    raw: Redis, store: ContextStore, session: str, ttl_ms: int, since: int, until: int
) -> None:
    """Written between ``since`` and ``until`` (ms): the session expires within the promise."""
    meta = await together(raw, store, session)
    assert since + ttl_ms <= meta <= until + ttl_span(ttl_ms), (
        meta - since,
        ttl_ms,
        ttl_span(ttl_ms),
    )


# -- keys other paths make between stretches -------------------------------------------------


@pytest.mark.parametrize("backend", BACKENDS, indirect=True)
async def test_keys_other_paths_make_between_stretches_expire_with_meta(
    settings: Settings, tenant: str, raw_redis: Redis
) -> None:
    """Rewind, summary, checkpoint, pin, search index and anchor: all expire with meta.

    Each path copies meta's expiry (or sets the TTL on every key), so after any of them
    the nine keys expire together; an append due to move them moves all nine.
    """
    ttl = 600_000
    config = with_ttl(settings, 600, summary_trigger_tokens=0, summary_keep_tokens=20)
    async with ContextStore.from_settings(config, tenant=tenant) as store:
        await store.append("s", SYSTEM)
        results = await store.append_many("s", [turn(i) for i in range(60)])
        await store.rewind("s", results[49].entry_id)  # a branch, at the TTL exactly
        await together(raw_redis, store, "s")
        await age(raw_redis, nine(store, "s"), 1_000)  # due: the rewind set the TTL only
        since = await now_ms(raw_redis)
        await store.append("s", turn(60))
        until = await now_ms(raw_redis)
        await written_within(raw_redis, store, "s", ttl, since, until)
        assert (await store.summarize("s", LocalSummarizer())).status == "committed"
        await store.checkpoint("s")  # with the summary's copy
        await store.pin("s", results[10].entry_id)
        assert await store.search("s", "quick fox")
        await store.view("s", token_budget=300)
        await store.append("s", turn(61))  # not due (the full form: a default TTL): nothing moves
        at = await expiries(raw_redis, store, "s")
        assert set(at) == set(NINE), at
        await written_within(raw_redis, store, "s", ttl, since, until)
        await age(raw_redis, nine(store, "s"), 61_000)  # a stretch's slack and a second on
        since = await now_ms(raw_redis)
        await store.append("s", turn(62))
        until = await now_ms(raw_redis)
        await written_within(raw_redis, store, "s", ttl, since, until)


async def test_replace_leaves_every_key_expiring_with_meta(
    settings: Settings, tenant: str, raw_redis: Redis
) -> None:
    """A replace sets the TTL on log, meta and keep and drops the rest: they go together."""
    async with ContextStore.from_settings(with_ttl(settings, 600), tenant=tenant) as store:
        await store.append_many("s", [SYSTEM, turn(0), turn(1)])
        await store.checkpoint("s")
        assert await store.search("s", "quick fox")
        since = await now_ms(raw_redis)
        await store.replace("s", [SYSTEM, turn(7)])
        until = await now_ms(raw_redis)
        await written_within(raw_redis, store, "s", 600_000, since, until)
        await store.checkpoint("s")
        await together(raw_redis, store, "s")


async def test_an_import_expires_whole_and_its_next_due_append_moves_every_key(
    settings: Settings, tenant: str, raw_redis: Redis
) -> None:
    """An import sets the TTL on the keys it makes; a due append then moves them all."""
    config = with_ttl(settings, 600, summary_trigger_tokens=0, summary_keep_tokens=20)
    async with ContextStore.from_settings(config, tenant=tenant) as store:
        results = await store.append_many("s", [SYSTEM, turn(0), turn(1), turn(2)])
        await store.pin("s", results[1].entry_id)
        assert (await store.summarize("s", LocalSummarizer())).status == "committed"
        await store.checkpoint("s")
        lines = [line async for line in store.export_session("s")]
        since = await now_ms(raw_redis)
        await store.import_sessions(lines, session="t")
        until = await now_ms(raw_redis)
        made = {"log", "meta", "keep", "view", "checkpoints", "checkpoint_summaries"}
        assert made <= set(await expiries(raw_redis, store, "t"))
        await written_within(raw_redis, store, "t", 600_000, since, until)
        await age(raw_redis, nine(store, "t"), 1_000)
        since = await now_ms(raw_redis)
        await store.append("t", turn(3))
        until = await now_ms(raw_redis)
        await written_within(raw_redis, store, "t", 600_000, since, until)


# -- a keep copy, a lost reply, set_ttl ------------------------------------------------------


@pytest.mark.parametrize("backend", BACKENDS, indirect=True)
async def test_a_keep_copy_while_no_move_is_due_moves_every_key_together(
    settings: Settings, tenant: str, raw_redis: Redis
) -> None:
    """A keep copy made while no move is due moves every key, with meta.

    Own TTL, 630 s left: a plain append is lean and moves nothing; a system or a pinned
    one (full form) makes the keep hash and moves all nine to the stretched span.
    """
    async with ContextStore.from_settings(settings, tenant=tenant) as store:
        await store.append("s", turn(0))
        await store.checkpoint("s")
        await store.set_ttl("s", 600)
        await age(raw_redis, nine(store, "s"), 1_000)  # a second on: due
        await store.append("s", turn(1))  # stretched
        await age(raw_redis, nine(store, "s"), 30_000)  # 630 s left: not due
        before = await expiries(raw_redis, store, "s")
        runs = sent(store)
        await store.append("s", turn(2))
        assert runs == [LEAN]
        assert await expiries(raw_redis, store, "s") == before
        assert not await raw_redis.exists(store.keys("s").keep)
        for message, pinned in ((SYSTEM, False), (turn(3), True)):
            assert await raw_redis.pttl(store.keys("s").meta) > 620_000  # not due
            runs.clear()
            since = await now_ms(raw_redis)
            await store.append("s", message, pinned=pinned)
            until = await now_ms(raw_redis)
            assert runs == [FULL]
            made = {"log", "meta", "keep", "checkpoints"}
            assert set(await expiries(raw_redis, store, "s")) == made
            await written_within(raw_redis, store, "s", 600_000, since, until)
            await age(raw_redis, nine(store, "s"), 30_000)  # 630 s left again


async def test_a_lost_reply_of_a_due_stretch_is_answered_and_moves_nothing_more(
    settings: Settings, tenant: str, raw_redis: Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A due stretch whose reply was lost: the retry is answered, the expiry holds.

    The full form stretched and its reply was lost; the retry is a duplicate and moves
    nothing, and the expiry the first attempt set keeps the promise for that write.
    """
    async with ContextStore.from_settings(settings, tenant=tenant) as store:
        await store.append("s", turn(0))
        await store.checkpoint("s")
        await store.set_ttl("s", 600)
        await age(raw_redis, nine(store, "s"), 1_000)  # due
        runs = sent(store)
        dropped = drop_reply(store, monkeypatch, SCRIPTS.append, keys=FULL[0])
        since = await now_ms(raw_redis)
        [result] = await store.append_many("s", [turn(1)])
        until = await now_ms(raw_redis)
        assert dropped == [True] and result.duplicate and result.seq == 2
        assert runs == [LEAN, FULL, FULL]
        await written_within(raw_redis, store, "s", 600_000, since, until)


async def test_a_shorter_ttl_from_set_ttl_applies_at_once_and_to_later_appends(
    settings: Settings, tenant: str, raw_redis: Redis
) -> None:
    """set_ttl(600) then set_ttl(60): the old, longer expiry does not survive."""
    async with ContextStore.from_settings(settings, tenant=tenant) as store:
        await store.append_many("s", [SYSTEM, turn(0)])
        await store.checkpoint("s")
        await store.set_ttl("s", 600)
        await store.append("s", turn(1))
        since = await now_ms(raw_redis)
        await store.set_ttl("s", 60)
        await age(raw_redis, nine(store, "s"), 1_000)  # a second on: due
        await store.append("s", turn(2))  # stretched
        until = await now_ms(raw_redis)
        await written_within(raw_redis, store, "s", 60_000, since, until)
        expiry = await together(raw_redis, store, "s")
        await store.append("s", turn(3))  # not due: nothing moves
        assert await together(raw_redis, store, "s") == expiry


async def test_set_ttl_none_keeps_every_key_for_ever_whatever_the_pods_default(
    settings: Settings, tenant: str, raw_redis: Redis
) -> None:
    """After set_ttl(None) no write gives any key an expiry.

    Neither a pod with a default TTL nor one without, nor a keep copy, a pin, a
    checkpoint or the search index.
    """
    async with pods_on(with_ttl(settings, 600), settings, tenant=tenant) as (ttl_pod, plain):
        results = await ttl_pod.append_many("s", [SYSTEM, turn(0)])
        await ttl_pod.checkpoint("s")
        await ttl_pod.set_ttl("s", None)
        await ttl_pod.append("s", turn(1))
        await plain.append("s", turn(2))
        await ttl_pod.append("s", SYSTEM)
        await plain.append("s", turn(3), pinned=True)
        await ttl_pod.pin("s", results[1].entry_id)
        await ttl_pod.checkpoint("s")
        assert await ttl_pod.search("s", "quick fox")
        assert await together(raw_redis, ttl_pod, "s") == -1


# -- forks and their segments ----------------------------------------------------------------


async def test_a_freeze_that_leaves_no_live_log_is_stretched_by_the_next_append(
    settings: Settings, tenant: str, raw_redis: Redis
) -> None:
    """A freeze that leaves no live log: the next append gives the new log meta's expiry.

    A one-entry log too large to copy is frozen whole (own TTL). The next (lean) append
    finds PTTL(log) -2, is refused as due, and the full form moves all nine keys; the
    segment the source now reads outlives it.
    """
    async with ContextStore.from_settings(fork_settings(settings, None), tenant=tenant) as store:
        await store.append("s", {"role": "user", "content": "word " * 3_000})
        await store.set_ttl("s", 600)
        await store.append("s", SYSTEM)
        await store.pop("s")  # the log holds the large message alone again
        await store.fork("s", "f")
        keys = store.keys("s")
        segments = await segment_keys(store, "s")
        assert segments and not await raw_redis.exists(keys.log)
        runs = sent(store)
        since = await now_ms(raw_redis)
        await store.append("s", turn(0))
        until = await now_ms(raw_redis)
        assert runs == [LEAN, FULL]
        assert await raw_redis.exists(keys.log)
        await written_within(raw_redis, store, "s", 600_000, since, until)
        meta = await raw_redis.pexpiretime(keys.meta)
        for key in segments:  # the source reads them: they outlive it
            assert await raw_redis.pttl(key) == -1 or await raw_redis.pexpiretime(key) >= meta


async def test_fork_segments_outlive_the_fork_across_due_stretches(
    settings: Settings, tenant: str, raw_redis: Redis
) -> None:
    """A fork's segments outlast it each time its expiry is moved.

    Time is passed for the keys (PEXPIREAT) and for the pod's keep-alive memo alike.
    """
    ttl = 100_000
    async with ContextStore.from_settings(fork_settings(settings, 100), tenant=tenant) as store:
        await store.append_many("s", [turn(i) for i in range(100)])
        await store.fork("s", "f")
        segments = await segment_keys(store, "f")
        assert segments
        for step in range(3):
            since = await now_ms(raw_redis)
            await store.append("f", turn(100 + step))
            until = await now_ms(raw_redis)
            await written_within(raw_redis, store, "f", ttl, since, until)
            fork_ends = await raw_redis.pexpiretime(store.keys("f").meta)
            for key in segments:
                assert await raw_redis.pexpiretime(key) > fork_ends, (step, key)
            passed = 10_001  # a slack on: due again
            await age(raw_redis, [*nine(store, "f"), *segments, *nine(store, "s")], passed)
            last = store._lineage._stretched.get("f")
            assert last is not None
            store._lineage._stretched.put("f", (last[0] - passed / 1000, last[1]))


async def test_a_raised_tenant_ttl_stretches_a_fork_s_segments_at_once(
    settings: Settings, tenant: str, raw_redis: Redis
) -> None:
    """A raised tenant TTL stretches a fork's segments at the fork's next append.

    The tenant TTL goes from 100 s to 1,000 s. The fork's next append is due (PTTL
    ~110 s < 1,000 s) and moves its nine keys to 1,060 s. Lineage.keep_alive had
    stretched the segments under a second before, for the old TTL: it skipped them
    (they stayed at ~120 s and expired ~940 s before the fork, ~880 s before it
    stretched) until it learned to stretch again whenever the TTL differs.
    """
    async with ContextStore.from_settings(fork_settings(settings, None), tenant=tenant) as store:
        await store.set_limits(TenantLimits(ttl_seconds=100))
        await store.append_many("s", [turn(i) for i in range(100)])
        await store.fork("s", "f")
        await store.append("f", turn(100))
        await store.set_limits(TenantLimits(ttl_seconds=1_000))
        await store.append("f", turn(101))
        fork_ends = await raw_redis.pexpiretime(store.keys("f").meta)
        segments = await segment_keys(store, "f")
        left = {key[-6:]: await raw_redis.pexpiretime(key) - fork_ends for key in segments}
        assert all(v > 0 for v in left.values()), f"segment expiry minus the fork's: {left}"


# -- the default TTL changed under a session -------------------------------------------------


SOURCES = ["tenant limits", "settings of another pod"]


@pytest.mark.parametrize("source", SOURCES)
async def test_a_lowered_default_ttl_bounds_the_session_at_the_next_append(
    settings: Settings, tenant: str, raw_redis: Redis, source: str
) -> None:
    """A default TTL lowered from 600 s to 60 s bounds the session by 66 s at the next append.

    The change as first written failed this: a plain append found PTTL(log) ~660,000 ms,
    not below 60,000, so moved nothing, and the session lasted 659,999 ms after its last
    write (promised: 66,000). append.lua now also moves the keys when they expire later
    than the span; this keeps it so.
    """
    async with change_default(settings, tenant, source, 600, 60) as store:
        since = await now_ms(raw_redis)
        for i in range(1, 4):
            await store.append("s", turn(i))
        until = await now_ms(raw_redis)
        meta = await together(raw_redis, store, "s")
        assert meta <= until + ttl_span(60_000), f"expires {meta - until} ms after the write"
        assert meta >= since + 60_000


@pytest.mark.parametrize("source", SOURCES)
async def test_a_raised_default_ttl_is_honoured_by_the_next_append(
    settings: Settings, tenant: str, raw_redis: Redis, source: str
) -> None:
    """60 s to 600 s: the next append is due (PTTL < 600 s) and moves all nine keys."""
    async with change_default(settings, tenant, source, 60, 600) as store:
        since = await now_ms(raw_redis)
        await store.append("s", turn(1))
        until = await now_ms(raw_redis)
        await written_within(raw_redis, store, "s", 600_000, since, until)


@pytest.mark.parametrize("source", SOURCES)
async def test_a_removed_default_ttl_keeps_the_session_from_the_next_append(
    settings: Settings, tenant: str, raw_redis: Redis, source: str
) -> None:
    """A default TTL removed (600 s to none): the next append keeps the session for ever.

    It once did not: appends found no TTL and touched no expiry, so the keys kept the
    old one, and a session written all along still expired ~10 s after this write. The
    append now reads meta's expiry when no TTL is in force: the lean form is refused
    and the full one takes every key's expiry away, once; later appends are lean again.
    """
    async with change_default(settings, tenant, source, 600, None) as store:
        keys = store.keys("s")
        left = await raw_redis.pttl(keys.meta)
        await age(raw_redis, nine(store, "s"), left - 10_000)  # written all along: 10 s left
        forms = sent(store)
        await store.append("s", turn(1))
        assert await together(raw_redis, store, "s") == -1, "a key still expires"
        assert forms == [LEAN, FULL]
        await store.append("s", turn(2))
        assert forms[2:] == [LEAN]
        assert await together(raw_redis, store, "s") == -1
