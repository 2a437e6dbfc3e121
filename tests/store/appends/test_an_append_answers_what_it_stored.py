"""An applied append's one-string reply says exactly what the stream and meta hold.

append.lua answers an applied append with one string of words (the chain, which holds
spaces, last); ``writes._appended`` splits it back into the old list. Whatever the
append (batches of 1 to 500 mixing duplicates and new messages, lost replies retried in
the lean and the full form, single and batch, chains of 1 to 3 segments with a TTL, a
removed TTL (-1), a due summary generation, system, pinned and tool messages, FCALL, the
cluster, odd idempotency keys and ids at their longest), every AppendResult is checked
against the stream and meta.
"""

from __future__ import annotations

import itertools
from typing import Any

import pytest
from redis.asyncio import Redis
from support.append_forms import FULL, LEAN, sent
from support.config import BACKENDS
from support.expiry import fork_settings, segment_keys, shorten, with_ttl
from support.faults import drop_reply
from support.helpers import oa_call, oa_result, system, turn
from support.servers import ServerPool

from ctxstore import (
    ContextStore,
    Settings,
    TenantLimits,
)
from ctxstore._layout.chain import Chain
from ctxstore._parts.writes import _appended
from ctxstore._redis.functions import load_functions
from ctxstore._redis.scripts import SCRIPTS

# -- what Redis stored, against what the append answered -----------------------------------


async def stored(raw: Redis, store: ContextStore, session: str) -> tuple[dict[str, Any], dict]:
    """The session's stream (entry id -> fields) and meta hash, decoded."""
    keys = store.keys(session)
    log = {
        eid.decode(): {k.decode(): v for k, v in fields.items()}
        for eid, fields in await raw.xrange(keys.log)
    }
    meta = {
        k.decode(): v.decode(errors="replace") for k, v in (await raw.hgetall(keys.meta)).items()
    }
    return log, meta


async def check_against_redis(
    raw: Redis, store: ContextStore, session: str, results: list[Any], messages: list[dict]
) -> None:
    """Each result names an entry of the stream holding its message, with its seq and epoch."""
    log, meta = await stored(raw, store, session)
    epoch = int(meta.get("epoch", 0))
    codec_msgs = {r.entry_id: m for r, m in zip(results, messages, strict=True)}
    for result in results:
        assert result.entry_id in log, (result, list(log)[-3:])
        entry = log[result.entry_id]
        assert int(entry["n"]) == result.seq, (result, entry.get("n"))  # no rewind: n == seq
        assert result.epoch == epoch
    read = {m.entry_id: m.message for m in (await store.read(session, limit=10_000)).messages}
    for entry_id, message in codec_msgs.items():
        assert read[entry_id] == message, entry_id
    fresh = [r for r in results if not r.duplicate]
    if fresh:
        assert int(meta["seq"]) >= max(r.seq for r in fresh)


# -- the parser on its own -------------------------------------------------------------------


def test_the_parser_keeps_empty_words_and_a_chain_with_spaces_whole() -> None:
    """No TTL (two empty words), two messages, a chain of three segments: the old list."""
    chain = b"a:1:5 b:2:9 c:3:12"
    reply = b"ok 0 1   1-0 1 0 0 1-1 2 0 1 " + chain
    assert _appended(reply, 2) == [b"ok", 0, 1, chain, b"", b"", b"1-0", 1, 0, 0, b"1-1", 2, 0, 1]
    reply = b"ok 17 0 1e+08 -1 9-0 4 2 0 "
    assert _appended(reply, 1) == [b"ok", 17, 0, b"", 100_000_000, -1, b"9-0", 4, 2, 0]


# -- batches mixing duplicates and new messages -----------------------------------------------


ODD_KEYS = ["a key with spaces", "  lead", "trail  ", "ünï cödé ✓ 𝄞", "tab\there", "x" * 200]


