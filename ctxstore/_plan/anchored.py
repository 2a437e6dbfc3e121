"""Pure planning of an anchored view: the view starts at its anchor until it would overflow.

A session's view is planned from an :class:`~ctxstore._layout.codec.Anchor`:
the summary it sends and the first raw entry after it. While what the anchor
holds fits the budget, the view is the anchor's, grown by each new entry, and
a provider's prompt cache keeps its prefix. When it would overflow, the anchor
moves in one step: the summary level that fits its share best, then raw
entries back to the low-water mark of the :class:`~ctxstore._plan.shape.Shape`,
from an exchange boundary; a plan that sent everything from the anchor on, as
first laid out, carries a :class:`~ctxstore._plan.view.Growth` for the next
view (:func:`ctxstore._plan.growth.grow`). The layout, pairing and counting
are the plain planner's (:func:`ctxstore._plan.view.lay_out`).

Two rules come before the anchor's. A history that fits the budget in full
(every tool result whole) is sent whole, in its own order, whatever large
results it holds; past that, large results go as their previews
(:func:`~ctxstore._plan.shape.sends_preview`), a form appends never change
while the anchor holds. And a committed summary that covers entries the
anchor drops without a summary of them is brought in at the next view, by a
step (:func:`brings_summary`): one prefix break is worth more than many
calls without what it holds.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from ctxstore._layout.codec import Anchor, Entry, SummaryLevel, SummaryText
from ctxstore._layout.formats import earliest_callers, entry_order
from ctxstore._plan.pairs import bind_ties
from ctxstore._plan.shape import Shape, per_call, sends_preview
from ctxstore._plan.view import Count, Growth, Sizes, ViewPlan, lay_out

__all__ = ["GAP", "brings_summary", "plan_anchored"]

GAP = "."
"""Ends the stamp of an anchor that drops entries its summary does not cover.

