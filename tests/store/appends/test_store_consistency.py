"""The store's bookkeeping under races, retries and refusals.

TTLs, the tenant's session index, refused writes and replayed summary
commits: each must leave the session's counters and its listing true.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
from redis import exceptions as rex
from redis.asyncio import Redis
from support.config import SUMMARY_TRIGGER
from support.helpers import USER, ttl_span

from ctxstore import (
    ContextStore,
    LeaseHeldError,
    LeaseLostError,
    QuotaExceededError,
    SessionNotFoundError,
    Settings,
)
from ctxstore._redis.scripts import SCRIPTS
from ctxstore.testing import FakeSummarizer, ManualClock


@pytest.fixture
async def timed(settings: Settings, tenant: str, clock: ManualClock) -> AsyncIterator[ContextStore]:
    """A store on the manual clock: a one-minute default TTL, at most 2 sessions, no lease wait."""
    ttl = settings.model_copy(
        update={"session_ttl_seconds": 60, "max_sessions": 2, "lease_wait_seconds": 0}
    )
    async with ContextStore.from_settings(ttl, tenant=tenant, clock=clock) as store:
        yield store


async def listed(store: ContextStore) -> set[str]:
    """The sessions the tenant's index lists."""
    return {row.session for row in await store.list_sessions()}


# -- TTL --------------------------------------------------------------------------------


async def test_set_ttl_none_outlives_the_next_write(
    settings: Settings, tenant: str, raw_redis: Redis
) -> None:
    """A session told never to expire keeps no TTL after a write, whatever the default."""
    ttl = settings.model_copy(update={"session_ttl_seconds": 100})
    async with ContextStore.from_settings(ttl, tenant=tenant) as store:
        await store.append("s", USER)
        await store.set_ttl("s", None)
        await store.append("s", USER)
        assert await raw_redis.pttl(store.keys("s").log) == -1
        assert await raw_redis.pttl(store.keys("s").meta) == -1
        assert (await store.info("s")).ttl_seconds is None
        await store.set_ttl("s", 50)
        await store.append("s", USER)
        assert 0 < await raw_redis.pttl(store.keys("s").log) <= ttl_span(50_000)


async def test_set_ttl_racing_a_first_append_never_costs_it_its_counters(
    store: ContextStore, raw_redis: Redis
) -> None:
    """set_ttl on a missing session, racing its first append: the counters match the stream."""
    for i in range(150):
        session = f"race{i}"
        ttl, appended = await asyncio.gather(
            store.set_ttl(session, 600), store.append(session, USER), return_exceptions=True
        )
        assert ttl is None or isinstance(ttl, SessionNotFoundError)
        assert not isinstance(appended, BaseException)
        info = await store.info(session)
        assert (info.seq, info.count) == (1, 1), session
        assert await raw_redis.xlen(store.keys(session).log) == 1


async def test_set_ttl_on_a_missing_session_writes_nothing(
    store: ContextStore, raw_redis: Redis
) -> None:
    """Refused as not found, and no key of the session exists afterwards."""
    with pytest.raises(SessionNotFoundError):
        await store.set_ttl("missing", 60)
    for key in store.keys("missing").all():
        assert not await raw_redis.exists(key)


# -- the session index ----------------------------------------------------------------


async def one_forever_one_expired(store: ContextStore, clock: ManualClock, raw: Redis) -> None:
    """Sessions "forever" (no TTL of its own) and "expired" (keys gone), both idle 2 minutes."""
    await store.append("forever", USER)
    await store.set_ttl("forever", None)
    await store.append("expired", USER)
    await raw.delete(*store.keys("expired").all())  # what Redis's expiry does
    clock.advance(120)


async def test_the_index_keeps_a_session_that_outlives_the_default_ttl(
    timed: ContextStore, clock: ManualClock, raw_redis: Redis
) -> None:
    """Idle past the tenant's TTL is not gone: a session with no TTL of its own stays listed."""
    await one_forever_one_expired(timed, clock, raw_redis)
    assert await listed(timed) == {"forever"}
    assert (await timed.info("forever")).count == 1


async def test_the_session_quota_frees_only_the_slots_of_expired_sessions(
    timed: ContextStore, clock: ManualClock, raw_redis: Redis
) -> None:
    """At the cap, an expired session's slot is reused; a live one's (no TTL) is not."""
    await one_forever_one_expired(timed, clock, raw_redis)
    async with ContextStore.from_settings(
        timed.settings, tenant=timed.tenant, clock=clock
    ) as other:  # a process that has not seen these sessions
        await other.append("new", USER)
        with pytest.raises(QuotaExceededError) as refused:
            await other.append("one-more", USER)
    assert refused.value.quota == "sessions"
    assert await listed(timed) == {"forever", "new"}


