"""Tool pairs and token counts of request views, through the store on real Redis.

A view never sends a call without its result, a result without its call, or a
result before its call, even when one call id is made by two messages (an
assistant message appended twice) or one message answers the calls of two;
``stats.tokens`` is the count of exactly what is sent, and what is sent fits
the budget. Planning rules on hand-built entries are in test_view_plan.py.
The last section is the summary job over entries that are all protected.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from hypothesis import HealthCheck, given
from hypothesis import settings as settings_
from hypothesis import strategies as st
from support.config import examples
from support.helpers import an_call, an_result, assistant, oa_call, oa_result, paired, turn, user

from ctxstore import (
    ContextStore,
    LocalSummarizer,
    RequestView,
    Settings,
    TiktokenCounter,
    count_message,
)
from ctxstore.testing import orphans

SMALL = {
    "offload_threshold_tokens": 60,  # tool results over 60 tokens get a preview
    "offload_preview_tokens": 20,
    "summary_trigger_tokens": 40,  # summaries after a few messages
    "summary_keep_tokens": 20,
}


class Tally:
    """A cl100k counter that counts its calls."""

    def __init__(self) -> None:
        self.inner = TiktokenCounter()
        self.calls = 0

    def count(self, text: str) -> int:
        """The tokens of ``text``; one more call."""
        self.calls += 1
        return self.inner.count(text)


@pytest.fixture
async def stores(settings: Settings, tenant: str) -> AsyncIterator[Callable[..., ContextStore]]:
    """Builds stores on this test's tenant with settings overridden; closed at the end."""
    opened: list[ContextStore] = []

    def make(counter: Any = None, **overrides: Any) -> ContextStore:
        own = settings.model_copy(update=overrides)
        opened.append(ContextStore.from_settings(own, tenant=tenant, counter=counter))
        return opened[-1]

    yield make
    for store in opened:
        await store.aclose()


def check(store: ContextStore, view: RequestView, budget: int) -> None:
    """Paired both ways, results right after their call, counted as sent, within the budget."""
    assert orphans(view.messages) == 0, view.messages
    paired(view.messages)
    assert view.stats.tokens == sum(count_message(store.counter, m) for m in view.messages)
    assert view.stats.tokens <= budget or view.stats.over_budget


# -- one call id made by two messages ------------------------------------------------------------


@pytest.mark.parametrize("make", [oa_call, an_call], ids=["openai", "anthropic"])
async def test_an_assistant_message_appended_twice_is_sent_once_with_its_result(
    store: ContextStore, make: Callable[..., dict[str, Any]]
) -> None:
    """A call appended twice (new idempotency keys), then its result: one call, answered."""
    call = make("c1")
    await store.append("s", user("go"))
    await store.append("s", call, idempotency_key="first")
    await store.append("s", call, idempotency_key="retry")
    await store.append("s", oa_result("c1", "done"))
    view = await store.view("s", token_budget=5_000)
    assert view.messages == [user("go"), call, oa_result("c1", "done")]
    assert view.stats.repairs == ["dropped repeated call c1"]
    check(store, view, 5_000)


async def test_a_call_id_made_again_after_its_exchange_is_never_sent_unanswered(
    store: ContextStore,
) -> None:
    """A reused id: the first exchange is sent; the later call and result are repairs."""
    history = [oa_call("c1"), oa_result("c1", "one"), user("again"), oa_call("c1")]
    await store.append_many("s", [*history, oa_result("c1", "two")])
    for budget in range(40, 400, 20):
        view = await store.view("s", token_budget=budget)
        check(store, view, budget)
    view = await store.view("s", token_budget=5_000)
    assert view.messages == [oa_call("c1"), oa_result("c1", "one"), user("again")]


# -- one message answering the calls of two ------------------------------------------------------


async def test_a_message_answering_two_callers_follows_the_nearest_at_every_budget(
    store: ContextStore,
) -> None:
    """tool_use c1, tool_use c2, one message answering both: never a result before its call."""
    calls = [an_call("c1", text="first look"), an_call("c2")]
    await store.append_many("s", [user("go"), *calls, an_result("c1", "c2"), assistant("ok")])
    for budget in range(10, 300, 5):
        check(store, await store.view("s", token_budget=budget), budget)
    view = await store.view("s", token_budget=5_000)
    assert view.messages == [
        user("go"),
        {"role": "assistant", "content": [{"type": "text", "text": "first look"}]},
        an_call("c2"),
        an_result("c2"),
        assistant("ok"),
    ]
    assert view.stats.repairs == [
        "dropped result c1 of a message answering two calling messages",
        "dropped unanswered call c1",
    ]


# -- stats.tokens: what is sent, counted once ----------------------------------------------------


@pytest.mark.parametrize(
    "call", [oa_call("c1", text="let me look"), an_call("c1", text="let me look")]
)
async def test_stats_tokens_count_a_stripped_call_as_sent(
    store: ContextStore, call: dict[str, Any]
) -> None:
    """A call still running is stripped from its message: counted without it."""
    await store.append_many("s", [user("go"), call])
    view = await store.view("s", token_budget=5_000)
    assert view.stats.repairs == ["dropped unanswered call c1"]
    assert len(view.messages) == 2
    check(store, view, 5_000)
    assert view.stats.tokens < view.stats.history_tokens


