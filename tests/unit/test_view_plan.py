"""View planning (``ctxstore._plan.view``): pure, no Redis.

The first half pins down each rule of ``plan_view`` on small hand-built
conversations; the second half checks its invariants on random ones.
"""

from __future__ import annotations

import copy
import json
from collections import defaultdict
from functools import partial
from typing import Any

import pytest
from hypothesis import given, settings
from support.config import examples
from support.helpers import an_call, an_result, assistant, oa_call, oa_result, paired, system, user
from support.scenarios import Scenario, is_result, scenarios

from ctxstore import count_message
from ctxstore._layout.codec import ENTRY_PLACEHOLDER, Entry, SummaryText
from ctxstore._layout.formats import call_ids, entry_order, result_ids
from ctxstore._plan.anchored import GAP, brings_summary, plan_anchored
from ctxstore._plan.view import Anchor, Shape, SummaryLevel, ViewPlan, plan_view
from ctxstore.testing import WordCounter, orphans

COUNT = partial(count_message, WordCounter())
"""Counts a message as sent, for plans that count what a repair or a preview changed."""

# -- builders ------------------------------------------------------------------


def eid(n: int) -> str:
    """The n-th entry id; they cross a digit boundary (999 -> 1000) on purpose."""
    return f"{995 + n}-{n % 2}"


def entries(*messages: dict[str, Any], tokens: int = 10) -> list[Entry]:
    """Entries ``eid(0)``, ``eid(1)``... for ``messages``, ``tokens`` each."""
    return [Entry.of(eid(i), m, tokens) for i, m in enumerate(messages)]


# -- helpers: call_ids, result_ids, entry_order --------------------------------


def test_call_ids_reads_both_styles() -> None:
    """call_ids lists OpenAI tool_calls and Anthropic tool_use blocks, in order."""
    assert call_ids(oa_call("a", "b")) == ["a", "b"]
    assert call_ids(an_call("x", "y", text="let me look")) == ["x", "y"]
    mixed = {**oa_call("a"), "content": [{"type": "tool_use", "id": "u", "name": "n", "input": {}}]}
    assert call_ids(mixed) == ["a", "u"]
    assert call_ids(user()) == []
    assert call_ids({"role": "assistant", "content": ["junk", {"type": "tool_use"}]}) == []


def test_result_ids_reads_both_styles() -> None:
    """result_ids lists a tool message's tool_call_id and tool_result blocks."""
    assert result_ids(oa_result("a")) == ["a"]
    assert result_ids(an_result("x", "y", text="and then")) == ["x", "y"]
    assert result_ids(user()) == []
    # tool_call_id only counts on a tool message
    assert result_ids({"role": "user", "content": "hi", "tool_call_id": "a"}) == []
    assert result_ids(oa_call("a")) == []


def test_entry_order_is_numeric() -> None:
    """entry_order sorts stream ids by (ms, seq) as numbers, not as strings."""
    assert entry_order("999-5") < entry_order("1000-0")
    assert entry_order("1000-2") < entry_order("1000-10")
    assert entry_order("7") == (7, 0)
    ids = ["1000-10", "999-0", "1000-2", "10-0"]
    assert sorted(ids, key=entry_order) == ["10-0", "999-0", "1000-2", "1000-10"]


# -- plan_view: selection --------------------------------------------------------


def test_everything_fits_returns_all_in_order() -> None:
    """When the budget holds everything, every message is returned in order."""
    msgs = [user("a"), assistant("b"), user("c"), assistant("d")]
    tail = entries(*msgs)
    plan = plan_view([], None, tail, budget=40)
    assert plan.messages == msgs
    assert plan.kept_ids == [e.entry_id for e in tail]
    assert plan.tokens == 40
    assert (plan.dropped, plan.repairs, plan.offloaded) == (0, [], [])
    assert not plan.over_budget and not plan.summary_used


def test_budget_cut_keeps_newest() -> None:
    """A short budget keeps the newest messages that fit and drops older ones."""
    tail = entries(user("a"), assistant("b"), user("c"), assistant("d"), user("e"))
    plan = plan_view([], None, tail, budget=35)
    assert plan.kept_ids == [eid(2), eid(3), eid(4)]
    assert plan.tokens == 30
    assert plan.dropped == 2


def test_budget_cut_stops_at_first_misfit() -> None:
    """The tail is contiguous: a big message that misses cuts everything older."""
    tail = [
        Entry.of(eid(0), user("a"), 1),
        Entry.of(eid(1), user("big"), 50),
        Entry.of(eid(2), user(), 5),
    ]
    plan = plan_view([], None, tail, budget=10)
    assert plan.kept_ids == [eid(2)]


@pytest.mark.parametrize(
    ("call", "results"),
    [
        pytest.param(oa_call("c1", "c2"), [oa_result("c1"), oa_result("c2")], id="openai"),
        pytest.param(
            an_call("c1", "c2", text="two reads"), [an_result("c1", "c2")], id="anthropic"
        ),
    ],
)
def test_parallel_exchange_kept_whole(call: dict[str, Any], results: list[dict[str, Any]]) -> None:
    """An assistant message with parallel calls is kept with all its results when they fit."""
    tail = entries(user("go"), call, *results, assistant("done"))
    need = 10 * (len(results) + 2)  # the call, its results and the final answer
    plan = plan_view([], None, tail, budget=need)
    assert plan.messages == [call, *results, assistant("done")]
    assert plan.repairs == []
    assert plan.tokens == need


@pytest.mark.parametrize(
    ("call", "results"),
    [
        pytest.param(oa_call("c1", "c2"), [oa_result("c1"), oa_result("c2")], id="openai"),
        pytest.param(
            an_call("c1", "c2", text="two reads"), [an_result("c1", "c2")], id="anthropic"
        ),
    ],
)
def test_parallel_exchange_dropped_whole(
    call: dict[str, Any], results: list[dict[str, Any]]
) -> None:
    """One token short of the whole exchange, the call and all its results go together."""
    tail = entries(user("go"), call, *results, assistant("done"))
    need = 10 * (len(results) + 2)
    plan = plan_view([], None, tail, budget=need - 1)
    assert plan.messages == [assistant("done")]
    assert plan.repairs == []
    assert plan.tokens == 10
    assert plan.dropped == len(tail) - 1


def test_large_results_do_not_split_the_exchange() -> None:
    """Results of the newest exchange cost nothing alone: no result is kept without its call."""
    tail = [
        Entry.of(eid(0), oa_call("c1", "c2"), 50),
        Entry.of(eid(1), oa_result("c1"), 1),
        Entry.of(eid(2), oa_result("c2"), 1),
    ]
    plan = plan_view([], None, tail, budget=10)
    assert plan.messages == []
    assert plan.tokens == 0
    assert plan.dropped == 3


