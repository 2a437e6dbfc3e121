"""Growing a held plan by new entries (``ctxstore._plan.growth``): pure, no Redis.

Whatever the conversation, the anchor and the budget, a plan grown by the
entries appended since is the plan made from scratch, or no plan at all
(the view is then planned from scratch).
"""

from __future__ import annotations

import dataclasses
from functools import partial
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from support.config import examples
from support.helpers import assistant, oa_call, oa_result, user
from support.scenarios import Scenario, scenarios

from ctxstore import count_message
from ctxstore._layout.codec import Entry
from ctxstore._plan.anchored import plan_anchored
from ctxstore._plan.growth import _again, grow
from ctxstore._plan.view import Anchor, Shape, SummaryLevel, ViewPlan
from ctxstore.testing import WordCounter

COUNT = partial(count_message, WordCounter())
SHAPE = Shape()


def eid(n: int) -> str:
    return f"{1000 + n}-0"


def plan(
    protected: list[Entry],
    entries: list[Entry],
    budget: int,
    anchor: Anchor | None,
    levels: list[SummaryLevel] | None,
    complete: bool,
) -> tuple[ViewPlan | None, Anchor | None]:
    return plan_anchored(
        protected,
        entries,
        budget,
        anchor=anchor,
        levels=levels,
        complete=complete,
        shape=SHAPE,
        epoch=0,
        stamp="s",
        count=COUNT,
    )


def sent(view: ViewPlan) -> dict[str, Any]:
    """What a view sends and says of itself (``dropped`` counts what was read, not sent)."""
    fields = dataclasses.asdict(view)
    del fields["growth"], fields["dropped"]
    return fields


def test_a_held_plan_grows_by_plain_messages_and_whole_exchanges() -> None:
    """New text and a whole tool exchange go after what was sent, as a fresh plan sends them."""
    old = [Entry.of(eid(i), user(f"u{i}"), 10) for i in range(5)]
    held, _ = plan([], old, 200, None, None, complete=True)
    assert held is not None and held.growth is not None
    new = [
        Entry.of(eid(5), oa_call("c1"), 10),
        Entry.of(eid(6), oa_result("c1"), 10),
        Entry.of(eid(7), assistant("done"), 10),
    ]
    grown = grow(held, [*old, *new], new, 200, anchor=None, complete=True, shape=SHAPE)
    fresh, _ = plan([], [*old, *new], 200, None, None, complete=True)
    assert grown is not None and fresh is not None
    assert sent(grown) == sent(fresh)
    assert grown.kept_ids == [eid(i) for i in range(8)]


def test_a_result_for_an_earlier_call_is_planned_again() -> None:
    """A result answering a call sent stripped changes what was sent: no growth."""
    old = [Entry.of(eid(0), user("go"), 10), Entry.of(eid(1), oa_call("c1", text="hm"), 10)]
    held, _ = plan([], old, 200, None, None, complete=True)
    assert held is not None and held.repairs == ["dropped unanswered call c1"]
    new = [Entry.of(eid(2), oa_result("c1"), 10)]
    assert grow(held, [*old, *new], new, 200, anchor=None, complete=True, shape=SHAPE) is None


def test_a_full_view_is_planned_again() -> None:
    """New entries that take the view past its budget move the anchor: no growth."""
    old = [Entry.of(eid(i), user(f"u{i}"), 10) for i in range(5)]
    held, _ = plan([], old, 55, None, None, complete=True)
    assert held is not None
    new = [Entry.of(eid(5), user("one more"), 10)]
    assert grow(held, [*old, *new], new, 55, anchor=None, complete=True, shape=SHAPE) is None


def test_a_plan_grown_by_nothing_carries_every_field() -> None:
    """``_again`` names each field of ViewPlan: one added later and left out there fails here."""
    held = ViewPlan(
        messages=[user("a")],
        tokens=7,
        kept_ids=[eid(0)],
        dropped=3,
        offloaded=[eid(1)],
        repairs=["dropped unanswered call c1"],
        over_budget=True,
        summary_used=True,
        summary_covers=eid(2),
        protected_tokens=5,
        growth=None,
        nested=frozenset({0}),
        ready=[user("a")],
    )
    for f in dataclasses.fields(ViewPlan):
        default = f.default_factory() if f.default is dataclasses.MISSING else f.default  # type: ignore[misc]
        if f.name != "growth":
            assert getattr(held, f.name) != default, f"give {f.name} a value above"
    before = dataclasses.asdict(held)
    again = _again(held, held.tokens, held.growth)
    assert dataclasses.asdict(again) == before
    assert again.messages is not held.messages and again.kept_ids is not held.kept_ids
    assert held.ready is None  # the copy made ahead is handed over once