# -- refused writes ---------------------------------------------------------------------


async def test_a_first_replace_that_cannot_get_the_lease_leaves_the_session_unlisted(
    timed: ContextStore,
) -> None:
    """The lease is held by another writer: nothing written, no listing, no quota slot."""
    held = await timed.lease("s", wait_s=0)
    with pytest.raises(LeaseHeldError):
        await timed.replace("s", [USER])
    assert "s" not in await listed(timed)
    await held.release()


async def test_a_first_replace_whose_lease_ran_out_leaves_the_session_unlisted(
    timed: ContextStore, clock: ManualClock
) -> None:
    """A replace under an expired lease: LeaseLostError, and the session is not listed."""
    lease = await timed.lease("s", ttl_s=10, wait_s=0)
    clock.advance(11)
    with pytest.raises(LeaseLostError):
        await timed.replace("s", [USER], lease=lease)
    assert "s" not in await listed(timed)
    assert not (await timed.info("s")).exists


# -- summaries ----------------------------------------------------------------------------


def open_exchange() -> list[dict[str, Any]]:
    """A tool call still running, then plain turns: a summary can cover nothing yet."""
    call = {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "build", "arguments": "{}"}}
        ],
    }
    turns = [{"role": "user", "content": f"turn {i}: " + "still waiting " * 12} for i in range(8)]
    return [call, *turns]


async def test_a_view_does_not_ask_again_for_a_summary_that_found_nothing_to_cover(
    summary_settings: Settings, tenant: str
) -> None:
    """After an idle job, truncated views queue no more jobs; the trigger still will."""
    quiet = summary_settings.model_copy(update={"summary_trigger_tokens": 10_000})
    async with ContextStore.from_settings(quiet, tenant=tenant) as store:
        await store.append_many("s", open_exchange())
        before = await store.info("s")
        assert before.tokens_unsummarized > quiet.summary_keep_tokens
        outcome = await store.summarize("s", FakeSummarizer())
        assert outcome.status == "idle"
        generation = (await store.info("s")).summary_generation
        for _ in range(3):
            view = await store.view("s", token_budget=100)
            assert view.stats.dropped > 0 and not view.stats.summary_used
        assert (await store.info("s")).summary_generation == generation


async def test_after_a_job_that_covered_nothing_only_what_could_change_that_is_due(
    summary_settings: Settings, tenant: str
) -> None:
    """Past the trigger after an idle job: a short turn queues no job; the tool's result does."""
    async with ContextStore.from_settings(summary_settings, tenant=tenant) as store:
        await store.append_many("s", open_exchange())
        while (await store.info("s")).tokens_unsummarized < SUMMARY_TRIGGER:
            await store.append("s", {"role": "user", "content": "still waiting " * 12})
        assert (await store.summarize("s", FakeSummarizer())).status == "idle"
        short = await store.append("s", {"role": "user", "content": "and now?"})
        assert not short.summary_due
        answer = await store.append("s", {"role": "tool", "tool_call_id": "c1", "content": "ok"})
        assert answer.summary_due


async def test_a_summary_commit_whose_reply_was_lost_is_reported_committed(
    summary_settings: Settings, tenant: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The commit applies, the connection drops before its reply, the SDK retries: committed."""
    async with ContextStore.from_settings(summary_settings, tenant=tenant) as store:
        await store.append_many(
            "s", [{"role": "user", "content": f"turn {i}: " + "words " * 30} for i in range(20)]
        )
        real = store._connection.node_call
        dropped: list[bool] = []

        async def drop_first_commit_reply(key: str, commands: Any, **kwargs: Any) -> Any:
            replies = await real(key, commands, **kwargs)
            if commands[0][1] == SCRIPTS.summary_commit.sha and not dropped:
                dropped.append(True)
                raise rex.ConnectionError("connection lost before the reply")
            return replies

        monkeypatch.setattr(store._connection, "node_call", drop_first_commit_reply)
        outcome = await store.summarize("s", FakeSummarizer())
        assert dropped == [True]
        assert outcome.status == "committed"
        info = await store.info("s")
        assert (info.summary_runs, info.summary_covers) == (1, outcome.covers_upto)
