"""Forks on real Redis and Redis Cluster: shared history, bounded cost, independent lives."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import pytest
from redis.asyncio import Redis
from support.config import BACKENDS
from support.helpers import conversation, paired, ttl_span, turn

from ctxstore import (
    ContextStore,
    EntryNotFoundError,
    InvalidInputError,
    Keyring,
    LeaseHeldError,
    LocalSummarizer,
    QuotaExceededError,
    SessionExistsError,
    SessionNotFoundError,
    Settings,
    TenantLimits,
)

pytestmark = pytest.mark.parametrize("backend", BACKENDS, indirect=True)

BRIDGE = 40
"""Entries a fork copies, at most, in these tests (``bridge_entries``)."""


@pytest.fixture
def small(summary_settings: Settings) -> Settings:
    """Small summaries, and forks that copy at most 40 entries and 2,000 tokens."""
    return summary_settings.model_copy(update={"bridge_entries": BRIDGE, "bridge_tokens": 2_000})


@pytest.fixture
async def forker(small: Settings, tenant: str) -> Any:
    async with ContextStore.from_settings(small, tenant=tenant) as store:
        yield store


def turns(start: int, stop: int) -> list[dict[str, Any]]:
    return [turn(i) for i in range(start, stop)]


class RoundTrips:
    """Counts a store's round trips to Redis (scripts, transactions, pipelines).

    A trip that failed (a timeout on a loaded machine) and was sent again by the
    store's retry counts once: the cost compared is the fork's design, not the
    machine's load.
    """

    def __init__(self, store: ContextStore, monkeypatch: pytest.MonkeyPatch) -> None:
        self.count = 0
        self.failed = 0
        real = store._connection.node_call

        async def counted(key: str, commands: Any, **kwargs: Any) -> Any:
            try:
                replies = await real(key, commands, **kwargs)
            except Exception:
                self.failed += 1
                raise
            self.count += 1
            return replies

        monkeypatch.setattr(store._connection, "node_call", counted)


async def test_a_fork_has_the_sources_history_and_its_own_future(forker: ContextStore) -> None:
    """The fork reads the source's history up to the fork point; then each goes its way."""
    await forker.append_many("s", turns(0, 300))
    result = await forker.fork("s", "f")
    assert (result.session, result.source, result.count) == ("f", "s", 300)
    assert result.copied <= BRIDGE
    assert await forker.get_messages("f") == turns(0, 300)
    info_s, info_f = await forker.info("s"), await forker.info("f")
    assert (info_f.count, info_f.tokens) == (info_s.count, info_s.tokens)
    await forker.append("s", turn(1000))
    await forker.append("f", turn(2000))
    assert await forker.get_messages("s") == [*turns(0, 300), turn(1000)]
    assert await forker.get_messages("f") == [*turns(0, 300), turn(2000)]
    assert (await forker.tail("f", 3))[0].message == turn(298)
    page = await forker.read("f", limit=7)
    assert [m.message for m in page.messages] == turns(0, 7)
    rest = await forker.read("f", after=page.next_after, limit=10_000)
    assert [m.message for m in rest.messages] == [*turns(7, 300), turn(2000)]
    first = page.messages[0]
    assert (await forker.get_entry("f", first.entry_id)) == first


async def test_a_small_source_is_copied_and_left_as_it_was(forker: ContextStore) -> None:
    """Under the bound the fork copies the history; the source's log is not touched."""
    await forker.append_many("s", turns(0, 10))
    before = await forker.info("s")
    result = await forker.fork("s", "f")
    assert result.copied == 10
    assert await forker.get_messages("f") == turns(0, 10)
    assert await forker.info("s") == before
    assert (
        await forker._lineage.read(await chain_of(forker, "f"), None, 100) == []
    )  # no segment involved


async def only_segment(store: ContextStore, session: str) -> Any:
    """The keys of the one segment ``session``'s chain names."""
    (segment,) = (await chain_of(store, session)).segments
    return store._lineage.keys(segment.owner, segment.segment)


