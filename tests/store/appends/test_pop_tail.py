"""pop and tail: the newest messages, read or taken off, in one step each."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from support.helpers import numbered

from ctxstore import ContextStore, Settings
from ctxstore.errors import QuotaExceededError
from ctxstore.models import TenantLimits
from ctxstore.summarizers import LocalSummarizer


async def test_tail_answers_the_newest_messages_oldest_first(store: ContextStore) -> None:
    """tail(3) of ten messages: the last three, in order, with their counted tokens."""
    await store.append_many("s", [numbered(i) for i in range(10)])
    tail = await store.tail("s", 3)
    assert [m.message["content"] for m in tail] == ["message 7", "message 8", "message 9"]
    assert all(m.tokens > 0 for m in tail)
    assert await store.tail("s", 50) == (await store.read("s")).messages
    assert await store.tail("absent", 5) == []


async def test_pop_takes_the_newest_and_updates_the_counters(store: ContextStore) -> None:
    """Pop returns the newest message; the history, count, tokens and seq follow."""
    await store.append_many("s", [numbered(i) for i in range(3)])
    before = await store.info("s")
    popped = await store.pop("s")
    assert popped is not None and popped.message == numbered(2)
    after = await store.info("s")
    assert await store.get_messages("s") == [numbered(0), numbered(1)]
    assert after.count == 2 and after.tokens == before.tokens - popped.tokens
    assert after.seq > before.seq and after.epoch == before.epoch + 1
    rest = [await store.pop("s"), await store.pop("s")]
    assert [p.message if p else None for p in rest] == [numbered(1), numbered(0)]
    assert await store.get_messages("s") == []
    assert await store.pop("s") is None
    assert (await store.info("s")).count == 0
    assert await store.pop("never") is None


async def test_concurrent_pops_take_different_messages(store: ContextStore) -> None:
    """Twenty pops racing over ten messages: each message is taken once, ten come back None."""
    await store.append_many("s", [numbered(i) for i in range(10)])
    popped = await asyncio.gather(*(store.pop("s") for _ in range(20)))
    taken = [p.message["content"] for p in popped if p is not None]
    assert sorted(taken) == sorted(f"message {i}" for i in range(10))
    assert popped.count(None) == 10


async def test_a_pop_retried_after_a_lost_reply_takes_one_message(
    store: ContextStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The script runs, its reply is lost, the retry is answered with the same message."""
    await store.append_many("s", [numbered(i) for i in range(3)])
    connection = store._connection
    real = connection.script
    runs = 0

    async def lossy(script: Any, keys: Any, args: Any, **kwargs: Any) -> Any:
        nonlocal runs
        reply = await real(script, keys, args, **kwargs)
        runs += 1
        if runs == 1:
            return await real(script, keys, args, **kwargs)  # the retry of a lost reply
        return reply

    monkeypatch.setattr(connection, "script", lossy)
    popped = await store.pop("s")
    assert popped is not None and popped.message == numbered(2)
    assert await store.get_messages("s") == [numbered(0), numbered(1)]


async def test_pop_keeps_a_summary_that_does_not_cover_it_and_drops_one_that_does(
    settings: Settings, tenant: str
) -> None:
    """A summary of older messages survives a pop of a newer one; popping into it drops it."""
    small = settings.model_copy(update={"summary_trigger_tokens": 40, "summary_keep_tokens": 20})
    async with ContextStore.from_settings(small, tenant=tenant) as store:
        await _summary_kept_then_dropped(store)


async def _summary_kept_then_dropped(store: ContextStore) -> None:
    await store.append_many("s", [numbered(i) for i in range(40)])
    assert (await store.summarize("s", LocalSummarizer())).status == "committed"
    covers = (await store.info("s")).summary_covers
    assert covers
    await store.pop("s")
    assert (await store.info("s")).summary_covers == covers
    view = await store.view("s", token_budget=150)  # under the history: the summary stands in
    assert view.stats.summary_used and view.stats.summary_covers == covers
    newest_covered = False
    while not newest_covered:
        popped = await store.pop("s")
        assert popped is not None
        newest_covered = popped.entry_id == covers or (await store.info("s")).summary_covers is None
    info = await store.info("s")
    assert info.summary_covers is None
    assert not (await store.view("s", token_budget=150)).stats.summary_used


async def test_pop_counts_against_the_write_rate(store: ContextStore) -> None:
    """Over the write rate, pop raises QuotaExceededError and takes nothing."""
    await store.set_limits(TenantLimits(appends_per_second=0.001, append_burst=3))
    await store.append_many("s", [numbered(i) for i in range(2)])  # two of the burst's three
    assert await store.pop("s") is not None  # the third
    with pytest.raises(QuotaExceededError):
        await store.pop("s")
    assert await store.get_messages("s") == [numbered(0)]


async def test_pop_of_a_pinned_message_gives_its_bytes_back(store: ContextStore) -> None:
    """A pinned message popped: its keep copy goes, and the byte count with it."""
    await store.append("s", numbered(0))
    before = await store.info("s")
    await store.append("s", numbered(1), pinned=True)
    await store.pop("s")
    after = await store.info("s")
    assert after.pinned == () and after.count == before.count