@pytest.mark.parametrize("backend", BACKENDS, indirect=True)
@pytest.mark.parametrize("size", [1, 2, 50, 500])
@pytest.mark.parametrize("ttl", [None, 600])
async def test_a_batch_mixing_duplicates_answers_what_the_stream_holds(
    settings: Settings, tenant: str, raw_redis: Redis, size: int, ttl: int | None
) -> None:
    """Half the keys seen before (odd ones too), half new: each result is its stored entry."""
    async with ContextStore.from_settings(with_ttl(settings, ttl), tenant=tenant) as store:
        keys = [ODD_KEYS[i] if i < len(ODD_KEYS) else f"k {i} ✓" for i in range(size)]
        msgs = [turn(i) for i in range(size)]
        seen = list(range(0, size, 2))  # every other one written first
        first = await store.append_many(
            "s", [msgs[i] for i in seen], idempotency_keys=[keys[i] for i in seen]
        )
        before = dict(zip(seen, first, strict=True))
        results = await store.append_many("s", msgs, idempotency_keys=keys)
        assert len(results) == size
        next_seq = len(seen)
        for i, result in enumerate(results):
            if i in before:
                old = before[i]
                assert result.duplicate
                assert (result.entry_id, result.seq, result.epoch) == (
                    old.entry_id,
                    old.seq,
                    old.epoch,
                )
            else:
                next_seq += 1
                assert not result.duplicate and result.seq == next_seq, (i, result)
        await check_against_redis(raw_redis, store, "s", results, msgs)
        log, meta = await stored(raw_redis, store, "s")
        assert len(log) == size and int(meta["seq"]) == size
        # and a retry of the whole batch: every one a duplicate, the same answers
        again = await store.append_many("s", msgs, idempotency_keys=keys)
        assert [(r.entry_id, r.seq, r.epoch, r.duplicate) for r in again] == [
            (r.entry_id, r.seq, r.epoch, True) for r in results
        ]
        if ttl:
            assert 0 < await raw_redis.pttl(store.keys("s").meta) <= (ttl + 60) * 1000


# -- a lost reply, retried ----------------------------------------------------------------------


@pytest.mark.parametrize("backend", BACKENDS, indirect=True)
@pytest.mark.parametrize("form", ["lean", "full"])
@pytest.mark.parametrize("n", [1, 3, 60])
async def test_a_lost_reply_is_answered_with_the_entries_written(
    settings: Settings,
    tenant: str,
    raw_redis: Redis,
    monkeypatch: pytest.MonkeyPatch,
    form: str,
    n: int,
) -> None:
    """Applied, its reply lost, retried: the entries the first attempt wrote, once each."""
    async with ContextStore.from_settings(settings, tenant=tenant) as store:
        await store.append("s", turn(-1))
        if form == "full":
            await store.set_ttl("s", 600)
            await shorten(raw_redis, store, "s")  # as if set a while ago: the full form is due
        msgs = [turn(i) for i in range(n)]
        runs = sent(store)
        written: list[list[str]] = []

        async def between() -> None:
            log, _ = await stored(raw_redis, store, "s")
            written.append(list(log)[1:])

        dropped = drop_reply(
            store, monkeypatch, SCRIPTS.append, between, keys=(FULL if form == "full" else LEAN)[0]
        )
        results = await store.append_many("s", msgs)
        assert dropped == [True], runs
        assert runs[-1] == (FULL if form == "full" else LEAN)
        assert [r.entry_id for r in results] == written[0]
        assert [r.seq for r in results] == list(range(2, n + 2))
        assert all(r.duplicate for r in results)
        await check_against_redis(raw_redis, store, "s", results, msgs)
        log, _ = await stored(raw_redis, store, "s")
        assert len(log) == n + 1