def test_cut_exchange_leaves_room_for_newer_messages() -> None:
    """Results whose call is cut cost nothing: a newer message between them still fits."""
    tail = entries(oa_call("c1"), user("meanwhile"), oa_result("c1"))
    plan = plan_view([], None, tail, budget=10)
    assert plan.kept_ids == [eid(1)]
    assert plan.tokens == 10


@pytest.mark.parametrize(
    ("call", "results"),
    [
        pytest.param(oa_call("c1", "c2"), [oa_result("c1"), oa_result("c2")], id="openai"),
        pytest.param(an_call("c1", "c2"), [an_result("c1"), an_result("c2")], id="anthropic"),
    ],
)
def test_interleaved_results_are_moved_after_call(
    call: dict[str, Any], results: list[dict[str, Any]]
) -> None:
    """Results separated from their call by another pod's user message follow the call."""
    other = user("meanwhile, from another pod")
    tail = entries(call, results[0], other, results[1])
    plan = plan_view([], None, tail, budget=100)
    assert plan.messages == [call, results[0], results[1], other]
    assert plan.kept_ids == [eid(0), eid(1), eid(3), eid(2)]
    assert plan.repairs == []


def test_overlapping_exchanges_are_each_placed_after_their_call() -> None:
    """Two interleaved exchanges are untangled: each result right after its own call."""
    a1, a2 = oa_call("c1"), an_call("c2")
    r1, r2 = oa_result("c1"), an_result("c2")
    plan = plan_view([], None, entries(a1, a2, r2, r1), budget=100)
    assert plan.messages == [a1, r1, a2, r2]


# -- plan_view: repairs --------------------------------------------------------


def test_in_flight_openai_call_is_stripped() -> None:
    """An unanswered parallel call is removed from tool_calls; the answered one stays."""
    call = oa_call("c1", "c2", text="reading")
    tail = entries(user("go"), call, oa_result("c1"))
    plan = plan_view([], None, tail, budget=100)
    sent = plan.messages[1]
    assert call_ids(sent) == ["c1"]
    assert sent["content"] == "reading"
    assert plan.repairs == ["dropped unanswered call c2"]
    assert call_ids(call) == ["c1", "c2"], "the caller's message must not be changed"


def test_in_flight_anthropic_call_is_stripped() -> None:
    """An unanswered tool_use block is removed; text and answered blocks stay."""
    call = an_call("c1", "c2", text="reading")
    plan = plan_view([], None, entries(user("go"), call, an_result("c1")), budget=100)
    sent = plan.messages[1]
    assert sent["content"] == [call["content"][0], call["content"][1]]
    assert plan.repairs == ["dropped unanswered call c2"]
    assert plan.kept_ids == [eid(0), eid(1), eid(2)]


@pytest.mark.parametrize(
    "call", [oa_call("c1", "c2"), an_call("c1", "c2")], ids=["openai", "anthropic"]
)
def test_in_flight_call_with_nothing_left_is_dropped(call: dict[str, Any]) -> None:
    """An assistant message whose only calls are all unanswered is dropped and uncounted."""
    plan = plan_view([], None, entries(user("go"), call), budget=100)
    assert plan.messages == [user("go")]
    assert plan.kept_ids == [eid(0)]
    assert plan.repairs == ["dropped unanswered call c1", "dropped unanswered call c2"]
    assert plan.tokens == 10
    assert plan.dropped == 1


def test_in_flight_call_with_text_keeps_the_text() -> None:
    """An OpenAI call message with text content keeps its text when its call is stripped."""
    plan = plan_view([], None, entries(oa_call("c1", text="thinking aloud")), budget=100)
    assert plan.messages == [{"role": "assistant", "content": "thinking aloud"}]
    assert plan.repairs == ["dropped unanswered call c1"]


@pytest.mark.parametrize("result", [oa_result("ghost"), an_result("ghost")], ids=["oa", "an"])
def test_orphan_result_dropped_silently_when_tail_incomplete(result: dict[str, Any]) -> None:
    """A result whose call is older than an incomplete tail is left out with no repair."""
    tail = entries(result, user("next"), assistant("done"))
    plan = plan_view([], None, tail, budget=100, complete=False)
    assert plan.kept_ids == [eid(1), eid(2)]
    assert plan.repairs == []
    assert plan.tokens == 20
    assert plan.dropped == 1


@pytest.mark.parametrize("result", [oa_result("ghost"), an_result("ghost")], ids=["oa", "an"])
def test_orphan_result_reported_when_tail_complete(result: dict[str, Any]) -> None:
    """With a complete tail, an orphan result has no call at all: dropped and reported."""
    tail = entries(user("next"), result, assistant("done"))
    plan = plan_view([], None, tail, budget=100, complete=True)
    assert plan.kept_ids == [eid(0), eid(2)]
    assert plan.repairs == ["dropped orphan result ghost"]
    assert plan.tokens == 20


def test_orphan_block_beside_a_real_result_is_stripped() -> None:
    """A tool_result block with no call is cut out of a message that also answers a real call."""
    tail = entries(an_call("c1"), an_result("c1", "ghost"))
    plan = plan_view([], None, tail, budget=100)
    assert plan.messages[1]["content"] == [an_result("c1")["content"][0]]
    assert plan.repairs == ["dropped orphan result ghost"]


@pytest.mark.parametrize(
    ("call", "first", "second"),
    [
        pytest.param(oa_call("c1"), oa_result("c1", "one"), oa_result("c1", "two"), id="openai"),
        pytest.param(an_call("c1"), an_result("c1"), an_result("c1", text="again"), id="anthropic"),
    ],
)
def test_duplicate_results_are_deduplicated(
    call: dict[str, Any], first: dict[str, Any], second: dict[str, Any]
) -> None:
    """A second result for one call id is dropped (or its block cut) and reported."""
    plan = plan_view([], None, entries(call, first, second), budget=100)
    assert plan.messages[:2] == [call, first]
    assert [r for m in plan.messages for r in result_ids(m)] == ["c1"]
    assert plan.repairs == ["dropped duplicate result c1"]
    if second["role"] == "tool":
        assert len(plan.messages) == 2
        assert plan.tokens == 20
    else:  # its text block stays
        assert plan.messages[2] == {"role": "user", "content": [{"type": "text", "text": "again"}]}


# -- plan_view: protected entries and the summary -------------------------------


