"""``session_bytes`` bounds what a session holds: its history, checkpoints and branches.

A rewind moves the abandoned tail into a branch, still readable with
``read_branch``: its bytes stay charged to the session (a rewind frees no
room) until the branch is pushed out by newer ones (``max_branches``) or the
session is cleared, replaced or deleted. A fork shares none of its source's
branches and is not charged for them. So no sequence of appends, rewinds,
pops, checkpoints, forks and clears leaves a session holding more than its
quota, and its counter is what Redis holds.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import uuid
from collections.abc import AsyncIterator
from typing import Any

import hypothesis
import pytest
from hypothesis import HealthCheck, given
from hypothesis import strategies as st
from redis.asyncio import Redis
from support.config import examples

from ctxstore import ContextStore, QuotaExceededError, Settings, TenantLimits

MESSAGE = {"role": "user", "content": "word " * 60}
"""Every message alike: a fork's shared part is charged at its source's bytes per token,
exact for a history of one kind of message (the design's own terms for that estimate)."""


def size(message: dict[str, Any]) -> int:
    """The bytes a message is stored in (its JSON as the store writes it, unsealed)."""
    return len(json.dumps(message, ensure_ascii=False, separators=(",", ":")).encode())


async def held(store: ContextStore, session: str) -> tuple[int, int]:
    """The bytes readable in the session's history, and in all of its branches."""
    history = sum(map(size, await store.get_messages(session)))
    branches = 0
    for branch in await store.branches(session):
        if not branch.readable:
            continue
        after = None
        while True:
            page = await store.read_branch(session, branch.branch_id, after=after)
            branches += sum(size(m.message) for m in page.messages)
            if page.next_after is None:
                break
            after = page.next_after
    return history, branches


async def charged(raw: Redis, store: ContextStore, session: str) -> tuple[int, int, bool]:
    """The session's counter, its checkpoints' bytes, and whether its history has a chain."""
    keys = store.keys(session)
    counter, chain = await raw.hmget(keys.meta, "bytes", "chain")
    points = sum(len(v) for v in (await raw.hgetall(keys.checkpoints)).values())
    copies = sum(len(v) for v in (await raw.hgetall(keys.checkpoint_summaries)).values())
    return int(counter or 0), points + copies, bool(chain)


@pytest.fixture
async def small(settings: Settings, tenant: str) -> AsyncIterator[ContextStore]:
    """Three branches a session at most, and forks that share all but two entries."""
    own = settings.model_copy(update={"max_branches": 3, "bridge_entries": 2, "bridge_tokens": 200})
    async with ContextStore.from_settings(own, tenant=tenant) as store:
        yield store


async def fill(store: ContextStore, session: str) -> None:
    """Append until the quota refuses one."""
    with contextlib.suppress(QuotaExceededError):
        while True:
            await store.append(session, MESSAGE)


async def test_fill_and_rewind_rounds_never_hold_more_than_the_quota(store: ContextStore) -> None:
    """Six rounds of fill then rewind to the start: history and branches stay within 20,000."""
    await store.set_limits(TenantLimits(session_bytes=20_000))
    first = (await store.append("s", MESSAGE)).entry_id
    for _ in range(6):
        await fill(store, "s")
        await store.rewind("s", first)
        history, branches = await held(store, "s")
        assert history + branches <= 20_000
    (branch,) = await store.branches("s")  # the later rounds found no room to fill
    assert branch.bytes == branches


async def test_a_branch_pushed_out_gives_its_bytes_back(
    small: ContextStore, raw_redis: Redis
) -> None:
    """Past max_branches the oldest goes, and the counter drops by what it held, no more."""
    store = small
    await store.set_limits(TenantLimits(session_bytes=20_000))
    first = (await store.append("s", MESSAGE)).entry_id
    for round_ in range(5):
        await store.append_many("s", [MESSAGE] * (round_ + 1))
        await store.rewind("s", first)
        branches = await store.branches("s")
        assert len(branches) == min(round_ + 1, 3)
        counter, _, _ = await charged(raw_redis, store, "s")
        assert counter == size(MESSAGE) + sum(b.bytes for b in branches)
        assert sum(await held(store, "s")) == counter


async def test_the_room_a_rewind_abandons_comes_back_with_clear(store: ContextStore) -> None:
    """At the quota with a branch, appends are refused; a clear gives the room back."""
    await store.set_limits(TenantLimits(session_bytes=5_000))
    first = (await store.append("s", MESSAGE)).entry_id
    await fill(store, "s")
    await store.rewind("s", first)
    count = (await store.info("s")).count
    with pytest.raises(QuotaExceededError, match="session_bytes"):
        await store.append_many("s", [MESSAGE] * 2)
    assert (await store.info("s")).count == count  # nothing written
    await store.clear("s")
    assert await store.branches("s") == []
    await store.append_many("s", [MESSAGE] * 2)


async def test_a_fork_is_not_charged_for_its_sources_branches(
    small: ContextStore, raw_redis: Redis
) -> None:
    """A fork sharing its source's history is charged that history's bytes, not its branches'."""
    store = small
    first = (await store.append("s", MESSAGE)).entry_id
    await store.append_many("s", [MESSAGE] * 9)
    await store.rewind("s", first)
    await store.append_many("s", [MESSAGE] * 2)
    await store.fork("s", "f")  # shares its first entry, copies the two newest
    counter, _, chained = await charged(raw_redis, store, "f")
    assert chained and counter == 3 * size(MESSAGE) == sum(await held(store, "f"))


@st.composite
def moves(draw: st.DrawFn) -> list[tuple[str, int, float]]:
    """What agents do to a session and its forks, each move on one of the sessions so far."""
    kinds = ["append"] * 4 + ["rewind"] * 2 + ["fork", "pop", "checkpoint", "clear", "delete"]
    return draw(
        st.lists(
            st.tuples(st.sampled_from(kinds), st.integers(0, 7), st.floats(0, 1)),
            min_size=4,
            max_size=25,
        )
    )


@hypothesis.settings(
    max_examples=examples(100),
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(plan=moves(), limit=st.sampled_from([2_500, 6_000]))
async def test_no_session_holds_more_than_its_byte_quota(
    small: ContextStore, raw_redis: Redis, plan: list[tuple[str, int, float]], limit: int
) -> None:
    """Random appends, rewinds, pops, checkpoints, forks, clears: within the quota, and counted."""
    store = small
    await store.set_limits(TenantLimits(session_bytes=limit))
    run = uuid.uuid4().hex[:8]
    sessions = [f"{run}-0"]
    made = itertools.count(1)
    shared: set[str] = set()  # a fork, or a history that had a chain: its charge is estimated
    for kind, pick, where in plan:
        hypothesis.event(kind)
        session = sessions[pick % len(sessions)]
        history = [m.entry_id async for m in store.iter_history(session)]
        at = history[int(where * (len(history) - 1))] if history else None
        try:
            if kind == "append":
                before = len(history)
                try:
                    await store.append_many(session, [MESSAGE] * (1 + int(where * 5)))
                except QuotaExceededError:
                    hypothesis.event("append refused")
                    assert len([m async for m in store.iter_history(session)]) == before
            elif kind == "rewind" and at is not None:
                await store.rewind(session, at)
            elif kind == "fork" and at is not None:
                fork = f"{run}-{next(made)}"
                await store.fork(session, fork, at=at)
                sessions.append(fork)
                shared.add(fork)
            elif kind == "pop":
                await store.pop(session)
            elif kind == "checkpoint" and history:
                await store.checkpoint(session)
            elif kind == "clear":
                await store.clear(session)
            elif kind == "delete" and len(sessions) > 1:
                await store.delete(session)
                sessions.remove(session)
        except QuotaExceededError:
            hypothesis.event(f"{kind} refused")
        for each in sessions:
            counter, points, chained = await charged(raw_redis, store, each)
            if chained:
                shared.add(each)
            history_bytes, branch_bytes = await held(store, each)
            readable = history_bytes + branch_bytes + points
            assert readable <= counter <= limit, (each, readable, counter)
            if each not in shared:  # its entries all in its own log and branches: exact
                assert readable == counter, (each, readable, counter)
    for each in sessions:
        await store.delete(each)