@pytest.mark.parametrize("backend", BACKENDS, indirect=True)
@pytest.mark.parametrize("n", [1, 5])
async def test_a_lost_reply_of_the_creating_append_is_answered_once(
    settings: Settings, tenant: str, raw_redis: Redis, monkeypatch: pytest.MonkeyPatch, n: int
) -> None:
    """The creating append (full form, reservation, default TTL) applied, its reply lost.

    The retry answers the entries written; the session is listed and expires.
    """
    async with ContextStore.from_settings(with_ttl(settings, 300), tenant=tenant) as store:
        msgs = [system("s"), *(turn(i) for i in range(n - 1))]
        dropped = drop_reply(store, monkeypatch, SCRIPTS.append, keys=FULL[0])
        results = await store.append_many("new", msgs)
        assert dropped == [True]
        assert [r.seq for r in results] == list(range(1, n + 1))
        await check_against_redis(raw_redis, store, "new", results, msgs)
        assert "new" in [s.session for s in await store.list_sessions()]
        assert 290_000 < await raw_redis.pttl(store.keys("new").meta) <= 330_000


# -- chains of segments, with a TTL ---------------------------------------------------------


@pytest.mark.parametrize("backend", BACKENDS, indirect=True)
@pytest.mark.parametrize("depth", [1, 2, 3])
async def test_a_fork_chains_segments_are_stretched_and_its_results_are_stored(
    settings: Settings, tenant: str, raw_redis: Redis, depth: int
) -> None:
    """A fork of a fork of a fork (1-3 segments): single and batch appends answer right.

    Every segment outlives the session again.
    """
    config = fork_settings(settings, None)
    async with ContextStore.from_settings(config, tenant=tenant) as forker:
        await forker.set_limits(TenantLimits(ttl_seconds=100))
        names = ["s", "f1", "f2", "f3"][: depth + 1]
        await forker.append_many(names[0], [turn(i) for i in range(100)])
        for i, (src, dst) in enumerate(itertools.pairwise(names)):
            await forker.fork(src, dst)
            if dst != names[-1]:
                await forker.append_many(dst, [turn(100 * (i + 1) + j) for j in range(100)])
        last = names[-1]
        (raw_chain,) = await forker._connection.transaction(
            [("HGET", forker.keys(last).meta, "chain")], key=forker.keys(last).meta
        )
        assert len(Chain.parse(raw_chain).segments) == depth
        assert raw_chain.count(b" ") == depth - 1
        segs = await segment_keys(forker, last)
        for key in segs:
            await raw_redis.pexpire(key, 5_000)
    async with ContextStore.from_settings(config, tenant=tenant) as pod:
        one = await pod.append(last, turn(900), idempotency_key="one")
        batch_msgs = [turn(901), turn(900), oa_call("c 1"), oa_result("c 1"), system("sys")]
        batch = await pod.append_many(
            last, batch_msgs, idempotency_keys=["two", "one", "three", "four", "five"]
        )
    assert batch[1].duplicate and batch[1].entry_id == one.entry_id
    assert [r.seq for r in batch] == [one.seq + 1, one.seq, one.seq + 2, one.seq + 3, one.seq + 4]
    for key in segs:
        assert await raw_redis.pttl(key) > 100_000, key
    meta_left = await raw_redis.pttl(forker.keys(last).meta)
    assert 100_000 - 2_000 < meta_left <= 110_000
    log, meta = await stored(raw_redis, forker, last)
    assert meta["chain"] == raw_chain.decode()
    assert int(meta["seq"]) == one.seq + 4
    base = int(log[one.entry_id]["n"]) - one.seq  # a fork's seq counts its own writes
    for r in (one, *batch):
        assert r.entry_id in log and int(log[r.entry_id]["n"]) == base + r.seq
        assert r.epoch == int(meta.get("epoch", 0))
    async with ContextStore.from_settings(config, tenant=tenant) as reader:
        history = (await reader.read(last, limit=10_000)).messages
    by_id = {m.entry_id: m.message for m in history}
    assert by_id[one.entry_id] == turn(900)
    for r, m in zip(batch, batch_msgs, strict=True):
        assert by_id[r.entry_id] == m


# -- a TTL removed: -1, and the segments last for ever --------------------------------------