def test_protected_entries_always_returned_system_first() -> None:
    """Hoisted protected entries come first, system before pinned, then the tail."""
    pinned = Entry.of(eid(0), user("remember: use metric units"), 5, kind="p")
    sys = Entry.of(eid(1), system(), 5, kind="s")
    tail = [Entry.of(eid(i), user(f"u{i}"), 10) for i in range(2, 8)]
    plan = plan_view([pinned, sys], None, tail, budget=40)
    assert plan.kept_ids == [eid(1), eid(0), eid(5), eid(6), eid(7)]
    assert plan.protected_tokens == 10
    assert plan.tokens == 40


def test_protected_entry_newer_than_cut_stays_inline() -> None:
    """A pinned or system entry newer than the oldest kept tail entry keeps its place."""
    history = [
        Entry.of(eid(0), system(), 5, kind="s"),
        Entry.of(eid(1), user("old"), 10),
        Entry.of(eid(2), user("u"), 10),
        Entry.of(eid(3), user("pinned"), 5, kind="p"),
        Entry.of(eid(4), system("late rule"), 5, kind="s"),
        Entry.of(eid(5), assistant("a"), 10),
    ]
    protected = [e for e in history if e.kind]
    plan = plan_view(protected, None, history, budget=35)
    assert plan.kept_ids == [eid(0), eid(2), eid(3), eid(4), eid(5)]
    assert plan.kept_ids.count(eid(3)) == 1, "a protected entry read in the tail is sent once"


def test_over_budget_returns_only_protected() -> None:
    """When protected entries alone exceed the budget, only they are returned."""
    protected = [
        Entry.of(eid(0), system(), 30, kind="s"),
        Entry.of(eid(1), user("pin"), 30, kind="p"),
    ]
    summary = SummaryText(user("summary"), 1, eid(1))
    tail = [Entry.of(eid(2), user("a"), 10), Entry.of(eid(3), assistant("b"), 10)]
    plan = plan_view(protected, summary, tail, budget=59)
    assert plan.over_budget
    assert plan.kept_ids == [eid(0), eid(1)]
    assert plan.tokens == plan.protected_tokens == 60
    assert not plan.summary_used
    assert plan.dropped == 2


def test_protected_exactly_at_budget_is_not_over() -> None:
    """Protected tokens equal to the budget fit: not over budget, nothing else sent."""
    protected = [Entry.of(eid(0), system(), 30, kind="s")]
    plan = plan_view(protected, None, entries(user("a")), budget=30)
    assert not plan.over_budget
    assert plan.kept_ids == [eid(0)]
    assert plan.tokens == 30


def test_over_budget_strips_calls_of_a_pinned_message() -> None:
    """Over budget, a pinned call message whose results are not sent loses those calls."""
    protected = [
        Entry.of(eid(0), system(), 30, kind="s"),
        Entry.of(eid(1), oa_call("c1"), 30, kind="p"),
    ]
    plan = plan_view(protected, None, entries(oa_result("c1")), budget=10)
    assert plan.over_budget
    assert plan.kept_ids == [eid(0)]
    assert plan.repairs == ["dropped unanswered call c1"]
    assert plan.tokens == 30


def test_result_of_a_pinned_call_is_kept_and_placed_after_it() -> None:
    """A tail result whose call is pinned is sent, right after the pinned call."""
    sys = Entry.of(eid(0), system(), 5, kind="s")
    pinned_call = Entry.of(eid(1), oa_call("c1"), 5, kind="p")
    tail = [Entry.of(eid(2), user("u"), 10), Entry.of(eid(3), oa_result("c1"), 10)]
    summary = SummaryText(user("summary"), 5, eid(1))
    plan = plan_view([sys, pinned_call], summary, tail, budget=100)
    assert plan.messages == [system(), oa_call("c1"), oa_result("c1"), user("summary"), user("u")]
    assert plan.repairs == []


def test_summary_goes_between_hoisted_protected_and_tail() -> None:
    """The summary is sent after the hoisted protected entries and before the tail."""
    sys = Entry.of(eid(0), system(), 5, kind="s")
    tail = entries(user("a"), assistant("b"))
    tail = [Entry.of(eid(i + 2), e.message, 10) for i, e in enumerate(tail)]
    summary = SummaryText(user("so far: ..."), 7, eid(1))
    plan = plan_view([sys], summary, tail, budget=100)
    assert plan.summary_used
    assert plan.messages == [system(), user("so far: ..."), user("a"), assistant("b")]
    assert plan.kept_ids == [eid(0), eid(2), eid(3)]
    assert plan.tokens == 5 + 7 + 20


def test_summary_skipped_when_it_does_not_fit() -> None:
    """A summary larger than what the protected entries leave is not sent."""
    sys = Entry.of(eid(0), system(), 5, kind="s")
    summary = SummaryText(user("so far: ..."), 96, eid(1))
    tail = [Entry.of(eid(2), user("a"), 10)]
    plan = plan_view([sys], summary, tail, budget=100)
    assert not plan.summary_used
    assert user("so far: ...") not in plan.messages
    assert plan.kept_ids == [eid(0), eid(2)]
    assert plan.tokens == 15


def test_summary_is_charged_before_the_tail() -> None:
    """A summary that fits takes its tokens first; the tail gets what is left."""
    summary = SummaryText(user("so far"), 15, eid(0))
    tail = [Entry.of(eid(i), user(f"u{i}"), 10) for i in range(1, 4)]
    plan = plan_view([], summary, tail, budget=35)
    assert plan.summary_used
    assert plan.kept_ids == [eid(2), eid(3)]
    assert plan.tokens == 35


# -- plan_view: previews -------------------------------------------------------


def _big_result(n: int, cid: str, tokens: int = 100, preview_tokens: int = 10) -> Entry:
    preview = oa_result(cid, "head ... [ctxstore: cut] ... tail")
    return Entry.of(
        eid(n), oa_result(cid, "x" * 400), tokens, preview=preview, preview_tokens=preview_tokens
    )


def test_preview_used_when_budget_is_short() -> None:
    """A large result is sent as its preview when the full one does not fit."""
    tail = [Entry.of(eid(0), oa_call("c1"), 10), _big_result(1, "c1")]
    plan = plan_view([], None, tail, budget=50)
    assert plan.kept_ids == [eid(0), eid(1)]
    assert plan.messages[1] == oa_result("c1", "head ... [ctxstore: cut] ... tail")
    assert plan.offloaded == [eid(1)]
    assert plan.tokens == 20


def test_full_result_sent_when_it_fits() -> None:
    """A large result is sent in full when the budget holds it."""
    full = oa_result("c1", "x" * 400)
    tail = [Entry.of(eid(0), oa_call("c1"), 10), _big_result(1, "c1")]
    plan = plan_view([], None, tail, budget=110)
    assert plan.messages[1] == full
    assert plan.offloaded == []
    assert plan.tokens == 110


