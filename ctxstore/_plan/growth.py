"""Growing a held view by what was appended since: the plan a fresh one makes, in less time.

A pod that viewed a session keeps the plan it sent (:class:`ctxstore._plan.view.Growth`).
When its next view finds the same anchor, the same protected entries and
only new entries after the ones it planned from, and those new entries
change nothing planned before (none is protected or sent as a preview, their
tool exchanges are whole among themselves and share no id with what was
planned) and still fit the budget, the fresh plan would send the previous
messages unchanged and the new ones after them, as stored: that is what
:func:`grow` returns, without planning the rest again. Anything else
returns ``None``, and the view is planned from scratch.
"""

from __future__ import annotations

from collections.abc import Sequence

from ctxstore._layout.codec import Anchor, Entry
from ctxstore._layout.formats import entry_order
from ctxstore._plan.pairs import bind_ties, chained, in_place, pair
from ctxstore._plan.view import (
    Growth,
    Shape,
    ViewPlan,
    caller_copy,
    nested_positions,
    sends_preview,
)

__all__ = ["grow"]


def grow(
    held: ViewPlan,
    entries: Sequence[Entry],
    new: Sequence[Entry],
    budget: int,
    *,
    anchor: Anchor | None,
    complete: bool,
    shape: Shape,
) -> ViewPlan | None:
    """The plan ``plan_anchored`` would make from ``entries``, grown from ``held``; else ``None``.

    The caller vouches that ``held`` was planned on ``anchor`` from the same
    protected entries, for this budget and shape, and that ``entries`` holds
    what it was planned from (from the anchor's start at least) and ``new``:
    with nothing new, ``held`` is the plan again.

    Args:
        held: The previous plan of this view, made from ``entries`` without ``new``.
        entries: What the view read, oldest first; ``new`` is its end.
        new: The entries read after those ``held`` was planned from, oldest first.
        budget: Tokens available for everything sent.
        anchor: The anchor in force (the same object ``held`` was planned on).
        complete: ``entries`` starts at the first entry of the history.
        shape: The low-water mark and the shares.
    """
    if not new:
        return _again(held, held.tokens, held.growth)
    growth = held.growth
    if (
        growth is None
        or growth.anchor is not anchor
        or growth.budget != budget
        or growth.shape != shape
        or (growth.last and entry_order(new[0].entry_id) <= entry_order(growth.last))
        or not _holds(growth, entries, anchor, complete)
    ):
        return None
    # A reasoning item planned last (its tie open, so not sent) is answered by the first
    # new entry: the tie is an id planned before, and the view is planned again.
    start = len(entries) - len(new)
    new = bind_ties([entries[start - 1], *new])[1:] if start > 0 else bind_ties(new)
    tokens = 0
    ids: set[str] = set()
    for entry in new:
        if entry.entry_id in growth.protected or sends_preview(entry, budget, shape):
            return None
        tokens += entry.tokens
        ids.update(entry.calls)
        ids.update(entry.results)
    if (
        growth.charged + tokens > budget
        or held.tokens + tokens > budget
        or not ids.isdisjoint(growth.ids)
        or not _whole(new)
    ):
        return None
    grown = Growth(
        anchor=anchor,
        budget=budget,
        shape=shape,
        charged=growth.charged + tokens,
        ids=growth.ids | ids if ids else growth.ids,
        protected=growth.protected,
        last=new[-1].entry_id,
    )
    return _again(held, held.tokens + tokens, grown, new)


def _again(
    held: ViewPlan, tokens: int, growth: Growth | None, new: Sequence[Entry] = ()
) -> ViewPlan:
    """``held`` with ``new`` sent after it, as stored (lists of its own: ``held`` is kept)."""
    added = [e.message for e in new]
    nested = held.nested
    if nested is not None and added:
        nested = nested | nested_positions(added, len(held.messages))
    ready, held.ready = held.ready, None  # made for the next view of held: handed out once
    if ready is not None and nested is not None:
        ready.extend(caller_copy(added, nested, len(held.messages)))
    return ViewPlan(  # every field: a third of what dataclasses.replace costs
        messages=[*held.messages, *added],
        tokens=tokens,
        kept_ids=[*held.kept_ids, *(e.entry_id for e in new)],
        dropped=held.dropped,
        offloaded=list(held.offloaded),
        repairs=list(held.repairs),
        over_budget=held.over_budget,
        summary_used=held.summary_used,
        summary_covers=held.summary_covers,
        protected_tokens=held.protected_tokens,
        growth=growth,
        nested=nested,
        ready=ready if nested is not None else None,
    )


def _holds(growth: Growth, entries: Sequence[Entry], anchor: Anchor | None, complete: bool) -> bool:
    """True when ``plan_anchored`` keeps the anchor for ``entries`` (before its budget test)."""
    if anchor is None:
        return complete  # the whole history fits: only while it is whole
    if not anchor.start or complete:
        return True
    first = next((e for e in entries if e.entry_id not in growth.protected), None)
    return first is not None and entry_order(first.entry_id) <= entry_order(anchor.start)


def _whole(new: Sequence[Entry]) -> bool:
    """True when ``new``'s tool exchanges are whole among themselves and already in order.

    Each call answered once, each result answering a call of ``new``, nothing
    stripped or moved: laid out after the rest, they are sent as stored.
    """
    if not any(e.calls or e.results for e in new):
        return True
    repairs: list[str] = []
    pairs = pair(new, repairs)
    if repairs:
        return False
    for index, entry in enumerate(new):
        kept = pairs.results.get(index, ())
        if len(kept) < len(entry.results) or len(pairs.calls.get(index, ())) < len(entry.calls):
            return False
    return in_place(len(new), pairs.caller, chained(new, pairs))
