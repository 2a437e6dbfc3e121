"""The request view on real Redis: what it sends, in which order, and how it is counted.

Planning rules on hand-built entries are in test_view_plan.py; these tests go
through the store: histories written by racing pods, summaries committed by
the worker's job, and the token count of exactly what is sent.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from typing import Any

import pytest
from hypothesis import HealthCheck, given
from hypothesis import settings as settings_
from hypothesis import strategies as st
from support.config import examples
from support.helpers import SYSTEM, assistant, oa_call, oa_result, paired, turn, user

from ctxstore import (
    ContextStore,
    LocalSummarizer,
    RequestView,
    Settings,
    TiktokenCounter,
    count_message,
)
from ctxstore.testing import FakeSummarizer, orphans

COUNTER = TiktokenCounter()

# -- finding 3: a result stored before its call -------------------------------------------------


async def test_a_result_stored_before_its_call_is_sent_after_it_and_reported(
    store: ContextStore,
) -> None:
    """Two pods raced: [user, tool c1, assistant call c1] is sent as [user, call, result]."""
    await store.append_many("s", [user("go"), oa_result("c1"), oa_call("c1")])
    view = await store.view("s", token_budget=10_000)
    assert view.messages == [user("go"), oa_call("c1"), oa_result("c1")]
    assert paired(view.messages) == 1
    assert view.stats.repairs == ["moved result c1 after its call"]


async def test_results_before_their_calls_are_placed_at_every_budget(store: ContextStore) -> None:
    """Whatever the budget, a view never sends a result before its call."""
    history = [user("go"), oa_result("c1"), oa_result("c2"), oa_call("c1", "c2"), turn(4)]
    await store.append_many("s", history)
    for budget in range(20, 400, 10):
        view = await store.view("s", token_budget=budget)
        paired(view.messages)
        assert view.stats.tokens <= budget


# -- finding 3: the summary is counted exactly ------------------------------------------------


@pytest.mark.parametrize("role", ["user", "system"])
async def test_the_summary_message_is_counted_as_it_is_sent(
    summary_settings: Settings, tenant: str, role: str
) -> None:
    """stats.tokens is exactly the count of the messages sent, summary included."""
    settings = summary_settings.model_copy(update={"summary_role": role})
    counter = TiktokenCounter()
    async with ContextStore.from_settings(settings, tenant=tenant) as store:
        await store.append_many("s", [turn(i) for i in range(40)])
        outcome = await store.summarize("s", FakeSummarizer())
        assert outcome.status == "committed"
        used = 0
        for budget in range(300, 1_500, 50):
            view = await store.view("s", token_budget=budget)
            used += view.stats.summary_used
            sent = sum(count_message(counter, m) for m in view.messages)
            assert view.stats.tokens == sent, budget
            assert sent <= budget
        assert used > 10


# -- the anchor: a prefix every pod shares, moved in one step ---------------------------------


def order(entry_id: str) -> tuple[int, int]:
    ms, seq = entry_id.split("-")
    return int(ms), int(seq)


def dumped(messages: list[dict[str, Any]]) -> list[str]:
    return [json.dumps(m, sort_keys=True) for m in messages]


async def test_appends_only_extend_the_view_until_it_moves_once(store: ContextStore) -> None:
    """Between two moves each view starts with the previous one; a move drops to the low water."""
    await store.append("s", SYSTEM)
    previous: list[str] = []
    moves = 0
    budget = 1_000
    for i in range(80):
        await store.append("s", turn(i))
        view = await store.view("s", token_budget=budget)
        now = dumped(view.messages)
        if now[: len(previous)] != previous:
            moves += 1
            assert view.stats.tokens <= store.settings.view_low_water * budget + 40  # a turn
        previous = now
        assert view.stats.tokens <= budget
    # 80 turns of ~40 tokens, a third of the budget freed per move: a move every ~8 turns.
    assert 5 <= moves <= 12


async def test_a_move_takes_a_large_exchange_that_fits_rather_than_an_almost_empty_view(
    settings: Settings, tenant: str
) -> None:
    """~800-token exchanges, then a question; budget 1,000: the move keeps the last exchange."""
    whole = settings.model_copy(update={"offload_threshold_tokens": 100_000})  # no previews
    async with ContextStore.from_settings(whole, tenant=tenant) as store:
        for i in range(3):
            await store.append_many(
                "s",
                [user(f"check part {i}"), oa_call(f"c{i}"), oa_result(f"c{i}", "row " * 780)],
            )
        await store.append("s", user("and now?"))
        view = await store.view("s", token_budget=1_000)
    assert view.stats.tokens <= 1_000
    assert view.stats.tokens >= 800, view.stats
    assert view.messages[-1] == user("and now?") and paired(view.messages) == 1


async def test_a_pod_that_viewed_a_session_reads_little_more_than_it_sends(
    store: ContextStore,
) -> None:
    """Between anchor moves, a view reads from its anchor's start, not a budget's worth back."""
    await store.append("s", SYSTEM)
    await store.append_many("s", [turn(i) for i in range(400)])
    previous = dumped((await store.view("s", token_budget=2_000)).messages)
    held = 0
    for i in range(400, 430):
        await store.append("s", turn(i))
        view = await store.view("s", token_budget=2_000)
        now = dumped(view.messages)
        if now[: len(previous)] == previous:  # the anchor held (a move reads back, once)
            held += 1
            sent = view.stats.messages - 1  # the system prompt is read from its own copy
            assert view.stats.entries_read <= 1 + sent + max(8, sent // 4) + 1, view.stats
        previous = now
    assert held >= 20


async def test_a_move_with_a_summary_fills_to_the_low_water_with_covered_entries(
    summary_settings: Settings, tenant: str
) -> None:
    """After a move the raw part reaches back past the summary's coverage while it fits.

    Raw text keeps what a summary loses: a view that sent the summary and only
    the uncovered tail would leave most of the budget empty.
    """
    async with ContextStore.from_settings(summary_settings, tenant=tenant) as store:
        await store.append_many("s", [turn(i) for i in range(60)])
        outcome = await store.summarize("s", LocalSummarizer())
        assert outcome.status == "committed"
        budget = 1_600
        view = await store.view("s", token_budget=budget)
        assert view.stats.summary_used
        assert view.stats.history_tokens > budget
        covers = view.stats.summary_covers
        assert covers is not None
        page = await store.read("s")
        covered = [m.message for m in page.messages if order(m.entry_id) <= order(covers)]
        assert any(m in covered for m in view.messages), "no covered entry was sent"
        low = store.settings.view_low_water_floor * budget
        assert low - 60 <= view.stats.tokens <= budget


async def test_two_pods_reading_at_once_get_byte_identical_views(
    settings: Settings, tenant: str
) -> None:
    """Pods that read one session at the same moments send the same bytes, moves included."""
    async with (
        ContextStore.from_settings(settings, tenant=tenant) as a,
        ContextStore.from_settings(settings, tenant=tenant) as b,
    ):
        await a.append("s", SYSTEM)
        for i in range(60):
            await (a if i % 2 else b).append("s", turn(i))
            views = await asyncio.gather(
                a.view("s", token_budget=800), b.view("s", token_budget=800)
            )
            assert dumped(views[0].messages) == dumped(views[1].messages), i


async def test_budgets_do_not_fight_over_one_anchor(store: ContextStore) -> None:
    """Two models' budgets on one session each keep their own prefix."""
    await store.append("s", SYSTEM)
    previous: dict[int, list[str]] = {600: [], 1_500: []}
    moves = {600: 0, 1_500: 0}
    for i in range(60):
        await store.append("s", turn(i))
        for budget in (600, 1_500):
            now = dumped((await store.view("s", token_budget=budget)).messages)
            moves[budget] += now[: len(previous[budget])] != previous[budget]
            previous[budget] = now
    assert moves[1_500] < moves[600] <= 15