def test_previews_upgraded_newest_first() -> None:
    """With room for one full result of two, the newer one is sent in full."""
    tail = [
        Entry.of(eid(0), oa_call("c1", "c2"), 10),
        _big_result(1, "c1"),
        _big_result(2, "c2"),
    ]
    plan = plan_view([], None, tail, budget=10 + 10 + 100)
    assert plan.offloaded == [eid(1)]
    assert plan.messages[2] == oa_result("c2", "x" * 400)
    assert plan.messages[1]["content"].startswith("head")
    assert plan.tokens == 120


def test_preview_lets_older_messages_fit() -> None:
    """Counting a large result at its preview's size leaves room for older messages."""
    tail = [Entry.of(eid(0), user("older"), 10), Entry.of(eid(1), oa_call("c1"), 10)]
    tail.append(_big_result(2, "c1"))
    plan = plan_view([], None, tail, budget=30)
    assert plan.kept_ids == [eid(0), eid(1), eid(2)]
    assert plan.offloaded == [eid(2)]


def test_preview_threshold_is_exact() -> None:
    """The full result is sent exactly when it fits, never one token over the budget."""
    for budget in range(20, 130):
        tail = [Entry.of(eid(0), oa_call("c1"), 10), _big_result(1, "c1")]
        plan = plan_view([], None, tail, budget=budget)
        assert plan.tokens <= budget
        assert (plan.offloaded == []) == (budget >= 110), budget


def test_preview_names_its_entry() -> None:
    """The entry-id placeholder in a stored preview is filled with the entry's id."""
    preview = oa_result("c1", f"cut; the full text is entry {ENTRY_PLACEHOLDER}")
    big = Entry.of(eid(1), oa_result("c1", "x" * 400), 100, preview=preview, preview_tokens=10)
    plan = plan_view([], None, [Entry.of(eid(0), oa_call("c1"), 10), big], budget=20)
    assert plan.messages[1]["content"] == f"cut; the full text is entry {eid(1)}"


def test_only_sent_messages_are_decoded() -> None:
    """Planning uses the stored call and result ids; a dropped entry is never decoded."""
    broken = Entry(eid(0), 50, b"not json", ("c9",), ())
    call = Entry(eid(1), 10, json.dumps(oa_call("c1")).encode(), ("c1",), ())
    result = Entry(eid(2), 10, json.dumps(oa_result("c1")).encode(), (), ("c1",))
    plan = plan_view([], None, [broken, call, result], budget=20)
    assert plan.messages == [oa_call("c1"), oa_result("c1")]
    assert plan.kept_ids == [eid(1), eid(2)]


def test_entry_of_reads_the_ids() -> None:
    """Entry.of records the call and result ids of the message it wraps."""
    assert Entry.of(eid(0), an_call("a", "b"), 1).calls == ("a", "b")
    assert Entry.of(eid(0), an_result("a", text="x"), 1).results == ("a",)
    assert Entry.of(eid(0), oa_result("a"), 1).cheapest == 1
    assert (
        Entry.of(eid(0), oa_result("a"), 9, preview=oa_result("a"), preview_tokens=2).cheapest == 2
    )


def test_dropped_offloaded_duplicate_uncounts_its_preview() -> None:
    """A duplicate result sent as a preview is uncounted at its preview's size."""
    tail = [Entry.of(eid(0), oa_call("c1"), 10), Entry.of(eid(1), oa_result("c1"), 10)]
    tail.append(_big_result(2, "c1"))
    plan = plan_view([], None, tail, budget=35)
    assert plan.kept_ids == [eid(0), eid(1)]
    assert plan.offloaded == []
    assert plan.repairs == ["dropped duplicate result c1"]
    assert plan.tokens == 20


def test_plan_view_does_not_mutate_its_inputs() -> None:
    """plan_view is pure: after a roomy plan, the same entries can still be offloaded."""
    tail = [Entry.of(eid(0), oa_call("c1"), 10), _big_result(1, "c1")]
    before = copy.deepcopy(tail)
    roomy = plan_view([], None, tail, budget=1000)
    assert roomy.offloaded == []
    tight = plan_view([], None, tail, budget=25)
    assert tight.offloaded == [eid(1)]
    assert tail == before


# -- plan_view: one call id, one answer; one answering message, one caller ------


@pytest.mark.parametrize("make", [oa_call, an_call], ids=["openai", "anthropic"])
def test_a_call_message_appended_twice_is_answered_once(make: Any) -> None:
    """The same call id made by two messages: the one nearest its result is sent, once."""
    call = make("c1")
    plan = plan_view([], None, entries(user("go"), call, call, oa_result("c1")), budget=100)
    assert plan.messages == [user("go"), call, oa_result("c1")]
    assert plan.kept_ids == [eid(0), eid(2), eid(3)]
    assert plan.repairs == ["dropped repeated call c1"]
    assert plan.dropped == 1
    assert paired(plan.messages) == 1


def test_a_repeated_call_keeps_its_text() -> None:
    """A repeated call is cut from its message; the message's text is still sent."""
    first, again = oa_call("c1", text="let me look"), oa_call("c1", text="looking again")
    plan = plan_view([], None, entries(first, again, oa_result("c1")), budget=100)
    assert plan.messages == [
        {"role": "assistant", "content": "let me look"},
        again,
        oa_result("c1"),
    ]
    assert plan.repairs == ["dropped repeated call c1"]


def test_a_call_id_reused_after_its_exchange_is_sent_once() -> None:
    """An id answered already and made again: the later call and its result go, reported."""
    history = entries(oa_call("c1"), oa_result("c1", "one"), oa_call("c1"), oa_result("c1", "two"))
    plan = plan_view([], None, history, budget=100)
    assert plan.messages == [oa_call("c1"), oa_result("c1", "one")]
    assert plan.repairs == ["dropped duplicate result c1", "dropped repeated call c1"]
    assert plan.tokens == 20
    assert paired(plan.messages) == 1


def test_a_result_message_answering_two_calling_messages_follows_the_nearest() -> None:
    """tool_use c1, tool_use c2, one message answering both: it keeps c2's result, after c2."""
    first, second = an_call("c1", text="first"), an_call("c2")
    plan = plan_view([], None, entries(first, second, an_result("c1", "c2")), budget=100)
    assert plan.messages == [
        {"role": "assistant", "content": [{"type": "text", "text": "first"}]},
        second,
        an_result("c2"),
    ]
    assert plan.repairs == [
        "dropped result c1 of a message answering two calling messages",
        "dropped unanswered call c1",
    ]
    assert paired(plan.messages) == 1


