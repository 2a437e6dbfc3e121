"""A view of any history sends no orphan, each result after its call, within its budget.

Random histories in both formats (OpenAI and Anthropic), whose tool results come early,
late, twice or never, some calling messages appended twice and some results answering
two callers, with summaries and previews: every view is paired, fits the budget (unless
only what is protected is sent), and counts exactly what it sends.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

import hypothesis
import pytest
from hypothesis import HealthCheck, given
from hypothesis import strategies as st
from support.config import examples
from support.helpers import paired

from ctxstore import ContextStore, LocalSummarizer
from ctxstore._layout.formats import call_ids
from ctxstore.testing import orphans
from ctxstore.tokens import count_message

TEXT = st.text(alphabet="abcdefgh ", min_size=1, max_size=30)


BIG = st.integers(50, 400).map(lambda n: "word " * n)


def _oa_call(ids: list[str], text: str | None) -> dict[str, Any]:
    calls = [
        {"id": i, "type": "function", "function": {"name": "f", "arguments": "{}"}} for i in ids
    ]
    return {"role": "assistant", "content": text, "tool_calls": calls}


def _an_call(ids: list[str], text: str | None) -> dict[str, Any]:
    blocks: list[dict[str, Any]] = [{"type": "text", "text": text}] if text else []
    uses = [{"type": "tool_use", "id": i, "name": "f", "input": {}} for i in ids]
    return {"role": "assistant", "content": blocks + uses}


def _an_result(ids: list[str], text: str | None, body: str) -> dict[str, Any]:
    blocks = [{"type": "tool_result", "tool_use_id": i, "content": body} for i in ids]
    return {"role": "user", "content": blocks + ([{"type": "text", "text": text}] if text else [])}


KINDS = (
    "user",
    "assistant",
    "system",
    "developer",
    "oa_call",
    "an_call",
    "oa_result",
    "an_result",
    "repeat",
)


@st.composite
def histories(draw: st.DrawFn, max_size: int = 16) -> list[tuple[dict[str, Any], bool]]:
    """Histories in both formats whose tool results come early, late, twice or never.

    Each calling message makes fresh call ids; each answering message answers
    some ids of one calling message (anywhere in the history, before or after
    it), or ids nobody called; some answer calls of two messages, and some
    calling messages are appended twice (an agent's retry with a new key).
    """
    kinds = draw(st.lists(st.sampled_from(KINDS), min_size=1, max_size=max_size))
    calls: list[list[str]] = []
    for index, kind in enumerate(kinds):
        if kind.endswith("_call"):
            calls.append([f"k{index}_{j}" for j in range(draw(st.integers(1, 3)))])
    history = []
    made = iter(calls)
    for index, kind in enumerate(kinds):
        text = draw(TEXT)
        if kind in ("user", "assistant", "system", "developer"):
            message = {"role": kind, "content": text}
        elif kind == "repeat":
            callers = [m for m, _ in history if call_ids(m)]
            message = (
                draw(st.sampled_from(callers)) if callers else {"role": "user", "content": text}
            )
        elif kind.endswith("_call"):
            maybe_text = draw(st.none() | TEXT)
            message = (_oa_call if kind == "oa_call" else _an_call)(next(made), maybe_text)
        else:
            caller = draw(st.integers(0, len(calls)))
            pool = calls[caller] if caller < len(calls) else [f"nobody{index}", f"nobody{index}b"]
            if calls and draw(st.integers(0, 3)) == 0:  # answers calls of a second message too
                pool = pool + draw(st.sampled_from(calls))
            body = draw(TEXT | BIG)
            if kind == "oa_result":
                message = {
                    "role": "tool",
                    "tool_call_id": draw(st.sampled_from(pool)),
                    "content": body,
                }
            else:
                ids = draw(st.lists(st.sampled_from(pool), min_size=1, max_size=3, unique=True))
                message = _an_result(ids, draw(st.none() | TEXT), body)
        history.append((message, draw(st.integers(0, 5)) == 0))  # pinned, one in six
    return history


async def _view_and_check(
    store: ContextStore,
    history: list[tuple[dict[str, Any], bool]],
    budget: int,
    summarize_at: int | None = None,
) -> Any:
    """Append the history (a summary job run after ``summarize_at`` of them), view, check."""
    session = uuid.uuid4().hex[:10]
    for index, (message, pinned) in enumerate(history):
        if index == summarize_at:
            outcome = await store.summarize(session, LocalSummarizer())
            assert outcome.status in ("committed", "idle")
            hypothesis.event(f"summary {outcome.status}")
        protected = message["role"] in ("system", "developer")
        await store.append(session, message, pinned=pinned and not protected)
    view = await store.view(session, token_budget=budget)
    assert orphans(view.messages) == 0, view.messages
    paired(view.messages)
    assert view.stats.over_budget or view.stats.tokens <= view.stats.budget_cl100k
    sent = sum(count_message(store.counter, m) for m in view.messages)
    assert sent <= view.stats.tokens  # at most what the view says it sends
    if view.stats.over_budget:  # only the system, developer and pinned messages are sent
        protected = [m for m, pinned in history if pinned or m["role"] in ("system", "developer")]
        assert len(view.messages) <= len(protected)
    stats = view.stats
    for what, happened in (
        ("repaired", stats.repairs),
        ("offloaded", stats.offloaded),
        ("dropped", stats.dropped),
        ("summary sent", stats.summary_used),
        ("over budget", stats.over_budget),
    ):
        if happened:
            hypothesis.event(what)
    return view


async def test_a_summary_job_over_protected_entries_only_commits(
    pods: Callable[..., ContextStore],
) -> None:
    """5 pinned messages, a summary job with keep=20 tokens: committed or idle, never a crash."""
    store = pods(summary_trigger_tokens=40, summary_keep_tokens=20)
    for _ in range(5):
        await store.append("s", {"role": "user", "content": "a"}, pinned=True)
    outcome = await store.summarize("s", LocalSummarizer())
    assert outcome.status in ("committed", "idle")


VIEW_SETTINGS = {
    "offload_threshold_tokens": 60,  # tool results over 60 tokens get a preview
    "offload_preview_tokens": 20,
    "summary_trigger_tokens": 40,  # summaries after a few messages
    "summary_keep_tokens": 20,
}


SUMMARIZE_AT = st.integers(1, 10) | st.none()


BUDGETS = st.one_of(st.integers(1, 60), st.integers(60, 600), st.integers(600, 6_000))


FUZZ_VIEWS = hypothesis.settings(
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


@hypothesis.settings(FUZZ_VIEWS, max_examples=examples(150), derandomize=True)
@given(history=histories(), budget=BUDGETS, summarize_at=SUMMARIZE_AT)
async def test_views_of_random_histories_send_no_orphan_and_fit_the_budget(
    pods: Callable[..., ContextStore],
    history: list[tuple[dict[str, Any], bool]],
    budget: int,
    summarize_at: int | None,
) -> None:
    """Random OpenAI/Anthropic histories (results early, twice, never; summaries): paired, fit."""
    await _view_and_check(pods(**VIEW_SETTINGS), history, budget, summarize_at)


@pytest.mark.soak
@hypothesis.settings(FUZZ_VIEWS, max_examples=examples(3_000))
@given(
    history=histories(max_size=60),
    budget=BUDGETS,
    summarize_at=SUMMARIZE_AT,
)
async def test_views_of_random_histories_soak(
    pods: Callable[..., ContextStore],
    history: list[tuple[dict[str, Any], bool]],
    budget: int,
    summarize_at: int | None,
) -> None:
    """The same, 3,000 random examples of up to 60 messages."""
    await _view_and_check(pods(**VIEW_SETTINGS), history, budget, summarize_at)


async def test_a_call_id_made_twice_is_never_sent_unanswered(store: ContextStore) -> None:
    """Assistant calls c1, the same assistant message again, then c1's result: no orphan call."""
    call = _oa_call(["c1"], None)
    await store.append_many("s", [{"role": "user", "content": "go"}, call, call])
    await store.append("s", {"role": "tool", "tool_call_id": "c1", "content": "done"})
    view = await store.view("s", token_budget=5_000)
    assert orphans(view.messages) == 0


async def test_a_result_answering_two_calling_messages_never_precedes_a_call(
    store: ContextStore,
) -> None:
    """Anthropic: tool_use c1, tool_use c2, one user message answering both: results after calls."""
    await store.append_many(
        "s", [_an_call(["c1"], None), _an_call(["c2"], None), _an_result(["c1", "c2"], None, "ok")]
    )
    view = await store.view("s", token_budget=5_000)
    paired(view.messages)


async def test_view_stats_tokens_equal_what_is_sent(store: ContextStore) -> None:
    """An assistant text + unanswered tool_use: stats.tokens == sum(count_message(sent))."""
    await store.append("s", _an_call(["c1"], "let me look"))
    view = await store.view("s", token_budget=5_000)
    assert view.stats.tokens == sum(count_message(store.counter, m) for m in view.messages)
