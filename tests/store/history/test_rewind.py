"""Rewind on real Redis: the history cut back for every pod, the tail kept as a branch."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from redis.asyncio import Redis
from support.config import BACKENDS
from support.faults import drop_reply
from support.helpers import conversation, oa_call, oa_result, turn

from ctxstore import (
    ContextStore,
    EntryNotFoundError,
    InvalidInputError,
    LeaseHeldError,
    LocalSummarizer,
    SessionNotFoundError,
    Settings,
    SummaryStatus,
)
from ctxstore._redis.scripts import SCRIPTS
from ctxstore.testing import FakeSummarizer

pytestmark = pytest.mark.parametrize("backend", BACKENDS, indirect=True)


async def registered(store: ContextStore) -> list[Any]:
    """The keys of every segment the tenant's registry lists."""
    (members,) = await store._connection.transaction(
        [("ZRANGE", store._lineage.registry, 0, -1)], key=store._lineage.registry
    )
    return [store._lineage.keys(*m.decode().split(":")) for m in members]


async def contents(store: ContextStore, session: str) -> list[Any]:
    return [m["content"] for m in await store.get_messages(session)]


async def test_a_rewind_ends_the_history_and_keeps_the_tail_as_a_branch(
    store: ContextStore,
) -> None:
    """The history ends at the entry; what came after is a readable branch; epoch bumped."""
    ids = [(await store.append("s", turn(i))).entry_id for i in range(10)]
    before = await store.info("s")
    result = await store.rewind("s", ids[3])
    assert (result.count, result.abandoned) == (4, 6)
    assert result.epoch == before.epoch + 1 and result.seq == before.seq + 1
    assert await contents(store, "s") == [turn(i)["content"] for i in range(4)]
    info = await store.info("s")
    assert (info.count, info.tokens) == (4, sum(m.tokens for m in (await store.tail("s", 4))))
    assert info.last_at_ms is not None and (await store.tail("s", 1))[0].entry_id == ids[3]
    (branch,) = await store.branches("s")
    assert (branch.branch_id, branch.at, branch.end, branch.count) == ("br-1", ids[3], ids[9], 6)
    assert branch.readable and branch.epoch == before.epoch
    page = await store.read_branch("s", "br-1")
    assert [m.entry_id for m in page.messages] == ids[4:]
    assert [m.message for m in page.messages] == [turn(i) for i in range(4, 10)]
    # Appends go on from the entry rewound to.
    await store.append("s", turn(99))
    assert await contents(store, "s") == [turn(i)["content"] for i in (0, 1, 2, 3, 99)]
    assert (await store.info("s")).count == 5


async def test_a_rewind_to_the_end_changes_nothing(store: ContextStore) -> None:
    """Nothing is abandoned: no branch, same epoch and history."""
    ids = [(await store.append("s", turn(i))).entry_id for i in range(3)]
    before = await store.info("s")
    result = await store.rewind("s", ids[-1])
    assert result.branch is None and result.abandoned == 0 and result.epoch == before.epoch
    assert await store.branches("s") == []
    assert (await store.info("s")).count == 3


async def test_every_pod_sees_the_rewound_history_at_once(settings: Settings, tenant: str) -> None:
    """A pod with a warm view of the session gets the rewound one on its next view."""
    async with (
        ContextStore.from_settings(settings, tenant=tenant) as a,
        ContextStore.from_settings(settings, tenant=tenant) as b,
    ):
        ids = [(await a.append("s", turn(i))).entry_id for i in range(12)]
        for _ in range(2):  # warm in both pods
            await a.view("s", token_budget=2_000)
            await b.view("s", token_budget=2_000)
        await b.rewind("s", ids[5])
        for pod in (a, b):
            view = await pod.view("s", token_budget=2_000)
            assert view.messages == [turn(i) for i in range(6)]
            assert view.stats.history_messages == 6
        await a.append("s", turn(50))
        assert (await b.view("s", token_budget=2_000)).messages[-1] == turn(50)