def test_the_other_callers_call_is_answered_by_a_later_message() -> None:
    """A result cut from a message answering two callers leaves its call to a later answer."""
    history = entries(an_call("c1"), an_call("c2"), an_result("c1", "c2"), oa_result("c1"))
    plan = plan_view([], None, history, budget=100)
    assert plan.messages == [an_call("c1"), oa_result("c1"), an_call("c2"), an_result("c2")]
    assert plan.repairs == ["dropped result c1 of a message answering two calling messages"]
    assert paired(plan.messages) == 2


def test_a_message_answering_two_callers_stored_before_both_follows_the_first() -> None:
    """Pods raced: results before both calls are moved after the nearest caller, the rest cut."""
    history = entries(user("go"), an_result("c1", "c2"), an_call("c1"), an_call("c2"))
    plan = plan_view([], None, history, budget=100)
    assert plan.messages == [user("go"), an_call("c1"), an_result("c1")]
    assert plan.repairs == [
        "dropped result c2 of a message answering two calling messages",
        "dropped unanswered call c2",
        "moved result c1 after its call",
    ]
    assert paired(plan.messages) == 1


def test_a_result_block_repeated_in_one_message_is_sent_once() -> None:
    """Two tool_result blocks for one call in one message: the first stays."""
    double = {"role": "user", "content": an_result("c1")["content"] * 2}
    plan = plan_view([], None, entries(an_call("c1"), double), budget=100)
    assert plan.messages == [an_call("c1"), an_result("c1")]
    assert plan.repairs == ["dropped duplicate result c1"]


# -- plan_view: tokens counted as sent ----------------------------------------


def test_a_stripped_message_is_counted_as_sent() -> None:
    """With a count, a message a repair stripped costs its count, not its stored size."""
    call = an_call("c1", "c2", text="reading")
    history = [Entry.of(eid(0), user("go"), 7), Entry.of(eid(1), call, 40)]
    history.append(Entry.of(eid(2), an_result("c1"), 9))
    plan = plan_view([], None, history, budget=100, count=COUNT)
    assert plan.repairs == ["dropped unanswered call c2"]
    assert plan.tokens == 7 + COUNT(plan.messages[1]) + 9 < 7 + 40 + 9


def test_a_preview_is_counted_with_its_entry_id_filled_in() -> None:
    """With a count, a preview costs what it counts as sent, its placeholder replaced."""
    preview = oa_result("c1", f"cut; the full text is entry {ENTRY_PLACEHOLDER}")
    big = Entry.of(eid(1), oa_result("c1", "x " * 400), 400, preview=preview, preview_tokens=99)
    plan = plan_view([], None, [Entry.of(eid(0), oa_call("c1"), 10), big], budget=120, count=COUNT)
    assert plan.offloaded == [eid(1)]
    assert plan.tokens == 10 + COUNT(plan.messages[1])
    assert COUNT(plan.messages[1]) != 99


def test_the_preview_is_charged_as_sent_when_it_is_chosen() -> None:
    """A preview that counts more than stored is charged as sent: an older message gives way."""
    preview = oa_result("c1", "a preview " * 10)
    big = Entry.of(eid(2), oa_result("c1", "x " * 400), 400, preview=preview, preview_tokens=5)
    sent_size = COUNT(preview)
    history = [Entry.of(eid(0), user("old"), 10), Entry.of(eid(1), oa_call("c1"), 10), big]
    budget = 10 + 10 + sent_size  # holds everything at the stored size, not as sent
    plan = plan_view([], None, history, budget=budget - 1, count=COUNT)
    assert plan.kept_ids == [eid(1), eid(2)]
    assert plan.tokens == 10 + sent_size <= budget - 1


def test_a_repair_that_grows_a_message_never_breaks_the_budget() -> None:
    """Should a stripped message count more than charged, older exchanges give way."""
    history = entries(user("old"), user("mid"), oa_call("c1", text="x"))

    def count(message: dict[str, Any]) -> int:
        return 25  # more than the 10 the stripped call was charged

    plan = plan_view([], None, history, budget=35, count=count)
    assert plan.messages == [user("mid"), {"role": "assistant", "content": "x"}]
    assert plan.tokens == 35
    assert plan.dropped == 1
    assert not plan.over_budget


def test_a_pinned_message_that_grows_when_stripped_is_over_budget_alone() -> None:
    """Nothing else sent, a protected message counted past the budget sets over_budget."""
    pinned = Entry.of(eid(0), oa_call("c1", text="x"), 10, kind="p")

    def count(message: dict[str, Any]) -> int:
        return 50

    plan = plan_view([pinned], None, entries(), budget=30, count=count)
    assert plan.over_budget
    assert plan.messages == [{"role": "assistant", "content": "x"}]
    assert plan.tokens == 50


# -- plan_anchored: the budget holds --------------------------------------------


def test_a_step_swaps_in_no_summary_that_does_not_fit_beside_the_protected() -> None:
    """A summary within its share, but too large beside the pinned entries, is not sent."""
    pinned = [Entry.of(eid(0), user("pin"), 90, kind="p")]
    raw = [Entry.of(eid(i), user(f"u{i}"), 10) for i in range(1, 8)]
    level = SummaryLevel(SummaryText(user("so far"), 30, eid(0)), 1)
    plan, anchor = plan_anchored(
        pinned,
        raw,
        100,
        anchor=None,
        levels=[level],
        complete=False,
        shape=Shape(),
        epoch=0,
        stamp="a",
    )
    assert plan is not None and anchor is not None
    assert anchor.summary is None and not plan.summary_used
    assert plan.kept_ids == [eid(0), eid(7)]
    assert plan.tokens == 100


def test_an_anchored_view_gives_way_should_a_repair_grow_a_message() -> None:
    """On a held anchor, a stripped message counted past its charge pushes the oldest out."""
    raw = entries(user("old"), user("mid"), oa_call("c1", text="x"))
    held = Anchor(epoch=0, start=eid(0), summary=None, level=0, stamp="a")

    def count(message: dict[str, Any]) -> int:
        return 25  # more than the 10 the stripped call was charged

    plan, moved = plan_anchored(
        [],
        raw,
        35,
        anchor=held,
        levels=None,
        complete=True,
        shape=Shape(),
        epoch=0,
        stamp="b",
        count=count,
    )
    assert plan is not None and moved is None
    assert plan.messages == [user("mid"), {"role": "assistant", "content": "x"}]
    assert plan.tokens == 35
    assert plan.repairs == ["dropped unanswered call c1"]