async def test_a_move_is_atomic_under_racing_pods_appends_and_summaries(
    summary_settings: Settings, tenant: str
) -> None:
    """Pods append, view and summarize at once: every round, all views agree and are sound."""
    async with (
        ContextStore.from_settings(summary_settings, tenant=tenant) as a,
        ContextStore.from_settings(summary_settings, tenant=tenant) as b,
        ContextStore.from_settings(summary_settings, tenant=tenant) as c,
    ):
        await a.append("s", SYSTEM)
        summarizer = LocalSummarizer()
        for round_ in range(25):
            await asyncio.gather(
                a.append_many("s", [user(f"round {round_} a"), oa_call(f"a{round_}")]),
                b.append("s", turn(round_)),
            )
            await a.append("s", oa_result(f"a{round_}", "done " * 20))
            results = await asyncio.gather(
                a.view("s", token_budget=700),
                b.view("s", token_budget=700),
                c.view("s", token_budget=700),
                c.summarize("s", summarizer),
                return_exceptions=True,
            )
            views = [r for r in results[:3] if isinstance(r, RequestView)]
            assert len(views) == 3, results
            again = await asyncio.gather(*(p.view("s", token_budget=700) for p in (a, b, c)))
            assert len({tuple(dumped(v.messages)) for v in again}) == 1, round_
            for view in (*views, *again):
                assert orphans(view.messages) == 0
                assert view.stats.tokens <= 700


@settings_(
    max_examples=examples(60),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    script=st.lists(
        st.sampled_from(["user", "assistant", "call", "parallel", "big", "result-first"]),
        min_size=5,
        max_size=60,
    ),
    budget=st.integers(min_value=150, max_value=3_000),
)
async def test_random_histories_give_sound_views(
    store: ContextStore, script: list[str], budget: int
) -> None:
    """Any history and budget: no orphan, no result before its call, within the budget."""
    session = f"p{uuid.uuid4().hex[:8]}"
    await store.append(session, SYSTEM)
    for n, step in enumerate(script):
        batch: list[dict[str, Any]] = {
            "user": [user(f"u{n} " + "words " * (n % 7 * 5))],
            "assistant": [assistant(f"a{n} " + "more " * (n % 5 * 8))],
            "call": [oa_call(f"c{n}"), oa_result(f"c{n}", "out " * (n % 4 * 30))],
            "parallel": [oa_call(f"p{n}a", f"p{n}b"), oa_result(f"p{n}b"), oa_result(f"p{n}a")],
            "big": [oa_call(f"b{n}"), oa_result(f"b{n}", "line of log output\n" * 400)],
            "result-first": [oa_result(f"r{n}"), oa_call(f"r{n}")],
        }[step]
        await store.append_many(session, batch)
        view = await store.view(session, token_budget=budget)
        paired(view.messages)
        assert view.stats.tokens <= budget or view.stats.over_budget
        counted = sum(count_message(COUNTER, m) for m in view.messages)
        assert counted <= view.stats.tokens  # stripped repairs only ever count less
        assert view.messages[0] == SYSTEM