async def test_previews_are_counted_as_sent_at_every_budget(
    stores: Callable[..., ContextStore],
) -> None:
    """Large results sent as previews: stats.tokens is their count as sent, within budget."""
    store = stores(**SMALL)
    for n in range(4):
        await store.append_many(
            "s", [user(f"read {n}"), oa_call(f"c{n}"), oa_result(f"c{n}", "log line\n" * 90)]
        )
    offloaded = 0
    for budget in range(60, 1_200, 15):
        view = await store.view("s", token_budget=budget)
        check(store, view, budget)
        offloaded += bool(view.stats.offloaded)
    assert offloaded > 10


async def test_a_view_counts_only_what_it_changed_and_each_change_once(
    stores: Callable[..., ContextStore],
) -> None:
    """Messages sent as stored are not counted again; a stripped message once per process."""
    tally = Tally()
    store = stores(counter=tally)
    await store.append_many("s", [turn(i) for i in range(6)])
    tally.calls = 0
    await store.view("s", token_budget=5_000)
    assert tally.calls == 0, "a view of unchanged messages tokenizes nothing"
    await store.append("s", an_call("c1", text="let me look"))
    tally.calls = 0
    first = await store.view("s", token_budget=5_000)
    assert tally.calls == 1, "the stripped call message is counted"
    again = await store.view("s", token_budget=5_000)
    assert tally.calls == 1, "and not counted again"
    assert again.stats.tokens == first.stats.tokens
    check(store, again, 5_000)


# -- random histories with both shapes -----------------------------------------------------------

STEPS = ["user", "oa_call", "an_call", "again", "result", "joint", "early", "big", "system"]


@settings_(
    max_examples=examples(60),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    steps=st.lists(st.tuples(st.sampled_from(STEPS), st.integers(0, 99)), min_size=1, max_size=14),
    budget=st.one_of(st.integers(20, 200), st.integers(200, 2_000)),
    summarize_at=st.none() | st.integers(1, 10),
)
async def test_random_histories_with_repeated_and_joint_calls_give_sound_views(
    stores: Callable[..., ContextStore],
    steps: list[tuple[str, int]],
    budget: int,
    summarize_at: int | None,
) -> None:
    """Calls appended twice, results of two callers in one message, early, late: sound views."""
    store = stores(**SMALL)
    session = uuid.uuid4().hex[:10]
    made: list[list[str]] = []  # the ids of each calling message
    calls: list[dict[str, Any]] = []  # the calling messages
    for n, (step, pick) in enumerate(steps):
        if n == summarize_at:
            outcome = await store.summarize(session, LocalSummarizer())
            assert outcome.status in ("committed", "idle")
        batch: list[dict[str, Any]] = []
        ids = [f"k{n}a", f"k{n}b"][: 1 + pick % 2]
        if step in ("oa_call", "an_call") or (step != "user" and not made):
            calls.append(oa_call(*ids) if step == "oa_call" else an_call(*ids, text=f"t{n}"))
            made.append(ids)
            batch.append(calls[-1])
        elif step == "again":
            batch.append(calls[pick % len(calls)])
        elif step == "result":
            answered = made[pick % len(made)]
            batch.append(an_result(*answered) if pick % 3 else oa_result(answered[0]))
        elif step == "joint":
            batch.append(an_result(made[pick % len(made)][0], made[-1][-1]))
        elif step == "early":  # pods raced: the result is stored before its call
            batch += [oa_result(ids[0]), oa_call(*ids)]
            made.append(ids)
            calls.append(batch[-1])
        elif step == "big":
            batch.append(oa_result(made[pick % len(made)][0], "output line\n" * (20 + pick)))
        else:
            batch.append({"role": step, "content": f"m{n}"} if step == "system" else user(f"u{n}"))
        await store.append_many(session, batch, pinned=step != "system" and pick % 7 == 0)
        check(store, await store.view(session, token_budget=budget), budget)


# -- the summary job over protected entries only -------------------------------------------------


async def test_a_summary_job_over_pinned_entries_only_ends_idle_then_commits(
    stores: Callable[..., ContextStore],
) -> None:
    """Nothing but pinned messages to cover: idle; once turns follow, a summary covers them."""
    store = stores(**SMALL)
    for n in range(5):
        await store.append("s", user(f"pinned {n}"), pinned=True)
    outcome = await store.summarize("s", LocalSummarizer())
    assert outcome.status == "idle"
    assert outcome.covers_upto is None
    results = await store.append_many("s", [turn(i) for i in range(4)])
    outcome = await store.summarize("s", LocalSummarizer())
    assert outcome.status == "committed"
    assert outcome.covers_upto in {r.entry_id for r in results}
    check(store, await store.view("s", token_budget=5_000), 5_000)


async def test_a_summary_job_over_pinned_entries_after_a_summary_commits(
    stores: Callable[..., ContextStore],
) -> None:
    """After a commit, a job whose new entries are all pinned carries the summary forward."""
    store = stores(**SMALL)
    await store.append_many("s", [turn(i) for i in range(4)])
    first = await store.summarize("s", LocalSummarizer())
    assert first.status == "committed"
    pinned = [await store.append("s", user(f"pinned {n} " * 4), pinned=True) for n in range(5)]
    outcome = await store.summarize("s", LocalSummarizer())
    assert outcome.status == "committed"
    assert outcome.covers_upto in {p.entry_id for p in pinned}
    check(store, await store.view("s", token_budget=5_000), 5_000)