def test_a_history_that_fits_in_full_is_planned_whole_in_its_own_order() -> None:
    """The whole history is sent as stored when its full tokens fit; else large results shrink."""
    items = [
        user("go"),
        {"type": "function_call", "call_id": "a", "name": "f", "arguments": "{}"},
        {"type": "function_call", "call_id": "b", "name": "f", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "b", "output": "x" * 400},
        {"type": "function_call_output", "call_id": "a", "output": "y"},
    ]
    raw = [Entry.of(eid(i), m, 10) for i, m in enumerate(items)]
    preview = {"type": "function_call_output", "call_id": "b", "output": "x ... x"}
    raw[3] = Entry.of(eid(3), items[3], 300, preview=preview, preview_tokens=10)
    shape = Shape(full_share=0.01)  # 300 tokens is past its share at these budgets
    for budget, sent in ((340, items), (339, [*items[:3], preview, items[4]])):
        plan, moved = plan_anchored(
            [],
            raw,
            budget,
            anchor=None,
            levels=None,
            complete=True,
            shape=shape,
            epoch=0,
            stamp="s",
        )
        assert plan is not None and moved is None
        assert plan.messages == sent
        assert plan.offloaded == ([] if sent is items else [eid(3)])


def test_forms_never_change_as_the_anchor_grows() -> None:
    """Appends keep the form of each entry an anchored view sent before them."""
    shape = Shape(full_share=0.01)
    raw = [Entry.of(eid(0), oa_call("c0"), 10), _big_result(1, "c0", tokens=60)]
    held = Anchor(epoch=0, start=eid(0), summary=None, level=0, stamp="a")
    sent: dict[str, dict[str, Any]] = {}
    for n in range(2, 12, 2):
        plan, moved = plan_anchored(
            [], raw, 200, anchor=held, levels=None, complete=True, shape=shape, epoch=0, stamp="b"
        )
        if plan is None:
            break
        assert moved is None
        for entry_id, message in zip(plan.kept_ids, plan.messages, strict=True):
            assert sent.setdefault(entry_id, message) == message
        raw += [Entry.of(eid(n), oa_call(f"c{n}"), 10), _big_result(n + 1, f"c{n}", tokens=60)]
    assert len(sent) >= 6


def test_a_summary_of_what_the_anchor_drops_moves_it_at_once() -> None:
    """An anchor that drops entries unsummarized moves when a summary of them is committed."""
    raw = [Entry.of(eid(i), user(f"u{i}"), 10) for i in range(10)]
    plan, moved = plan_anchored(
        [], raw, 50, anchor=None, levels=[], complete=True, shape=Shape(), epoch=0, stamp="s"
    )
    assert plan is not None and moved is not None and moved.stamp.endswith(GAP)
    assert not plan.summary_used
    kwargs: dict[str, Any] = {"complete": True, "shape": Shape(), "epoch": 0, "stamp": "t"}
    held, again = plan_anchored([], raw, 50, anchor=moved, levels=None, **kwargs)
    assert held is not None and again is None  # no summary committed: it holds
    must, _ = plan_anchored([], raw, 50, anchor=moved, levels=None, watermark=eid(5), **kwargs)
    assert must is None  # a step is due: the caller reads the summary levels
    level = SummaryLevel(SummaryText(user("so far"), 10, eid(5)), 1)
    stepped, new = plan_anchored(
        [], raw, 50, anchor=moved, levels=[level], watermark=eid(5), **kwargs
    )
    assert stepped is not None and new is not None and stepped.summary_used
    assert brings_summary(new, eid(5)) is False  # it moves once, not at every view
    # A summary committed but not sent (too large for the budget) moves it no further.
    large = SummaryLevel(SummaryText(user("all of it"), 45, eid(5)), 1)
    _, unsent = plan_anchored([], raw, 50, anchor=moved, levels=[large], watermark=eid(5), **kwargs)
    assert unsent is not None and unsent.summary is None
    assert brings_summary(unsent, eid(5)) is False


# -- plan_anchored: where a step cuts back to -----------------------------------


def test_the_low_water_mark_falls_as_each_call_adds_more() -> None:
    """A step cuts back further for a session whose calls add more: its view lasts as many calls."""
    shape = Shape(low_water=0.8, calls=10, low_water_floor=0.5)
    assert shape.low_water_for(4_000, None) == 0.8  # growth unknown: the configured mark
    assert shape.low_water_for(4_000, 50) == 0.8  # (1 - 0.8) * 4,000 / 50 = 16 calls already
    assert shape.low_water_for(4_000, 200) == pytest.approx(0.5)  # 1 - 10 * 200 / 4,000
    assert shape.low_water_for(4_000, 150) == pytest.approx(0.625)
    assert shape.low_water_for(4_000, 1_000) == 0.5  # never below the floor
    # A larger budget lasts more calls (the fourth root): 20 at 64,000 tokens.
    assert shape.low_water_for(64_000, 1_000) == pytest.approx(1 - 20 * 1_000 / 64_000)