Stamps are otherwise URL-safe base64, which has no ``.``."""


def plan_anchored(
    protected: Sequence[Entry],
    entries: Sequence[Entry],
    budget: int,
    *,
    anchor: Anchor | None,
    levels: Sequence[SummaryLevel] | None,
    complete: bool,
    shape: Shape,
    epoch: int,
    stamp: str,
    count: Count | None = None,
    watermark: str | None = None,
) -> tuple[ViewPlan | None, Anchor | None]:
    """Plan a view from its anchor, and move the anchor when the view would overflow.

    Args:
        protected: System, developer and pinned entries, oldest first.
        entries: The newest entries, oldest first (a run of the history, up
            to its end): from the anchor's start at least, and back to a
            budget's worth or the first entry.
        budget: Tokens available for everything sent.
        anchor: The anchor in force, or ``None`` (the view starts at the
            first entry, with no summary).
        levels: The summaries a step may swap in: the latest one's levels;
            ``None`` when they were not read (a step then returns ``None``).
        complete: ``entries`` starts at the first entry of the history.
        shape: The low-water mark and the shares.
        epoch: The history's epoch (an anchor of another one is ignored).
        stamp: Names a new anchor, if one is made.
        count: Counts a message sent in another form than stored; ``None``
            charges it its stored size.
        watermark: The last entry the latest committed summary covers
            (``None``: none): one that covers entries the anchor drops
            unsummarized moves the anchor (:func:`brings_summary`).

    Returns:
        The plan, and the new anchor when it moved (``None`` when it did not);
        ``(None, None)`` when the anchor must move and ``levels`` is ``None``.
    """
    protected_ids = {e.entry_id for e in protected}
    entries = bind_ties(entries)
    raw = [e for e in entries if e.entry_id not in protected_ids]
    protected_tokens = sum(e.tokens for e in protected)
    sizes = Sizes(count)

    def cost(entry: Entry) -> int:
        return sizes.preview(entry) if sends_preview(entry, budget, shape) else entry.tokens

    def render(
        summary: SummaryText | None, body: list[Entry], held: Anchor | None, previewed: set[str]
    ) -> ViewPlan:
        plan = ViewPlan(protected_tokens=protected_tokens, dropped=len(raw) - len(body))
        if lay_out(plan, protected, summary, body, previewed, sizes, budget):
            plan.growth = Growth(
                anchor=held,
                budget=budget,
                shape=shape,
                charged=protected_tokens
                + (summary.tokens if summary else 0)
                + sum(sizes.preview(e) if e.entry_id in previewed else e.tokens for e in body),
                ids=frozenset(i for e in (*protected, *body) for i in (*e.calls, *e.results)),
                protected=frozenset(protected_ids),
                last=entries[-1].entry_id if entries else "",
            )
        return plan

    def forms(
        summary: SummaryText | None, body: Sequence[Entry], whole: bool = False
    ) -> tuple[set[str], int]:
        """The entries of ``body`` sent as previews, and what the view then costs.

        ``whole``: ``body`` is the whole history, sent in full when that fits.
        """
        base = protected_tokens + (summary.tokens if summary else 0)
        full = base + sum(e.tokens for e in body)
        if whole and full <= budget:
            return set(), full  # the history, as it is
        previewed = {e.entry_id for e in body if sends_preview(e, budget, shape)}
        return previewed, base + sum(map(cost, body))

    if protected_tokens > budget:
        plan = ViewPlan(over_budget=True, protected_tokens=protected_tokens, dropped=len(raw))
        lay_out(plan, protected, None, [], set(), sizes, None)
        return plan, None
    if anchor is not None and anchor.epoch == epoch:
        start = entry_order(anchor.start) if anchor.start else None
        if start is None or complete or (raw and entry_order(raw[0].entry_id) <= start):
            body = [e for e in raw if start is None or entry_order(e.entry_id) >= start]
            previewed, total = forms(anchor.summary, body)
            if total <= budget and not brings_summary(anchor, watermark):
                return render(anchor.summary, body, anchor, previewed), None
    elif anchor is None and complete:
        previewed, total = forms(None, raw, whole=True)
        if total <= budget:  # the whole history fits: in full when it fits in full
            return render(None, raw, None, previewed), None
    # A step: the summary that fits best, then raw entries back to the low-water mark.
    if levels is None:
        return None, None
    summary = _largest_that_fits(levels, protected_tokens, budget, shape)
    summary_tokens = summary.summary.tokens if summary else 0
    room = budget - protected_tokens - summary_tokens
    low_water = shape.low_water_for(budget, per_call(raw, cost, budget))
    target = low_water * budget - protected_tokens - summary_tokens
    covers = entry_order(summary.summary.covers_upto) if summary else None
    chosen = _step_body(raw, cost, target, room, covers)
    begin_id = chosen[0].entry_id if chosen else _after(raw)
    # A later summary may send what this anchor drops unsummarized: one that lags (sent
    # here) or one not committed yet. Not one committed but unsent (it does not fit, or
    # is not the current one): the next commit would not change that, and every view
    # would step again.
    gap = (summary is not None or watermark is None) and _drops_unsummarized(
        raw, begin_id, covers, complete
    )
    new = Anchor(
        epoch=epoch,
        start=begin_id,
        summary=summary.summary if summary else None,
        level=summary.level if summary else 0,
        stamp=stamp + GAP if gap else stamp,
    )
    begin = entry_order(new.start) if new.start else None
    body = [e for e in raw if begin is None or entry_order(e.entry_id) >= begin]
    previewed, _ = forms(new.summary, body)
    return render(new.summary, body, new, previewed), new


def brings_summary(anchor: Anchor | None, watermark: str | None) -> bool:
    """True when a committed summary covers entries ``anchor`` drops with no summary of them.

    The anchor's summary is frozen while it holds, so a newer one waits for
    the next step; but when the anchor drops entries its summary does not
    cover (its stamp ends with :data:`GAP`), a summary covering past what
    the anchor's covers sends what the view lost: the anchor moves at once.
    """
    if anchor is None or watermark is None or not anchor.stamp.endswith(GAP):
        return False
    if anchor.summary is None:
        return True
    return entry_order(watermark) > entry_order(anchor.summary.covers_upto)


def _drops_unsummarized(
    raw: Sequence[Entry], start: str, covers: tuple[int, int] | None, complete: bool
) -> bool:
    """True when a view from ``start`` drops an entry that the summary (to ``covers``) lacks."""
    begin = entry_order(start) if start else None
    for entry in raw:
        order = entry_order(entry.entry_id)
        if begin is not None and order >= begin:
            break
        if covers is None or order > covers:
            return True
    if complete or not raw:
        return False
    # Older entries were not read: they are dropped, and unsummarized unless covered.
    return covers is None or covers < entry_order(raw[0].entry_id)


def _step_body(
    raw: Sequence[Entry],
    cost: Callable[[Entry], int],
    target: float,
    room: int,
    covers: tuple[int, int] | None,
) -> list[Entry]:
    """The raw part of a moved anchor: the suffix nearest ``target`` tokens.

    It starts at an exchange boundary and fits ``room`` (the whole budget).
    With a summary, it reaches back to the first entry the summary does not
    cover if the whole budget holds that: a gap between the summary and the
    raw part would lose what is in it; if it does not (the summary lags), the
    longest suffix that fits, the least gap. Entries the summary covers are
    sent too while they fit: raw text keeps what a summary loses.
    """
    earliest = earliest_callers(raw)
    suffix = [0] * (len(raw) + 1)
    for index in range(len(raw) - 1, -1, -1):
        suffix[index] = suffix[index + 1] + cost(raw[index])
    starts = [i for i in range(len(raw)) if earliest[i] >= i]  # no exchange cut at i
    if not starts:
        return []
    fits = [i for i in starts if suffix[i] <= room]
    if not fits:
        return []

    def miss(i: int) -> float:
        """How far the suffix from ``i`` lands from the target; past it counts double."""
        over = suffix[i] - target
        return 2 * over if over > 0 else -over

    # The suffix nearest the low-water mark: a new anchor as empty as it asks (the
    # most calls before the next move), but not an almost empty view because the
    # next exchange boundary is a large tool result away: overshooting the mark
    # (up to the whole budget) costs twice the tokens short of it.
    best = min(fits, key=miss)
    if covers is not None:
        uncovered = next(
            (i for i, e in enumerate(raw) if entry_order(e.entry_id) > covers), len(raw)
        )
        whole = [i for i in starts if i <= uncovered and suffix[i] <= room]
        if whole and uncovered < len(raw):
            best = min(best, whole[-1])  # no gap, and covered entries too while they fit
        elif uncovered < best:
            best = fits[0]  # the summary lags the budget: the least gap, not the mark
    return list(raw[best:])


def _largest_that_fits(
    levels: Sequence[SummaryLevel], protected: int, budget: int, shape: Shape
) -> SummaryLevel | None:
    """The summary level a step sends (or ``None``).

    The largest within the summary's share of the budget that fits beside
    the protected entries; else the smallest that leaves the raw part some
    room (a summary too long for its share still beats none).
    """
    by_size = sorted(levels, key=lambda lv: lv.summary.tokens)
    within = [
        lv
        for lv in by_size
        if lv.summary.tokens <= shape.summary_share * budget
        and protected + lv.summary.tokens <= budget
    ]
    if within:
        return within[-1]
    roomy = [lv for lv in by_size if protected + lv.summary.tokens <= shape.low_water * budget]
    return roomy[0] if roomy else None


def _after(raw: Sequence[Entry]) -> str:
    """An entry id after every entry of ``raw`` (a view that sends none of them)."""
    if not raw:
        return ""
    ms, seq = entry_order(raw[-1].entry_id)
    return f"{ms}-{seq + 1}"