async def chain_of(store: ContextStore, session: str) -> Any:
    from ctxstore._layout.chain import Chain

    (raw,) = await store._connection.transaction(
        [("HGET", store.keys(session).meta, "chain")], key=store.keys(session).meta
    )
    return Chain.parse(raw)


async def test_a_fork_costs_the_same_at_any_length(
    forker: ContextStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Forks of 100 and 2,000 messages (summarized) copy the same and take the same trips.

    A fork re-takes its index reservation or segment hold when one lapsed
    meanwhile (a loaded machine): a trip or two more on one fork. That is
    timing, not length, so the pair is measured again, on new sessions, up to
    three times; the length's cost shows in every one.
    """
    measured = []
    for attempt in range(3):
        copied, trips = [], []
        for size in (100, 2_000):
            source, target = f"s{size}-{attempt}", f"f{size}-{attempt}"
            for start in range(0, size, 500):
                await forker.append_many(source, turns(start, min(size, start + 500)))
            await forker.summarize(source, LocalSummarizer())
            counter = RoundTrips(forker, monkeypatch)
            result = await forker.fork(source, target)
            monkeypatch.undo()
            copied.append(result.copied)
            trips.append(counter.count)
            assert await forker.get_messages(target) == turns(0, size)
        assert max(copied) <= BRIDGE
        measured.append(trips)
        if trips[1] <= trips[0] + 2:  # a freeze of the long one: two trips more at most
            break
    assert measured[-1][1] <= measured[-1][0] + 2, measured


async def test_the_forks_view_costs_what_any_view_costs(
    forker: ContextStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its view is one round trip (warm or cold), reads only its own log, holds no orphan."""
    await forker.append_many("s", conversation(60))
    await forker.summarize("s", LocalSummarizer())
    await forker.fork("s", "f")
    await forker.view("f", token_budget=1_500)  # the first view places the anchor
    for warm in (True, False):
        if not warm:
            forker._viewer.warm.discard(forker.tenant, "f")
        counter = RoundTrips(forker, monkeypatch)
        view = await forker._viewer.view("f", _budget(1_500))
        monkeypatch.undo()
        assert counter.count == 1, warm
        assert view[0].stats.entries_read <= BRIDGE + 20
        paired(view[0].messages)
    plain = await forker.view("s", token_budget=1_500)
    fork = await forker.view("f", token_budget=1_500)
    assert fork.stats.summary_used == plain.stats.summary_used is True
    assert fork.messages[-1] == plain.messages[-1]


async def test_views_read_on_into_the_shared_history_when_they_need_to(
    small: Settings, tenant: str
) -> None:
    """A budget larger than the fork's own log: fork and frozen source send the same view."""
    cold = small.model_copy(update={"view_cache_bytes": 0, "summary_trigger_tokens": 0})
    async with ContextStore.from_settings(cold, tenant=tenant) as store:
        await store.append_many("s", turns(0, 300))
        before = await store.view("s", token_budget=6_000)
        await store.fork("s", "f")  # freezes the source's log: 40 entries stay live
        assert (await store.info("s")).shared_messages > 200
        after = await store.view("s", token_budget=6_000)
        fork = await store.view("f", token_budget=6_000)
        assert before.messages == after.messages == fork.messages
        assert len(fork.messages) > BRIDGE  # read on past the fork's own log
        paired(fork.messages)


async def test_pages_hold_when_the_log_is_frozen_between_them(
    forker: ContextStore, small: Settings
) -> None:
    """A reader paging through a fork while its log is frozen (forked) gets every entry once."""
    await forker.append_many("s", turns(0, 120))
    await forker.fork("s", "f")
    await forker.append_many("f", turns(120, 200))  # the fork's own log outgrows the bridge
    expected = turns(0, 200)
    async with ContextStore.from_settings(small, tenant=forker.tenant) as other:
        read: list[Any] = []
        after = None
        for page_number in range(1_000):
            page = await forker.read("f", after=after, limit=7)
            read += [m.message for m in page.messages]
            if page_number in (3, 20):  # another pod forks it: its log is frozen
                await other.fork("f", f"g{page_number}")
            if page.next_after is None:
                break
            after = page.next_after
    assert read == expected
    assert await forker.get_messages("g20") == expected


def _budget(tokens: int) -> Any:
    from ctxstore.budget import Budget

    return Budget(tokens, tokens, None, "explicit")


async def test_deleting_the_source_does_not_break_the_fork(
    forker: ContextStore, raw_redis: Redis
) -> None:
    """History, search, views and summaries of the fork hold after the source is deleted."""
    await forker.append_many("s", turns(0, 200))
    await forker.append("s", {"role": "user", "content": "the aardvark password is 7"})
    await forker.fork("s", "f")
    await forker.delete("s")
    assert await forker.get_messages("s") == []
    history = await forker.get_messages("f")
    assert history[:200] == turns(0, 200) and len(history) == 201
    assert len(await forker.search("f", "aardvark")) == 1
    outcome = await forker.summarize("f", LocalSummarizer())
    assert outcome.covers_upto is not None
    assert (await forker.view("f", token_budget=800)).stats.summary_used
    # Deleting the fork too releases the segments: nothing is left.
    await forker.delete("f")
    assert await raw_redis.zcard(forker._lineage.registry) == 0
    assert await raw_redis.keys(f"*{{{forker.tenant}:s}}:seg:*") == []


async def test_what_one_does_never_shows_in_the_other(
    summary_settings: Settings, tenant: str
) -> None:
    """Appends, summaries, rewinds, pops, pins and deletes of either stay in that one."""
    settings = summary_settings.model_copy(update={"bridge_entries": BRIDGE})
    async with ContextStore.from_settings(settings, tenant=tenant) as store:
        ids = [r.entry_id for r in await store.append_many("s", turns(0, 120))]
        await store.fork("s", "f")
        await store.summarize("s", LocalSummarizer())
        assert (await store.info("f")).summary_covers is None
        await store.rewind("s", ids[50])
        assert await store.get_messages("f") == turns(0, 120)
        await store.pin("f", ids[3])
        assert (await store.info("s")).pinned == ()
        assert (await store.info("f")).pinned == (ids[3],)
        await store.rewind("f", ids[10])  # into the shared history
        assert await store.get_messages("f") == turns(0, 11)
        assert await store.get_messages("s") == turns(0, 51)
        (branch,) = await store.branches("f")
        page = await store.read_branch("f", branch.branch_id, limit=1_000)
        assert [m.message for m in page.messages] == turns(11, 120)
        assert (await store.pop("s")) is not None
        assert await store.get_messages("f") == turns(0, 11)
        await store.delete("f")
        assert await store.get_messages("s") == turns(0, 50)


async def test_a_fork_at_a_checkpoint_takes_its_position_and_summary(
    summary_settings: Settings, tenant: str
) -> None:
    """At a checkpoint: the history up to it, the summary it recorded."""
    async with ContextStore.from_settings(summary_settings, tenant=tenant) as store:
        await store.append_many("s", turns(0, 40))
        outcome = await store.summarize("s", LocalSummarizer())
        point = await store.checkpoint("s")
        await store.append_many("s", turns(40, 80))
        await store.summarize("s", LocalSummarizer())
        result = await store.fork("s", "f", at=point)
        assert (result.at, result.count, result.tokens) == (point.entry_id, 40, point.tokens)
        assert await store.get_messages("f") == turns(0, 40)
        info = await store.info("f")
        assert info.summary_covers == outcome.covers_upto and info.summary_tokens > 0
        assert (await store.view("f", token_budget=500)).stats.summary_used


async def test_forks_of_forks_and_at_old_entries(forker: ContextStore) -> None:
    """A fork of a fork, at an entry of the shared history, reads the right prefix."""
    ids = [r.entry_id for r in await forker.append_many("s", turns(0, 150))]
    await forker.fork("s", "f")
    await forker.append_many("f", turns(150, 200))
    result = await forker.fork("f", "g", at=ids[20])
    assert result.count == 21 and await forker.get_messages("g") == turns(0, 21)
    await forker.fork("f", "h")
    assert await forker.get_messages("h") == turns(0, 200)
    await forker.delete("s")
    await forker.delete("f")
    assert await forker.get_messages("g") == turns(0, 21)
    assert await forker.get_messages("h") == turns(0, 200)


async def test_pops_reach_into_the_shared_history(forker: ContextStore) -> None:
    """A fork popped past its own log takes the shared entries off its history only."""
    await forker.append_many("s", turns(0, 100))
    result = await forker.fork("s", "f")
    for i in range(99, 99 - result.copied - 3, -1):
        popped = await forker.pop("f")
        assert popped is not None and popped.message == turn(i)
    left = 100 - result.copied - 3
    assert await forker.get_messages("f") == turns(0, left)
    assert (await forker.info("f")).count == left
    await forker.append("f", turn(500))
    assert await forker.get_messages("f") == [*turns(0, left), turn(500)]
    assert await forker.get_messages("s") == turns(0, 100)


async def test_a_fork_onto_a_session_that_exists_leaves_the_source_as_it_was(
    forker: ContextStore,
) -> None:
    """Refused before the source is touched: a long one is not frozen into a segment."""
    await forker.append_many("long", turns(0, 3 * BRIDGE))
    await forker.append("taken", turn(0))
    with pytest.raises(SessionExistsError):
        await forker.fork("long", "taken")
    meta = forker.keys("long").meta
    (chain,) = await forker._connection.transaction([("HGET", meta, "chain")], key=meta)
    assert not chain
    assert await forker.get_messages("long") == turns(0, 3 * BRIDGE)


async def test_bad_forks_are_refused_and_write_nothing(forker: ContextStore) -> None:
    """An existing target, a missing source, a point outside the history: typed errors."""
    ids = [r.entry_id for r in await forker.append_many("s", turns(0, 5))]
    await forker.append("taken", turn(0))
    with pytest.raises(SessionExistsError):
        await forker.fork("s", "taken")
    assert await forker.get_messages("taken") == [turn(0)]
    with pytest.raises(SessionNotFoundError):
        await forker.fork("nobody", "f")
    with pytest.raises(EntryNotFoundError):
        await forker.fork("s", "f", at="1-0")
    with pytest.raises(EntryNotFoundError):
        await forker.fork("s", "f", at="cp-3")
    with pytest.raises(InvalidInputError):
        await forker.fork("s", "s")
    with pytest.raises(InvalidInputError):
        await forker.fork("s", "f", at="yesterday")
    assert not (await forker.info("f")).exists
    await forker.rewind("s", ids[1])
    with pytest.raises(EntryNotFoundError):
        await forker.fork("s", "f", at=ids[3])  # abandoned by the rewind
    await forker.set_limits(TenantLimits(sessions=2))
    with pytest.raises(QuotaExceededError):
        await forker.fork("s", "f")
    assert {s.session for s in await forker.list_sessions()} == {"s", "taken"}


async def test_an_encrypted_fork_reads_back_and_stays_sealed(
    small: Settings, tenant: str, raw_redis: Redis
) -> None:
    """Sealed values are opened and sealed again for the fork; in Redis they stay sealed."""
    key = Keyring.generate_key()
    sealed = Settings(
        **{**small.model_dump(), "encryption_keys": {"k1": key}, "encryption_active_key": "k1"}
    )
    async with ContextStore.from_settings(sealed, tenant=tenant) as store:
        await store.append_many("s", turns(0, 120))
        rules = {"role": "system", "content": "rules: be terse"}
        await store.append("s", rules)
        await store.fork("s", "f")
        assert (await store.get_messages("f"))[-1] == rules
        assert rules in (await store.view("f", token_budget=400)).messages
        for entry in await raw_redis.xrange(store.keys("f").log):
            assert b"quick brown" not in entry[1][b"m"]


async def test_forks_take_the_ttl_and_stretch_the_shared_segments(
    forker: ContextStore, raw_redis: Redis
) -> None:
    """The segments a fork reads last as long as it: its TTL, or for ever without one."""
    await forker.set_limits(TenantLimits(ttl_seconds=100))
    await forker.append_many("s", turns(0, 100))
    await forker.fork("s", "f")
    keys = await only_segment(forker, "f")
    assert 0 < await raw_redis.pttl(keys.log) <= ttl_span(100_000)
    await forker.set_ttl("f", 5_000)
    assert await raw_redis.pttl(keys.log) > 100_000
    await forker.set_ttl("f", None)
    assert await raw_redis.pttl(keys.log) == -1
    assert await raw_redis.pttl(keys.info) == -1


async def test_a_forks_appends_keep_its_segments_alive(
    forker: ContextStore, raw_redis: Redis
) -> None:
    """A write to a fork stretches the segments it reads past its own TTL again."""
    await forker.set_limits(TenantLimits(ttl_seconds=100))
    await forker.append_many("s", turns(0, 100))
    await forker.fork("s", "f")
    keys = await only_segment(forker, "f")
    await raw_redis.pexpire(keys.log, 5_000)  # as if the fork's last write were long ago
    async with ContextStore.from_settings(forker.settings, tenant=forker.tenant) as pod:
        await pod.append("f", turn(500))  # another pod: its first write stretches them
    assert await raw_redis.pttl(keys.log) > 100_000


async def test_an_appends_reply_brings_back_a_chain_of_segments_whole(
    forker: ContextStore, raw_redis: Redis
) -> None:
    """An append's reply carries a chain of two segments whole, and a batch's results.

    The script answers in one string, the chain last (it holds spaces): each segment of a
    fork of a fork is stretched, and a duplicate and a new message read right.
    """
    await forker.set_limits(TenantLimits(ttl_seconds=100))
    await forker.append_many("s", turns(0, 100))
    await forker.fork("s", "f")
    await forker.append_many("f", turns(100, 200))
    await forker.fork("f", "g")
    segments = (await chain_of(forker, "g")).segments
    assert len(segments) == 2
    keys = [forker._lineage.keys(s.owner, s.segment) for s in segments]
    for key in keys:
        await raw_redis.pexpire(key.log, 5_000)  # as if the fork's last write were long ago
    async with ContextStore.from_settings(forker.settings, tenant=forker.tenant) as pod:
        (first,) = await pod.append_many("g", [turn(500)], idempotency_keys=["k1"])
        again, new = await pod.append_many(
            "g", [turn(500), turn(501)], idempotency_keys=["k1", "k2"]
        )
    for key in keys:
        assert await raw_redis.pttl(key.log) > 100_000
    assert (again.entry_id, again.seq, again.epoch, again.duplicate) == (
        first.entry_id,
        first.seq,
        first.epoch,
        True,
    )
    assert (new.seq, new.epoch, new.duplicate) == (first.seq + 1, first.epoch, False)
    assert new.entry_id != first.entry_id


async def test_a_replaced_fork_lets_the_shared_history_go(
    forker: ContextStore, raw_redis: Redis
) -> None:
    """A replace drops the fork's chain: the source's delete then deletes the segment."""
    await forker.append_many("s", turns(0, 100))
    await forker.fork("s", "f")
    keys = await only_segment(forker, "f")
    await forker.replace("f", [turn(7)])
    assert await raw_redis.exists(keys.log)  # the source still reads it
    assert await forker.get_messages("f") == [turn(7)]
    await forker.delete("s")
    assert not await raw_redis.exists(keys.log, keys.info)


async def test_forget_leaves_nothing_of_forks(forker: ContextStore, raw_redis: Redis) -> None:
    """A tenant's forks and every segment go with forget_tenant."""
    await forker.append_many("s", turns(0, 100))
    await forker.fork("s", "f")
    await forker.fork("f", "g")
    await forker.delete("s")
    await forker.forget_tenant()
    assert await raw_redis.keys(f"*{{{forker.tenant}:*") == []
    assert not await raw_redis.exists(forker._lineage.registry)


# -- races ------------------------------------------------------------------------------


async def test_forks_racing_appends_take_a_prefix_and_lose_nothing(
    small: Settings, tenant: str
) -> None:
    """Pods append while others fork: each fork holds a prefix of the source; no ack is lost."""
    pods = [ContextStore.from_settings(small, tenant=tenant) for _ in range(4)]
    try:
        await pods[0].append_many("s", turns(0, 90))
        acked: dict[str, str] = {}

        async def writer(number: int) -> None:
            for i in range(30):
                tag = f"w{number}-{i}"
                message = {"role": "user", "content": tag}
                acked[tag] = (await pods[number].append("s", message)).entry_id

        async def forker(number: int) -> list[str]:
            made = []
            for i in range(4):
                name = f"f{number}-{i}"
                await pods[number].fork("s", name)
                made.append(name)
            return made

        results = await asyncio.gather(writer(0), writer(1), forker(2), forker(3))
        source = await pods[0].get_messages("s")
        stored = [m["content"] for m in source]
        for tag in acked:
            assert stored.count(tag) == 1
        for name in [*results[2], *results[3]]:
            fork = await pods[1].get_messages(name)
            assert fork == source[: len(fork)]  # a prefix: never mixed, never reordered
            assert (await pods[1].info(name)).count == len(fork)
    finally:
        for pod in pods:
            await pod.aclose()


async def test_forks_racing_rewinds_and_summaries_of_the_source(
    summary_settings: Settings, tenant: str
) -> None:
    """Each fork is some state the source was in: a prefix of a history it had."""
    settings = summary_settings.model_copy(update={"bridge_entries": BRIDGE})
    pods = [ContextStore.from_settings(settings, tenant=tenant) for _ in range(3)]
    try:
        ids = [r.entry_id for r in await pods[0].append_many("s", turns(0, 120))]
        original = turns(0, 120)

        async def rewinds() -> None:
            for cut in (100, 80, 60):
                await pods[0].rewind("s", ids[cut])

        async def summaries() -> None:
            for _ in range(3):
                with contextlib.suppress(LeaseHeldError):  # a rewind holds it: next time
                    await pods[1].summarize("s", LocalSummarizer())

        async def forks() -> None:
            for i in range(5):
                await pods[2].fork("s", f"f{i}")

        await asyncio.gather(rewinds(), summaries(), forks())
        for i in range(5):
            fork = await pods[2].get_messages(f"f{i}")
            assert len(fork) in (121, 101, 81, 61) and fork == original[: len(fork)]
            view = await pods[2].view(f"f{i}", token_budget=600)
            paired(view.messages)
            assert all(m in original for m in view.messages if "<summary>" not in str(m))
    finally:
        for pod in pods:
            await pod.aclose()


async def test_only_one_of_two_forks_to_the_same_id_is_made(forker: ContextStore) -> None:
    """Two pods forking into one id: one fork, one SessionExistsError."""
    await forker.append_many("a", turns(0, 60))
    await forker.append_many("b", turns(100, 160))
    outcomes = await asyncio.gather(
        forker.fork("a", "f"), forker.fork("b", "f"), return_exceptions=True
    )
    assert sum(isinstance(o, SessionExistsError) for o in outcomes) == 1
    made = next(o for o in outcomes if not isinstance(o, BaseException))
    expected = turns(0, 60) if made.source == "a" else turns(100, 160)
    assert await forker.get_messages("f") == expected