def _agent_turns(n: int, tokens: int) -> list[Entry]:
    """``n`` turns: a user message, then the agent's answer, each ``tokens`` in all."""
    out = []
    for i in range(n):
        out.append(Entry.of(eid(2 * i), user(f"q{i}"), tokens // 2))
        out.append(Entry.of(eid(2 * i + 1), assistant(f"a{i}"), tokens - tokens // 2))
    return out


def test_a_step_cuts_a_fast_growing_view_further_back() -> None:
    """Sessions whose turns add more keep less after a step; both stay within the budget."""
    shape = Shape(low_water=0.8, calls=10, low_water_floor=0.4)
    after = {}
    for size in (40, 200):
        raw = _agent_turns(12_000 // size, size)  # three budgets' worth
        plan, anchor = plan_anchored(
            [], raw, 4_000, anchor=None, levels=[], complete=True, shape=shape, epoch=0, stamp="s"
        )
        assert plan is not None and anchor is not None
        assert plan.tokens <= 4_000
        after[size] = plan.tokens
    assert after[40] == pytest.approx(0.8 * 4_000, abs=100)  # 10 turns of 40 tokens fit easily
    assert after[200] == pytest.approx((1 - 10 * 200 / 4_000) * 4_000, abs=100)  # 0.5


def test_a_step_behind_a_lagging_summary_leaves_the_least_gap_not_the_low_water_mark() -> None:
    """What the summary does not cover and the budget cannot all hold: as much of it as fits."""
    shape = Shape(low_water=0.5, calls=10, low_water_floor=0.5)
    raw = _agent_turns(30, 100)  # 60 entries of 50 tokens: 3,000 tokens
    covers = 9  # the summary covers entries 0..9; 50 entries, 2,500 tokens, are after it
    level = SummaryLevel(SummaryText(user("so far"), 100, eid(covers)), 1)
    plan, anchor = plan_anchored(
        [], raw, 2_000, anchor=None, levels=[level], complete=True, shape=shape, epoch=0, stamp="s"
    )
    assert plan is not None and anchor is not None and anchor.summary is not None
    # 1,900 tokens of room: 38 entries, from entry 22 (a turn's start); the low-water
    # mark alone would have kept 18 (900 tokens) and lost 22..41 to the gap.
    assert anchor.start == eid(22)
    assert plan.tokens == 100 + 38 * 50 <= 2_000
    # Once the summary catches up, the next step goes back to the low-water mark.
    level = SummaryLevel(SummaryText(user("so far"), 100, eid(49)), 1)
    plan, anchor = plan_anchored(
        [], raw, 2_000, anchor=None, levels=[level], complete=True, shape=shape, epoch=0, stamp="t"
    )
    assert plan is not None and anchor is not None
    assert anchor.start == eid(42)  # 18 entries: 900 tokens, the mark's 1,000 less the summary
    assert plan.tokens == 100 + 18 * 50


# -- known defects -------------------------------------------------------------


def test_dropped_counts_only_tail_entries() -> None:
    """plan.dropped counts the tail entries not sent, not protected ones removed by a repair."""
    protected = [
        Entry.of(eid(0), system(), 30, kind="s"),
        Entry.of(eid(1), oa_call("c1"), 30, kind="p"),
    ]
    plan = plan_view(protected, None, [Entry.of(eid(2), oa_result("c1"), 10)], budget=10)
    assert plan.kept_ids == [eid(0)]
    assert plan.dropped == 1


def test_pinned_large_result_sent_in_full_when_it_fits() -> None:
    """A pinned large tool result is sent in full when the budget holds it."""
    call = Entry.of(eid(0), oa_call("c1"), 10, kind="p")
    result = _big_result(1, "c1")
    result.kind = "p"
    plan = plan_view([call, result], None, [], budget=1000)
    assert plan.messages == [oa_call("c1"), oa_result("c1", "x" * 400)]
    assert plan.offloaded == []
    assert plan.tokens == 110


# -- properties ----------------------------------------------------------------


def _is_tool(message: dict[str, Any]) -> bool:
    return bool(call_ids(message) or result_ids(message))


def _plan(sc: Scenario, count: Any = None) -> tuple[ViewPlan, dict[str, Entry]]:
    """The plan of a scenario (with ``count``, if given), and its entries by id."""
    plan = plan_view(
        sc.protected, sc.summary, sc.tail, sc.budget, complete=sc.complete, count=count
    )
    return plan, {e.entry_id: e for e in sc.history}


def _slots(plan: ViewPlan, summary: SummaryText | None) -> list[str | None]:
    """The entry id behind each sent message; None for the summary."""
    assert len(plan.messages) == len(plan.kept_ids) + plan.summary_used
    ids = iter(plan.kept_ids)
    slots = [
        None if plan.summary_used and summary is not None and m is summary.message else next(ids)
        for m in plan.messages
    ]
    assert slots.count(None) == int(plan.summary_used)
    return slots


@settings(max_examples=examples(300), deadline=None)
@given(scenarios())
def test_property_budget_respected(sc: Scenario) -> None:
    """The plan never exceeds the budget unless protected entries alone do."""
    plan, _ = _plan(sc)
    floor = sum(e.tokens for e in sc.protected)
    assert plan.protected_tokens == floor
    assert plan.over_budget == (floor > sc.budget)
    if plan.over_budget:
        assert set(plan.kept_ids) <= {e.entry_id for e in sc.protected}
        assert not plan.summary_used
    else:
        assert plan.tokens <= sc.budget
    if sc.summary is not None:
        fits = not plan.over_budget and sc.summary.tokens <= sc.budget - floor
        assert plan.summary_used == fits, "the summary is sent exactly when it fits"


@settings(max_examples=examples(300), deadline=None)
@given(scenarios())
def test_property_no_orphans_and_results_follow_calls(sc: Scenario) -> None:
    """Every sent result follows its call, and every sent call has exactly one result."""
    plan, _ = _plan(sc)
    caller: dict[str, int] = {}
    for index, message in enumerate(plan.messages):
        for cid in call_ids(message):
            assert cid not in caller, f"call {cid} made twice"
            caller[cid] = index
    answers = [r for m in plan.messages for r in result_ids(m)]
    assert sorted(answers) == sorted(caller), "each call answered exactly once, no orphans"
    for index, message in enumerate(plan.messages):
        owners = {caller[r] for r in result_ids(message)}
        if not owners:
            continue
        assert len(owners) == 1
        (owner,) = owners
        assert owner < index, "a result comes after its call"
        for between in plan.messages[owner + 1 : index]:
            rids = result_ids(between)
            assert rids, "only results of the same call group sit between a call and a result"
            assert {caller[r] for r in rids} == {owner}


@settings(max_examples=examples(300), deadline=None)
@given(scenarios())
def test_property_conversation_order_kept(sc: Scenario) -> None:
    """Apart from hoisted protected entries and moved results, entries keep conversation order."""
    plan, originals = _plan(sc)
    protected_ids = {e.entry_id for e in sc.protected}
    slots = _slots(plan, sc.summary)
    assert len(set(plan.kept_ids)) == len(plan.kept_ids), "no entry sent twice"
    assert set(plan.kept_ids) <= set(originals)
    # Non-result entries: a hoisted protected prefix (system first), then conversation order.
    order = [s for s in slots if s is None or not is_result(originals[s].message)]
    splits = [order.index(None)] if plan.summary_used else list(range(len(order) + 1))
    order_ids = [s for s in order if s is not None]

    def valid(split: int) -> bool:
        head = [s for s in order[:split] if s is not None]
        body = [s for s in order[split:] if s is not None]
        system_first = sorted(head, key=lambda s: (originals[s].kind != "s", entry_order(s)))
        return (
            set(head) <= protected_ids
            and head == system_first
            and body == sorted(body, key=entry_order)
            and all(entry_order(h) < entry_order(b) for h in head for b in body)
        )

    assert any(valid(split) for split in splits), order_ids
    if plan.summary_used:  # before the summary: hoisted entries and results moved to their call
        for s in slots[: slots.index(None)]:
            assert s is not None
            assert s in protected_ids or is_result(originals[s].message)


@settings(max_examples=examples(300), deadline=None)
@given(scenarios())
def test_property_system_messages_always_sent(sc: Scenario) -> None:
    """Every protected system message, and every protected non-tool message, is sent."""
    plan, _ = _plan(sc)
    for entry in sc.protected:
        if entry.kind == "s" or not _is_tool(entry.message):
            assert entry.entry_id in plan.kept_ids


@settings(max_examples=examples(300), deadline=None)
@given(scenarios())
def test_property_tokens_match_what_is_sent(sc: Scenario) -> None:
    """plan.tokens is the sum of the sent entries (previews at their size) and the summary."""
    plan, originals = _plan(sc)
    assert set(plan.offloaded) <= set(plan.kept_ids)
    counted = 0
    for entry_id in plan.kept_ids:
        entry = originals[entry_id]
        if entry_id in plan.offloaded:
            assert entry.preview is not None
            counted += entry.preview_tokens
        else:
            counted += entry.tokens
    if plan.summary_used:
        assert sc.summary is not None
        counted += sc.summary.tokens
    # The plan counts each sent entry at its full (or preview) size, even when a repair
    # stripped a block from it: then that size is an upper bound of what is really sent.
    assert plan.tokens == counted
    for slot, message in zip(_slots(plan, sc.summary), plan.messages, strict=True):
        if slot is None:
            continue
        entry = originals[slot]
        sent_as = entry.preview if slot in plan.offloaded else entry.message
        assert sent_as is not None
        if message != sent_as:  # stripped: only blocks or calls removed, nothing added
            assert plan.repairs
            assert set(call_ids(message)) < set(call_ids(sent_as)) or set(
                result_ids(message)
            ) < set(result_ids(sent_as))


@settings(max_examples=examples(300), deadline=None)
@given(scenarios())
def test_property_plain_messages_kept_are_the_newest(sc: Scenario) -> None:
    """Among tail messages with no tool calls or results, those kept are the newest ones."""
    plan, _ = _plan(sc)
    kept = set(plan.kept_ids)
    plain = [e.entry_id for e in sc.tail if not e.kind and not _is_tool(e.message)]
    flags = [i in kept for i in plain]
    assert flags == sorted(flags), "a kept plain message is never older than a dropped one"


@settings(max_examples=examples(300), deadline=None)
@given(scenarios())
def test_property_exchanges_kept_or_dropped_whole(sc: Scenario) -> None:
    """A tail exchange (call and results all unprotected) is sent whole or not at all.

    Not an exchange a repair must split: one whose call ids another message
    makes too, or answered by a message that answers another caller as well.
    """
    plan, _ = _plan(sc)
    kept = set(plan.kept_ids)
    tail_ids = {e.entry_id for e in sc.tail}
    makers: defaultdict[str, set[str]] = defaultdict(set)
    for entry in sc.history:
        for cid in call_ids(entry.message):
            makers[cid].add(entry.entry_id)
    for entry in sc.history:
        made = set(call_ids(entry.message))
        if not made or entry.kind or entry.entry_id not in tail_ids:
            continue
        if any(makers[cid] != {entry.entry_id} for cid in made):
            continue  # its ids are made twice
        answers = [e for e in sc.history if made & set(result_ids(e.message))]
        if any(e.kind or e.entry_id not in tail_ids for e in answers):
            continue
        if any(makers[r] - {entry.entry_id} for e in answers for r in result_ids(e.message)):
            continue  # one of its answers answers another caller too
        first: dict[str, str] = {}
        for e in answers:
            for r in result_ids(e.message):
                first.setdefault(r, e.entry_id)
        members = {entry.entry_id, *first.values()} if first else set()
        assert not members or members <= kept or not (members & kept), members


@settings(max_examples=examples(300), deadline=None)
@given(scenarios())
def test_property_previews_only_when_full_does_not_fit(sc: Scenario) -> None:
    """A tail entry goes as a preview only when its full form would break the budget.

    The budget charged when previews are chosen is what the plan counts, plus
    what a repair later removed whole (no longer counted): protected entries,
    charged in full, and tail entries. Each entry removed has repair lines of
    its own, so at most ``len(plan.repairs)``, less the protected ones removed,
    of the tail entries not sent had been charged, each at most its full
    size. With no repairs the bound is exact.
    """
    plan, originals = _plan(sc)
    protected_ids = {e.entry_id for e in sc.protected}
    roomy = sum(e.tokens for e in sc.tail if e.entry_id not in protected_ids)
    roomy += plan.protected_tokens + (sc.summary.tokens if sc.summary else 0)
    if roomy <= sc.budget:  # everything fits: every plain message sent, nothing previewed
        plain = [e.entry_id for e in sc.tail if not e.kind and not _is_tool(e.message)]
        assert set(plain) <= set(plan.kept_ids)
        assert set(plan.offloaded) <= protected_ids
    kept = set(plan.kept_ids)
    removed = [e for e in sc.protected if e.entry_id not in kept]  # only a repair removes them
    assert len(removed) <= len(plan.repairs)
    unsent = sorted(
        (
            max(e.tokens, e.preview_tokens)
            for e in sc.tail
            if e.entry_id not in kept and e.entry_id not in protected_ids
        ),
        reverse=True,
    )
    # Both 0 without repairs.
    uncounted = sum(e.tokens for e in removed)
    uncounted += sum(unsent[: len(plan.repairs) - len(removed)])
    # Protected entries are charged in full even when sent as a preview (see
    # test_pinned_large_result_sent_in_full_when_it_fits).
    charged = (
        plan.tokens
        + uncounted
        + sum(
            originals[i].tokens - originals[i].preview_tokens
            for i in plan.offloaded
            if i in protected_ids
        )
    )
    for entry_id in plan.offloaded:
        if entry_id not in protected_ids:
            entry = originals[entry_id]
            assert charged + entry.tokens - entry.preview_tokens > sc.budget


@settings(max_examples=examples(300), deadline=None)
@given(scenarios())
def test_property_with_a_count_tokens_are_what_is_sent_and_fit(sc: Scenario) -> None:
    """With a count, plan.tokens is exactly what is sent, and within the budget unless over.

    The entries' stored sizes here are random, not their counts: a stripped
    message can count more than it was charged, and the budget still holds.
    """
    plan, originals = _plan(sc, COUNT)
    expected = 0
    for slot, message in zip(_slots(plan, sc.summary), plan.messages, strict=True):
        if slot is None:
            assert sc.summary is not None
            expected += sc.summary.tokens
        elif slot not in plan.offloaded and message == originals[slot].message:
            expected += originals[slot].tokens  # sent as stored
        else:
            expected += COUNT(message)  # a preview, or stripped by a repair
    assert plan.tokens == expected
    if plan.over_budget:
        assert set(plan.kept_ids) <= {e.entry_id for e in sc.protected}
        assert not plan.summary_used
    else:
        assert plan.tokens <= sc.budget
    assert orphans(plan.messages) == 0
    paired(plan.messages)