def test_a_copy_made_ahead_is_handed_out_once_and_grows_with_the_plan() -> None:
    """The next view's copy: the held one taken, the new messages copied after it."""
    call = {"role": "assistant", "tool_calls": [{"id": "c1", "function": {"name": "f"}}]}
    held = ViewPlan(messages=[user("a")], kept_ids=[eid(0)], nested=frozenset())
    ready = [user("a")]
    held.ready = ready
    new = [Entry.of(eid(1), call, 5)]
    grown = _again(held, 12, None, new)
    assert grown.ready is ready and ready == [user("a"), call]
    assert ready[1] is not call and ready[1]["tool_calls"][0] is not call["tool_calls"][0]
    assert held.ready is None
    assert _again(held, 12, None, new).ready is None  # taken: the next grows without one


def appended(draw: st.DrawFn, after: str, count: int) -> list[Entry]:
    """Entries appended after entry id ``after``, mostly text and whole exchanges.

    Now and then an exchange left open, a result of an earlier call, or a large result.
    """
    ms = int(after.split("-")[0]) if after else 5_000
    out: list[Entry] = []

    def add(message: dict[str, Any], tokens: int, preview: bool = False) -> None:
        out.append(
            Entry.of(
                f"{ms + 1 + len(out)}-0",
                message,
                tokens,
                preview={**message, "content": "preview"} if preview else None,
                preview_tokens=3 if preview else 0,
            )
        )

    while len(out) < count:
        n = len(out)
        kind = draw(st.sampled_from(["text"] * 5 + ["exchange"] * 4 + ["open", "late", "big"]))
        if kind == "text":
            add(draw(st.sampled_from([user, assistant]))(f"t{n}"), draw(st.integers(0, 20)))
        elif kind in ("exchange", "open"):
            cids = [f"g{ms}_{n}_{i}" for i in range(draw(st.integers(1, 2)))]
            add(oa_call(*cids), draw(st.integers(0, 10)))
            for cid in cids[: len(cids) if kind == "exchange" else 0]:
                add(oa_result(cid), draw(st.integers(0, 30)))
        elif kind == "late":  # answers a call made before (maybe sent stripped)
            add(oa_result(f"call_{draw(st.integers(1, 4))}"), draw(st.integers(0, 10)))
        else:
            add(oa_result(f"call_{draw(st.integers(1, 4))}", "big"), 60, preview=True)
    return out


@st.composite
def growths(draw: st.DrawFn) -> tuple[Scenario, int, int, Anchor | None, bool]:
    """A scenario's history cut in three (planned, then grown twice) and an anchor on the first.

    Half the time what is grown by is appended to the whole scenario instead
    (mostly text and whole exchanges), with room enough for some of it.
    """
    sc = draw(scenarios())
    mode = draw(st.sampled_from(["scenario", "appended", "plain", "plain"]))
    if mode == "plain":  # an agent's plain history: text and whole exchanges, mostly
        sc.history, sc.summary, sc.budget = appended(draw, "", draw(st.integers(1, 30))), None, 0
    cut = draw(st.integers(0, len(sc.history)))
    if mode != "scenario":
        cut = draw(st.sampled_from([cut, len(sc.history)]))
        last = sc.history[-1].entry_id if sc.history else ""
        sc.history += appended(draw, last, draw(st.integers(1, 8)))
        roomy = sum(e.tokens for e in sc.history) + (sc.summary.tokens if sc.summary else 0)
        sc.budget = draw(st.sampled_from([sc.budget, sc.budget + 100, roomy, roomy])) + draw(
            st.integers(-10, 40)
        )
    end = draw(st.integers(cut, len(sc.history)))
    start = draw(st.integers(0, cut))
    anchor = None
    if draw(st.booleans()) and start < cut:
        summary = sc.summary if draw(st.booleans()) else None
        level = 1 if summary else 0
        anchor = Anchor(0, sc.history[start].entry_id, summary, level, "a")
    return sc, cut, end, anchor, draw(st.booleans())


@settings(max_examples=examples(600), deadline=None)
@given(growths())
def test_property_a_grown_plan_is_the_fresh_plan(
    case: tuple[Scenario, int, int, Anchor | None, bool],
) -> None:
    """Grown by what was appended (once, then again), a plan sends what a fresh plan sends."""
    sc, cut, end, anchor, step = case
    # What was appended since is not protected (a protected entry is planned again).
    history = [e if i < cut else dataclasses.replace(e, kind="") for i, e in enumerate(sc.history)]
    protected = [e for e in history[:cut] if e.kind]
    complete = anchor is None
    levels = [SummaryLevel(sc.summary, 1)] if step and sc.summary else ([] if step else None)
    held, moved = plan(protected, history[:cut], sc.budget, anchor, levels, complete)
    if held is None:
        return
    anchor = moved or anchor
    for upto in (end, len(history)):
        entries, new = history[:upto], history[cut:upto]
        grown = grow(held, entries, new, sc.budget, anchor=anchor, complete=complete, shape=SHAPE)
        fresh, again = plan(protected, entries, sc.budget, anchor, None, complete)
        if grown is None:
            return
        assert fresh is not None and again is None, "a grown plan keeps its anchor"
        assert sent(grown) == sent(fresh)
        held, cut = grown, upto
