"""Write paths that always know their outcome, on real Redis.

Each write script answers a retry of a call it applied with that call's
result; a consumed lease cannot write twice; a session's epoch and sequence
number never go backwards across delete and recreate; every write path is
held to the same quotas and rate limits; malformed input is a typed error.
Faults are injected at the connection's edge: the reply of a script that
Redis applied is dropped, and the SDK retries.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from redis.asyncio import Redis
from support.config import BACKENDS
from support.faults import drop_reply
from support.helpers import turn

from ctxstore import (
    ConflictError,
    ContextStore,
    EpochChangedError,
    InvalidInputError,
    InvalidMessageError,
    LeaseLostError,
    QuotaExceededError,
    Settings,
    TenantLimits,
)
from ctxstore._layout.formats import entry_order
from ctxstore._layout.keys import tenant_sessions_key
from ctxstore._redis.scripts import SCRIPTS
from ctxstore.testing import ManualClock


@pytest.fixture
async def other(settings: Settings, tenant: str) -> Any:
    """A second pod's store on the same tenant."""
    async with ContextStore.from_settings(settings, tenant=tenant) as pod:
        yield pod


# -- finding 1: a lost reply to clear() or replace(s, []) --------------------------------


@pytest.mark.parametrize("emptying", ["clear", "replace-with-nothing"])
async def test_a_clear_whose_reply_was_lost_is_answered_on_retry_and_keeps_a_later_append(
    store: ContextStore, other: ContextStore, monkeypatch: pytest.MonkeyPatch, emptying: str
) -> None:
    """Clear applied, reply lost, another pod appends, the SDK retries: the clear's own result."""
    await store.append_many("s", [turn(i) for i in range(3)])
    later = turn(99)
    dropped = drop_reply(
        store, monkeypatch, SCRIPTS.rewrite, between=lambda: other.append("s", later)
    )
    if emptying == "clear":
        result = await store.clear("s")
    else:
        result = await store.replace("s", [])
    assert dropped == [True]
    assert (result.count, result.superseded, result.entry_ids) == (0, 3, ())
    assert await store.get_messages("s") == [later]  # the append after it is kept