async def test_a_rewind_puts_back_a_checkpoints_summary_or_drops_it(
    summary_settings: Settings, tenant: str
) -> None:
    """A summary covering abandoned entries is replaced by the checkpoint's copy, else dropped."""
    async with ContextStore.from_settings(summary_settings, tenant=tenant) as store:
        await store.append_many("s", [turn(i) for i in range(30)])
        first = await store.summarize("s", LocalSummarizer())
        point = await store.checkpoint("s")
        assert point.summary_covers == first.covers_upto
        await store.append_many("s", [turn(i) for i in range(30, 60)])
        later = await store.summarize("s", LocalSummarizer())
        assert later.covers_upto != first.covers_upto
        await store.rewind("s", point)
        info = await store.info("s")
        assert info.summary_covers == first.covers_upto and info.summary_tokens > 0
        assert info.count == point.count and info.tokens == point.tokens
        view = await store.view("s", token_budget=400)
        assert view.stats.summary_used and view.stats.summary_covers == first.covers_upto
        # To before what any checkpoint's summary covers: the summary goes.
        first_entry = (await store.read("s", limit=1)).messages[0].entry_id
        await store.rewind("s", first_entry)
        info = await store.info("s")
        assert info.summary_covers is None and info.tokens_unsummarized == info.tokens
        assert not (await store.view("s", token_budget=400)).stats.summary_used


async def test_a_summary_that_covers_only_kept_entries_stays(
    summary_settings: Settings, tenant: str
) -> None:
    """Rewinding after the watermark keeps the summary in force, in the new epoch."""
    async with ContextStore.from_settings(summary_settings, tenant=tenant) as store:
        ids = [(await store.append("s", turn(i))).entry_id for i in range(40)]
        outcome = await store.summarize("s", LocalSummarizer())
        await store.rewind("s", ids[-3])
        info = await store.info("s")
        assert info.summary_covers == outcome.covers_upto


async def test_a_summary_job_that_read_before_a_rewind_is_thrown_away(
    summary_settings: Settings, tenant: str
) -> None:
    """A worker mid-summary when the rewind lands commits nothing: its history is gone."""
    async with ContextStore.from_settings(summary_settings, tenant=tenant) as store:
        ids = [(await store.append("s", turn(i))).entry_id for i in range(30)]
        gate = asyncio.Event()
        summarizer = FakeSummarizer(gate=gate)
        job = asyncio.create_task(store.summarize("s", summarizer))
        await summarizer.started.wait()
        await store.rewind("s", ids[10])
        gate.set()
        outcome = await job
        assert outcome.status in (SummaryStatus.STALE, SummaryStatus.LEASE_LOST)
        assert (await store.info("s")).summary_covers is None


async def test_pins_and_search_follow_the_rewind(store: ContextStore) -> None:
    """An abandoned pinned message is no longer sent; search finds only the new history."""
    kept = await store.append("s", {"role": "user", "content": "the zebra stays"})
    gone = await store.append("s", {"role": "user", "content": "the walrus goes"}, pinned=True)
    assert [h.entry_id for h in await store.search("s", "walrus")] == [gone.entry_id]
    await store.rewind("s", kept.entry_id)
    assert (await store.info("s")).pinned == ()
    view = await store.view("s", token_budget=1_000)
    assert view.messages == [{"role": "user", "content": "the zebra stays"}]
    assert await store.search("s", "walrus") == []
    assert [h.entry_id for h in await store.search("s", "zebra")] == [kept.entry_id]


async def test_checkpoints_after_the_target_move_to_the_branch(store: ContextStore) -> None:
    """They name the branch and cannot be rewound to; those before stay in the history."""
    first = await store.append("s", turn(0))
    early = await store.checkpoint("s")
    await store.append("s", turn(1))
    late = await store.checkpoint("s")
    result = await store.rewind("s", first.entry_id)
    points = {c.checkpoint_id: c for c in await store.checkpoints("s")}
    assert points[early.checkpoint_id].branch is None
    assert points[late.checkpoint_id].branch == result.branch
    with pytest.raises(EntryNotFoundError):
        await store.rewind("s", late)
    await store.rewind("s", early)  # in the history still


async def test_bad_targets_are_refused_and_nothing_changes(store: ContextStore) -> None:
    """An unknown entry or checkpoint, a malformed id, a missing session: typed errors."""
    with pytest.raises(SessionNotFoundError):
        await store.rewind("nobody", "1-0")
    ids = [(await store.append("s", turn(i))).entry_id for i in range(3)]
    before = await store.info("s")
    with pytest.raises(EntryNotFoundError):
        await store.rewind("s", "1-0")
    with pytest.raises(EntryNotFoundError):
        await store.rewind("s", "cp-7")
    for bad in ("", "x", "cp-0", None, 5):
        with pytest.raises(InvalidInputError):
            await store.rewind("s", bad)  # type: ignore[arg-type]
    with pytest.raises(EntryNotFoundError):
        await store.read_branch("s", "br-1")
    with pytest.raises(InvalidInputError):
        await store.read_branch("s", "b-1")
    assert await store.info("s") == before
    assert await store.branches("s") == []
    # The lease was given back each time: a rewind goes through.
    assert (await store.rewind("s", ids[0])).abandoned == 2