@pytest.mark.parametrize("backend", BACKENDS, indirect=True)
@pytest.mark.parametrize("n", [1, 4])
async def test_a_removed_default_ttl_goes_with_the_next_append_and_its_segments(
    settings: Settings, tenant: str, raw_redis: Redis, n: int
) -> None:
    """Default TTL removed: the append's reply says -1; keys and segments never expire."""
    config = fork_settings(settings, None)
    async with ContextStore.from_settings(config, tenant=tenant) as forker:
        await forker.set_limits(TenantLimits(ttl_seconds=100))
        await forker.append_many("s", [turn(i) for i in range(100)])
        await forker.fork("s", "f")
        await forker.append_many("f", [turn(i) for i in range(100, 200)])
        await forker.fork("f", "g")
        await forker.set_limits(TenantLimits())
        segs = await segment_keys(forker, "g")
    assert len(segs) == 4
    for key in segs:
        assert await raw_redis.pttl(key) > 0, key
    async with ContextStore.from_settings(config, tenant=tenant) as pod:
        results = await pod.append_many("g", [turn(1000 + i) for i in range(n)])
        assert [r.duplicate for r in results] == [False] * n
        for key in (*segs, pod.keys("g").meta, pod.keys("g").log):
            assert await raw_redis.pttl(key) == -1, key
        log, _ = await stored(raw_redis, pod, "g")
        assert all(r.entry_id in log for r in results)


@pytest.mark.parametrize("backend", BACKENDS, indirect=True)
async def test_a_session_ttl_at_the_most_reads_back_whole(
    settings: Settings, tenant: str, raw_redis: Redis
) -> None:
    """A TTL of 100 years (stored by set_ttl as a Lua number): the writer parses it.

    The next appends stay lean (the reply's TTL and ms left make a sane memo).
    """
    from ctxstore._layout.validate import MAX_TTL_SECONDS

    async with ContextStore.from_settings(settings, tenant=tenant) as store:
        await store.append("s", turn(0))
        await store.set_ttl("s", MAX_TTL_SECONDS)
        stored_ttl = await raw_redis.hget(store.keys("s").meta, "ttl")
        # Within the ms of set_ttl the keys' time left can equal the TTL: the first append
        # would then move nothing and leave the memo no time for the lean form.
        await shorten(raw_redis, store, "s")
        runs = sent(store)
        first = await store.append("s", turn(1))
        second = await store.append("s", turn(2))
        assert (first.seq, second.seq) == (2, 3)
        assert runs[-1] == LEAN, (runs, stored_ttl)
        assert await raw_redis.pttl(store.keys("s").meta) > (MAX_TTL_SECONDS - 10) * 1000


# -- a summary due --------------------------------------------------------------------------------


@pytest.mark.parametrize("backend", BACKENDS, indirect=True)
@pytest.mark.parametrize("batch", [1, 30])
async def test_a_due_generation_is_the_one_meta_holds(
    summary_settings: Settings, tenant: str, raw_redis: Redis, batch: int, monkeypatch: Any
) -> None:
    """The append that makes a summary due: summary_due on every result.

    The generation handed off is meta's 'sgen' (a millisecond timestamp: 13 digits).
    """
    async with ContextStore.from_settings(summary_settings, tenant=tenant) as store:
        handed: list[tuple[str, int]] = []
        real = store._writer._handoff.due

        async def due(tenant_: str, session: str, generation: int) -> None:
            handed.append((session, generation))
            await real(tenant_, session, generation)

        monkeypatch.setattr(store._writer._handoff, "due", due)
        results: list[Any] = []
        i = 0
        while not handed and i < 200:
            chunk = [turn(i + j) for j in range(batch)]
            results = await store.append_many("s", chunk)
            i += batch
        assert handed, "no summary became due"
        assert all(r.summary_due for r in results)
        sgen = await raw_redis.hget(store.keys("s").meta, "sgen")
        assert handed == [("s", int(float(sgen)))]
        assert handed[0][1] > 10**12