async def test_a_replace_whose_reply_was_lost_names_its_own_entries_on_retry(
    store: ContextStore, other: ContextStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A replace of two messages, reply lost, an append in between: the retry names the two."""
    await store.append("s", turn(0))
    dropped = drop_reply(
        store, monkeypatch, SCRIPTS.rewrite, between=lambda: other.append("s", turn(5))
    )
    result = await store.replace("s", [turn(1), turn(2)])
    assert dropped == [True]
    history = await store.read("s")
    assert result.entry_ids == tuple(m.entry_id for m in history.messages[:2])
    assert [m.message for m in history.messages] == [turn(1), turn(2), turn(5)]


# -- finding 2: a consumed lease --------------------------------------------------------------


@pytest.mark.parametrize("emptying", ["replace", "clear"])
async def test_a_replaced_history_never_hands_out_an_id_the_old_one_had(
    store: ContextStore, raw_redis: Redis, emptying: str
) -> None:
    """The new entries' ids come after every id the old log gave, even in the same ms.

    The old log's last id is set ahead of the clock (what the same millisecond, or a
    clock stepped back, would give): a log deleted and made again started over below it,
    so an id kept from before (a recall tool's) named a message of the new history.
    """
    old = await store.append_many("s", [turn(0), turn(1)])
    ahead = f"{int(time.time() * 1000) + 60_000}-7"
    await raw_redis.execute_command("XSETID", store.keys("s").log, ahead)
    if emptying == "clear":
        await store.clear("s")
        [new] = await store.append_many("s", [turn(2)])
        ids = (new.entry_id,)
    else:
        ids = (await store.replace("s", [turn(2), turn(3)])).entry_ids
    assert all(entry_order(i) > entry_order(ahead) for i in ids)
    for kept in old:
        assert await store.get_entry("s", kept.entry_id) is None
    assert len(await store.get_messages("s")) == len(ids)


async def test_a_consumed_lease_cannot_replace_again(store: ContextStore) -> None:
    """The second replace under one lease raises LeaseLostError and changes nothing."""
    await store.append("s", turn(0))
    lease = await store.lease("s")
    await store.replace("s", [turn(1)], lease=lease)
    with pytest.raises(LeaseLostError):
        await store.replace("s", [turn(2)], lease=lease)
    assert await store.get_messages("s") == [turn(1)]


async def test_a_consumed_lease_is_refused_by_the_script_too(store: ContextStore) -> None:
    """A second process holding a copy of the consumed lease's token cannot write with it."""
    await store.append("s", turn(0))
    lease = await store.lease("s")
    await store.replace("s", [turn(1)], lease=lease)
    lease._released = False  # as a copy of the lease in another process would be
    with pytest.raises(LeaseLostError):
        await store.clear("s", lease=lease)
    assert await store.get_messages("s") == [turn(1)]


# -- finding 7: epochs and sequence numbers never go backwards -----------------------------


async def test_delete_then_recreate_keeps_epoch_and_seq_moving_forward(
    store: ContextStore,
) -> None:
    """After delete, the recreated session's seq and epoch are past the old ones."""
    for i in range(3):
        await store.append("s", turn(i))
    before = await store.info("s")
    assert await store.delete("s")
    again = await store.append("s", turn(7))
    assert again.seq > before.seq and again.epoch > before.epoch
    with pytest.raises(ConflictError):
        await store.append("s", turn(8), expected_seq=before.seq)
    with pytest.raises(ConflictError):
        await store.replace("s", [turn(8)], expected_seq=before.seq)


async def test_a_first_write_after_delete_with_the_old_seq_is_a_conflict(
    store: ContextStore,
) -> None:
    """An append-if written against the deleted history is refused, even as the first write."""
    for i in range(3):
        await store.append("s", turn(i))
    seq = (await store.info("s")).seq
    await store.delete("s")
    with pytest.raises(ConflictError):
        await store.append("s", turn(9), expected_seq=seq)


async def test_paging_across_delete_and_recreate_never_mixes_the_two(
    store: ContextStore, settings: Settings, tenant: str
) -> None:
    """A paged read crossing a delete and a recreate raises EpochChangedError."""
    await store.append_many("s", [turn(i) for i in range(3)])
    one_per_page = settings.model_copy(update={"history_page_size": 1})
    async with ContextStore.from_settings(one_per_page, tenant=tenant) as paged:
        pages = paged.iter_history("s")
        first = await anext(pages)
        await store.delete("s")
        await store.append_many("s", [turn(i) for i in range(10, 13)])
        with pytest.raises(EpochChangedError):
            async for _ in pages:
                pass
    assert first.message == turn(0)


async def test_a_delete_whose_reply_was_lost_answers_true_on_retry(
    store: ContextStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Delete applied, reply lost, SDK retries: True (it existed), not False."""
    await store.append("s", turn(0))
    dropped = drop_reply(store, monkeypatch, SCRIPTS.delete)
    assert await store.delete("s") is True
    assert dropped == [True]
    assert await store.delete("s") is False


# -- finding 5: every write path under the same quotas -----------------------------------------


async def limited_store(settings: Settings, tenant: str, limits: TenantLimits) -> ContextStore:
    async with ContextStore.from_settings(settings, tenant=tenant) as operator:
        await operator.set_limits(limits)
    return ContextStore.from_settings(settings, tenant=tenant)


async def test_replace_is_held_to_the_append_rate(settings: Settings, tenant: str) -> None:
    """Under 1 append/s with a burst of 5, a replace of 50 messages is refused, nothing written."""
    store = await limited_store(
        settings, tenant, TenantLimits(appends_per_second=1, append_burst=5)
    )
    async with store:
        await store.append("s", turn(0))
        with pytest.raises(QuotaExceededError) as refused:
            await store.replace("s", [turn(i) for i in range(50)])
        assert refused.value.quota == "appends_per_second"
        assert await store.get_messages("s") == [turn(0)]
        await store.replace("s", [turn(1), turn(2)])  # within the burst: allowed


async def test_pinned_copies_count_against_session_bytes(settings: Settings, tenant: str) -> None:
    """A pin that would take the session past session_bytes is refused (the copy is stored too)."""
    store = await limited_store(settings, tenant, TenantLimits(session_bytes=100_000))
    async with store:
        big = {"role": "user", "content": "x" * 60_000}
        appended = await store.append("s", big)
        with pytest.raises(QuotaExceededError) as refused:
            await store.pin("s", appended.entry_id)
        assert refused.value.quota == "session_bytes"
        assert (await store.info("s")).pinned == ()


async def test_a_pinned_append_counts_its_copy(settings: Settings, tenant: str) -> None:
    """Appending a pinned 60 KB message twice stores 240 KB: refused under a 200 KB quota."""
    store = await limited_store(settings, tenant, TenantLimits(session_bytes=200_000))
    async with store:
        big = {"role": "user", "content": "x" * 60_000}
        await store.append("s", big, pinned=True)
        with pytest.raises(QuotaExceededError):
            await store.append("s", big, pinned=True)


# -- finding 8: input ----------------------------------------------------------------------------


@pytest.mark.parametrize("depth", [250, 300, 1_000])
async def test_deeply_nested_json_is_an_invalid_message(
    store: ContextStore, raw_redis: Redis, depth: int
) -> None:
    """A message nested hundreds of levels deep: InvalidMessageError, and nothing written."""
    nested: Any = "leaf"
    for _ in range(depth):
        nested = [nested] if depth % 2 else {"k": nested}
    with pytest.raises(InvalidMessageError, match="nested"):
        await store.append("s", {"role": "user", "content": "x", "metadata": {"deep": nested}})
    assert not await raw_redis.exists(*store.keys("s").all())


async def test_an_unknown_lease_kind_is_refused(store: ContextStore, raw_redis: Redis) -> None:
    """lease(kind='bogus') raises InvalidInputError and takes no lease."""
    with pytest.raises(InvalidInputError):
        await store.lease("s", kind="bogus")  # type: ignore[arg-type]
    assert not await raw_redis.exists(store.keys("s").lease)


@pytest.mark.parametrize("backend", BACKENDS, indirect=True)
async def test_a_due_touch_of_the_index_costs_the_write_no_round_trip(
    settings: Settings, tenant: str, raw_redis: Redis, backend: str
) -> None:
    """Each write is due a touch: in its round trip on one Redis, alongside it on a cluster."""
    clock = ManualClock(int(time.time() * 1000))
    every_write = settings.model_copy(update={"index_interval": 0.0})
    async with ContextStore.from_settings(every_write, tenant=tenant, clock=clock) as store:
        await store.append("s", turn(0))  # creates and lists s
        real = store._connection.node_call
        trips: list[list[str]] = []
        script_sent = asyncio.Event()

        async def node_call(key: str, commands: Any, **kwargs: Any) -> Any:
            names = [str(command[0]) for command in commands]
            trips.append(names)
            if names[0] == "EVALSHA":
                script_sent.set()
            else:  # on a cluster, the touch waits here until the write is under way
                async with asyncio.timeout(10):
                    await script_sent.wait()
            return await real(key, commands, **kwargs)

        store._connection.node_call = node_call  # type: ignore[method-assign]
        for n in range(1, 4):
            clock.advance(5)
            trips.clear()
            script_sent.clear()
            await store.append("s", turn(n))
            if backend == "single":
                assert trips == [["EVALSHA", "ZADD"]]
            else:
                assert sorted(trips) == [["EVALSHA"], ["ZADD"]]
            index = tenant_sessions_key(settings.key_prefix, tenant)
            assert await raw_redis.zscore(index, "s") == clock.now_ms()
        assert [m.message for m in (await store.read("s")).messages] == [turn(n) for n in range(4)]


async def test_a_refused_touch_is_logged_and_never_fails_the_write(
    settings: Settings, tenant: str, raw_redis: Redis, caplog: pytest.LogCaptureFixture
) -> None:
    """The index refuses the touch (a wrong type): the append lands, is answered, and is logged."""
    every_write = settings.model_copy(update={"index_interval": 0.0})
    async with ContextStore.from_settings(every_write, tenant=tenant) as store:
        await store.append("s", turn(0))
        index = tenant_sessions_key(settings.key_prefix, tenant)
        await raw_redis.delete(index)
        await raw_redis.set(index, "not an index")
        with caplog.at_level("WARNING", logger="ctxstore"):
            result = await store.append("s", turn(1))
        assert not result.duplicate and result.seq == 2
        assert [m.message for m in (await store.read("s")).messages] == [turn(0), turn(1)]
        assert "WRONGTYPE" in caplog.text
        await raw_redis.delete(index)


async def test_a_session_written_more_often_than_the_interval_keeps_its_activity_fresh(
    settings: Settings, tenant: str, raw_redis: Redis
) -> None:
    """Writes every half interval, and one after another pod's first: the score keeps moving."""
    clock = ManualClock(int(time.time() * 1000))
    index = tenant_sessions_key(settings.key_prefix, tenant)
    async with (
        ContextStore.from_settings(settings, tenant=tenant, clock=clock) as store,
        ContextStore.from_settings(settings, tenant=tenant, clock=clock) as other_pod,
    ):
        await store.append("s", turn(0))
        created = await raw_redis.zscore(index, "s")
        for n in range(1, 9):
            clock.advance(settings.index_interval / 2)
            await store.append("s", turn(n))
            assert (
                await raw_redis.zscore(index, "s")
                >= clock.now_ms() - settings.index_interval * 1000
            )
        assert await raw_redis.zscore(index, "s") > created
        clock.advance(settings.index_interval / 4)
        await other_pod.append(
            "s", turn(9)
        )  # its first write of s, within the first pod's interval
        assert await raw_redis.zscore(index, "s") == clock.now_ms()


async def test_a_late_touch_never_moves_a_session_s_activity_back(
    settings: Settings, tenant: str, raw_redis: Redis
) -> None:
    """A pod whose clock is 5 s behind writes after one on time: the later score stays."""
    on_time = ManualClock(int(time.time() * 1000))
    behind = ManualClock(on_time.now_ms() - 5_000)
    index = tenant_sessions_key(settings.key_prefix, tenant)
    async with (
        ContextStore.from_settings(settings, tenant=tenant, clock=on_time) as a,
        ContextStore.from_settings(settings, tenant=tenant, clock=behind) as b,
    ):
        await a.append("s", turn(0))
        on_time.advance(2)
        await a.append("s", turn(1))  # due: the score is on_time's now
        assert await raw_redis.zscore(index, "s") == on_time.now_ms()
        await b.append("s", turn(2))  # b's first write: due, 3 s before a's touch
        assert await raw_redis.zscore(index, "s") == on_time.now_ms()
        assert len((await a.read("s")).messages) == 3