async def test_a_rewind_waits_for_the_lease_and_consumes_one_given(
    settings: Settings, tenant: str
) -> None:
    """Another writer's lease refuses it (LeaseHeldError); a lease passed in is used once."""
    quick = settings.model_copy(update={"lease_wait_seconds": 0.05})
    async with ContextStore.from_settings(quick, tenant=tenant) as store:
        ids = [(await store.append("s", turn(i))).entry_id for i in range(4)]
        held = await store.lease("s")
        with pytest.raises(LeaseHeldError):
            await store.rewind("s", ids[1])
        result = await store.rewind("s", ids[1], lease=held)
        assert result.count == 2 and held.released
        assert (await store.rewind("s", ids[0])).count == 1


async def test_a_retried_rewind_is_applied_once(
    store: ContextStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A rewind whose reply was lost is answered with its result: one branch, not two."""
    ids = [(await store.append("s", turn(i))).entry_id for i in range(6)]
    dropped = drop_reply(store, monkeypatch, SCRIPTS.rewind)
    result = await store.rewind("s", ids[2])
    assert dropped == [True] and result.branch == "br-1" and result.abandoned == 3
    assert len(await store.branches("s")) == 1 and (await store.info("s")).count == 3


async def test_old_branches_go_past_the_most_kept(
    settings: Settings, tenant: str, raw_redis: Redis
) -> None:
    """Beyond max_branches the oldest goes, its entries and its checkpoints with it."""
    few = settings.model_copy(update={"max_branches": 2})
    async with ContextStore.from_settings(few, tenant=tenant) as store:
        first = await store.append("s", turn(0))
        for i in range(1, 4):
            await store.append("s", turn(i))
            await store.checkpoint("s")
            await store.rewind("s", first.entry_id)
        branches = await store.branches("s")
        assert [b.branch_id for b in branches] == ["br-2", "br-3"]
        assert all(c.branch in ("br-2", "br-3") for c in await store.checkpoints("s"))
        assert len(await store.checkpoints("s")) == 2
        segments = await registered(store)
        assert len(segments) == 2  # the first branch's segment was deleted
        for keys in segments:
            assert await raw_redis.exists(keys.log)


async def test_branches_expire_with_the_session_ttl_and_go_with_it(
    store: ContextStore, raw_redis: Redis
) -> None:
    """A branch's entries last the session's TTL; delete and forget leave nothing of them."""
    ids = [(await store.append("s", turn(i))).entry_id for i in range(5)]
    await store.set_ttl("s", 600)
    await store.rewind("s", ids[1])
    (keys,) = await registered(store)
    assert 0 < await raw_redis.pttl(keys.log) <= 600_000
    assert 0 < await raw_redis.pttl(keys.info) <= 600_000
    await raw_redis.delete(keys.log, keys.info)  # what their expiry does
    (branch,) = await store.branches("s")
    assert not branch.readable
    await store.delete("s")
    assert not await raw_redis.exists(store.keys("s").branches)
    ids = [(await store.append("t", turn(i))).entry_id for i in range(5)]
    await store.rewind("t", ids[1])
    (keys,) = await registered(store)
    await store.delete("t")
    assert not await raw_redis.exists(keys.log, keys.info)  # released: nobody reads it
    ids = [(await store.append("u", turn(i))).entry_id for i in range(5)]
    await store.rewind("u", ids[1])
    await store.forget_tenant()
    assert not await raw_redis.exists(store._lineage.registry)
    assert await raw_redis.keys(f"*{{{store.tenant}:*") == []


async def test_a_replace_drops_the_branches(store: ContextStore, raw_redis: Redis) -> None:
    """The history they branched from is superseded: they go, their entries released."""
    ids = [(await store.append("s", turn(i))).entry_id for i in range(5)]
    await store.rewind("s", ids[1])
    await store.replace("s", [turn(9)])
    assert await store.branches("s") == []
    assert await raw_redis.zcard(store._lineage.registry) == 0


async def test_rewinds_racing_appends_lose_nothing_and_double_nothing(
    settings: Settings, tenant: str
) -> None:
    """Pods append while one rewinds: each ack'd append is in the history or one branch, once."""
    pods = [ContextStore.from_settings(settings, tenant=tenant) for _ in range(4)]
    try:
        await pods[0].append_many("s", [turn(i) for i in range(5)])
        acked: dict[str, str] = {}

        async def writer(number: int) -> None:
            for i in range(40):
                tag = f"w{number}-{i}"
                acked[tag] = (
                    await pods[number].append("s", {"role": "user", "content": tag})
                ).entry_id

        async def rewinder() -> None:
            for _ in range(6):
                tail = await pods[3].tail("s", 4)
                await pods[3].rewind("s", tail[0].entry_id)

        await asyncio.gather(writer(0), writer(1), writer(2), rewinder())
        history = {m.message["content"]: m.entry_id async for m in pods[0].iter_history("s")}
        branched: dict[str, list[str]] = {}
        for branch in await pods[0].branches("s"):
            page = await pods[0].read_branch("s", branch.branch_id, limit=10_000)
            for m in page.messages:
                branched.setdefault(m.message["content"], []).append(m.entry_id)
        assert any(tag in branched for tag in acked)  # rewinds fell among the appends
        for tag, entry in acked.items():
            places = ([history[tag]] if tag in history else []) + branched.get(tag, [])
            assert places == [entry], (tag, places)
        for number in range(3):
            mine = [history[f"w{number}-{i}"] for i in range(40) if f"w{number}-{i}" in history]
            assert mine == sorted(mine, key=lambda e: tuple(map(int, e.split("-"))))
        info = await pods[0].info("s")
        assert info.count == len(history) == len(await pods[1].get_messages("s"))
    finally:
        for pod in pods:
            await pod.aclose()


async def test_a_rewound_session_keeps_a_sound_view(store: ContextStore) -> None:
    """After rewinds into tool exchanges, views hold no orphan call or result."""
    messages = conversation(8)
    ids = [r.entry_id for r in await store.append_many("s", messages)]
    for cut in (len(ids) - 2, 7, 3):
        await store.rewind("s", ids[cut])
        view = await store.view("s", token_budget=600)
        called = {c["id"] for m in view.messages for c in m.get("tool_calls") or []}
        answered = {m["tool_call_id"] for m in view.messages if m.get("role") == "tool"}
        assert called == answered
        assert await store.get_messages("s") == messages[: cut + 1]


async def test_rewinding_pinned_and_system_messages_gives_back_what_they_were_charged(
    store: ContextStore,
) -> None:
    """A pinned tool pair or a system message rewound away returns its copy's bytes, no more.

    Their keep copies carry a header (kind, tokens, call ids) beside the data; the
    append and the pin charged the data only, so the rewind gives back the data
    only, and the entries themselves stay charged to the branch that holds them:
    cycles of pin and rewind leave the counter at where it started plus what the
    branches hold, and a session cannot grow past its quota on bytes handed back
    twice.
    """
    from support.tenant import raw_bytes

    base = (await store.append("s", turn(0))).entry_id
    start = await raw_bytes(store, "s")
    long_id = "call_" + "x" * 90
    for cycle in range(3):
        pair = [oa_call(f"{long_id}{cycle}"), oa_result(f"{long_id}{cycle}", "out " * 20)]
        await store.append_many("s", pair, pinned=True)
        await store.append("s", {"role": "system", "content": f"rules, take {cycle}"})
        assert await raw_bytes(store, "s") > start
        await store.rewind("s", base)
        branches = sum(b.bytes for b in await store.branches("s"))
        assert await raw_bytes(store, "s") == start + branches, cycle


async def test_an_unpin_never_takes_the_counter_below_zero(store: ContextStore) -> None:
    """An unpin gives back its copy's bytes, and a counter already lower stops at zero."""
    from support.tenant import raw_bytes

    entry = (await store.append("s", turn(0))).entry_id
    assert await store.pin("s", entry)
    await store._connection.transaction(
        [("HSET", store.keys("s").meta, "bytes", 3)], key=store.keys("s").meta
    )
    assert await store.pin("s", entry, pinned=False)
    assert await raw_bytes(store, "s") == 0


async def test_a_checkpoint_of_another_session_is_refused_not_taken_for_this_ones(
    store: ContextStore,
) -> None:
    """Checkpoint ids are per session: b's cp-1 given for a is an error, and a is untouched."""
    await store.append_many("a", [turn(i) for i in range(3)])
    await store.checkpoint("a")
    await store.append_many("a", [turn(i) for i in range(3, 6)])
    await store.append("b", turn(0))
    theirs = await store.checkpoint("b")
    with pytest.raises(EntryNotFoundError, match="not this session's cp-1"):
        await store.rewind("a", theirs)
    assert (await store.info("a")).count == 6


async def test_pinned_takes_a_bool_only(store: ContextStore) -> None:
    """A truthy string or number is refused: "no" must not pin."""
    entry = (await store.append("s", turn(0))).entry_id
    for wrong in ("no", 2, None):
        with pytest.raises(InvalidInputError, match="True or False"):
            await store.pin("s", entry, pinned=wrong)  # type: ignore[arg-type]
    assert (await store.info("s", pins=True)).pinned == ()