# -- system, pinned and tool messages; the full and non-bare forms ------------------------------


@pytest.mark.parametrize("backend", BACKENDS, indirect=True)
async def test_kept_and_tool_messages_mixed_with_duplicates(
    settings: Settings, tenant: str, raw_redis: Redis
) -> None:
    """System, pinned, tool call and result, with reused keys: results match the stream."""
    async with ContextStore.from_settings(with_ttl(settings, 300), tenant=tenant) as store:
        await store.append("s", turn(0), idempotency_key="t0")
        msgs = [
            system("rules"),
            turn(0),
            oa_call("call 1", "call 2"),
            oa_result("call 1"),
            oa_result("call 2"),
            turn(1),
        ]
        keys = ["sys", "t0", "c", "r1", "r2", "t1"]
        results = await store.append_many("s", msgs, idempotency_keys=keys)
        assert [r.duplicate for r in results] == [False, True, False, False, False, False]
        assert [r.seq for r in results] == [2, 1, 3, 4, 5, 6]
        await check_against_redis(raw_redis, store, "s", results, msgs)
        pinned = await store.append("s", turn(7), pinned=True)
        again = await store.append("s", turn(7), pinned=True)  # a new key: a new entry
        assert (pinned.seq, again.seq) == (7, 8)
        keep = await raw_redis.hgetall(store.keys("s").keep)
        ids = {k.decode() for k in keep}
        assert {results[0].entry_id, pinned.entry_id, again.entry_id} <= ids


# -- FCALL ---------------------------------------------------------------------------------------


async def test_appends_by_fcall_answer_as_by_evalsha(
    servers: ServerPool, tenant: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """script_mode=functions: a batch with duplicates, a lost reply, a TTL: stored as answered."""
    server = servers.start()
    settings = Settings(
        redis_url=server.url(),
        script_mode="functions",
        key_prefix="fc",
        queue_name="fc:q",
        retry_attempts=2,
    )
    raw = Redis.from_url(server.url())
    try:
        async with ContextStore.from_settings(settings, tenant=tenant) as pod:
            await load_functions(pod._connection)
            first = await pod.append("s", turn(0), idempotency_key="a b")
            msgs = [turn(0), turn(1), turn(2)]
            results = await pod.append_many("s", msgs, idempotency_keys=["a b", "c", "d"])
            assert results[0].duplicate and results[0].entry_id == first.entry_id
            await check_against_redis(raw, pod, "s", results, msgs)
            await pod.set_ttl("s", 600)
            dropped = drop_reply(pod, monkeypatch, SCRIPTS.append)
            lost = await pod.append_many("s", [turn(3), system("x")])
            assert dropped == [True]
            assert [r.seq for r in lost] == [4, 5] and all(r.duplicate for r in lost)
            await check_against_redis(raw, pod, "s", lost, [turn(3), system("x")])
            assert 600_000 <= await raw.pttl(pod.keys("s").meta) <= 660_000
    finally:
        await raw.aclose()


# -- ids at their longest -------------------------------------------------------------------------


@pytest.mark.parametrize("backend", BACKENDS, indirect=True)
async def test_session_and_tenant_ids_at_their_longest(
    settings: Settings, raw_redis: Redis, tenant: str
) -> None:
    """A 128-character tenant and session: the appends answer what is stored."""
    long_tenant = (tenant + "T" * 128)[:128]
    session = "S" * 128
    async with ContextStore.from_settings(with_ttl(settings, 300), tenant=long_tenant) as store:
        msgs = [turn(i) for i in range(5)]
        results = await store.append_many(session, msgs, idempotency_keys=list("abcde"))
        again = await store.append_many(session, msgs[:1], idempotency_keys=["a"])
        assert again[0].entry_id == results[0].entry_id and again[0].duplicate
        await check_against_redis(raw_redis, store, session, results, msgs)
        await store.delete(session)
