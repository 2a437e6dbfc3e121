"""Pure planning of a request view: entries and a budget in, a plan out, no I/O.

The request view is planned here from what one read returned:

- the *protected* entries, sent whatever happens (system, developer and
  pinned messages);
- the cached summary, if any, standing in for everything up to its watermark;
- the *tail*: the newest entries after the watermark, as many as the budget
  could hold.

A tool exchange (an assistant message that calls tools and every message
that answers those calls, parallel calls included) is kept or dropped as a
unit. After selection, pairs are matched by id in both directions (see
:func:`ctxstore._plan.pairs.pair`): each call is answered once, each answering message answers
one calling message and is placed right after it, and a call or result left
without its partner is removed, so an orphan is never sent; each repair is
reported.

Entries carry their tool call ids (stored beside the message at append), so
planning never parses a message; only the messages finally sent are decoded.
A message sent as stored costs the tokens counted at append; one sent in
another form (a preview, whose placeholders are filled in, or a message a
repair stripped) is counted as sent, with the ``count`` the planner is given.

The plan (:class:`ViewPlan`), what it leaves a later view to grow it by
(:class:`Growth`), and the layout (:func:`lay_out`: hoisting, pairing,
counting) are here, shared with the anchored planner,
:func:`ctxstore._plan.anchored.plan_anchored`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ctxstore._layout.codec import Anchor, Entry, SummaryLevel, SummaryText
from ctxstore._layout.formats import REASONING, earliest_callers, entry_order, item_type
from ctxstore._plan.pairs import (
    Pairs,
    bind_ties,
    chained,
    pair,
    place,
    without_calls,
    without_results,
)
from ctxstore._plan.shape import Shape, form_cost, sends_preview

__all__ = [
    "Anchor",
    "Count",
    "Growth",
    "Shape",
    "SummaryLevel",
    "ViewPlan",
    "form_cost",
    "nested_positions",
    "plan_view",
    "sends_preview",
]

Count = Callable[[dict[str, Any]], int]
"""Counts a message as it is sent: ``count_message`` with the counter of the appends."""


@dataclass(slots=True)
class ViewPlan:
    """The messages a view sends, and what was left out.

    Attributes:
        messages: The messages, in the order to send them.
        tokens: Their tokens: what each was counted at append, and for a
            message sent in another form (a preview, or stripped by a
            repair) its count as sent (its stored size when the plan had no
            ``count``).
        kept_ids: Entry ids sent, in order.
        dropped: Tail entries read but not sent.
        offloaded: Entry ids sent as a preview.
        repairs: One line per tool-pair repair.
        over_budget: True when the protected entries alone exceed the budget.
        summary_used: True when the summary was sent.
        summary_covers: The last entry id the summary sent covers.
        protected_tokens: Tokens of the protected entries.
        growth: What the next view needs to grow this plan, if it can.
        nested: The positions of the messages holding a list or a dict, which a
            caller's copy copies again (the others copy in one step); ``None``
            until the plan is complete.
        ready: A caller's copy of ``messages`` made ahead, while the pod
            waited, not handed out yet (``None``: none).
    """

    messages: list[dict[str, Any]] = field(default_factory=list)
    tokens: int = 0
    kept_ids: list[str] = field(default_factory=list)
    dropped: int = 0
    offloaded: list[str] = field(default_factory=list)
    repairs: list[str] = field(default_factory=list)
    over_budget: bool = False
    summary_used: bool = False
    summary_covers: str | None = None
    protected_tokens: int = 0
    growth: Growth | None = None
    nested: frozenset[int] | None = None
    ready: list[dict[str, Any]] | None = None


def nested_positions(messages: Sequence[dict[str, Any]], start: int = 0) -> frozenset[int]:
    """The positions (counted from ``start``) of the messages with a list or dict value."""
    return frozenset(
        i
        for i, message in enumerate(messages, start)
        if any(type(value) in (list, dict) for value in message.values())
    )


def caller_copy(
    messages: Sequence[dict[str, Any]], nested: frozenset[int], start: int = 0
) -> list[dict[str, Any]]:
    """Copies of ``messages`` that share no dict or list with them (3x faster than deepcopy).

    ``nested``: the positions (counted from ``start``) of those holding a list
    or a dict (:func:`nested_positions`); the others are copied in one step.
    """
    if not nested:
        return [m.copy() for m in messages]
    return [_own(m) if i in nested else m.copy() for i, m in enumerate(messages, start)]


def _own(message: dict[str, Any]) -> dict[str, Any]:
    """A copy of a message sharing no dict or list with it (3x faster than deepcopy).

    A shallow copy first, then only the values that are containers copied again:
    most values of a message are strings.
    """
    out = message.copy()
    for key, value in message.items():
        if type(value) in _CONTAINERS:
            out[key] = _copied(value)
    return out


_CONTAINERS = (list, dict)


def _copied(value: Any) -> Any:
    """A container's copy (only containers in it are copied again)."""
    if type(value) is dict:
        return {k: _copied(v) if type(v) in _CONTAINERS else v for k, v in value.items()}
    return [_copied(v) if type(v) in _CONTAINERS else v for v in value]


@dataclass(frozen=True, slots=True)
class Growth:
    """What a plan whose anchor held leaves for the next view to grow it by new entries.

    Set when the plan sent every entry from the anchor's start on, as it
    laid them out first (no repair grew a message past its charge), in their
    stored order; :func:`ctxstore._plan.growth.grow` checks the rest.

    Attributes:
        anchor: The anchor it was planned on (``None``: the whole history fit).
        budget: The budget it was planned for.
        shape: The shape it was planned with.
        charged: What the anchor's test charged: the protected entries, the
            summary and every entry from the start in the form it is sent in.
        ids: Every tool call and result id of the entries it was planned from.
        protected: The ids of the protected entries.
        last: The newest entry id it was planned from (``""``: none).
    """

    anchor: Anchor | None
    budget: int
    shape: Shape
    charged: int
    ids: frozenset[str]
    protected: frozenset[str]
    last: str


def plan_view(
    protected: Sequence[Entry],
    summary: SummaryText | None,
    tail: Sequence[Entry],
    budget: int,
    *,
    complete: bool = False,
    count: Count | None = None,
) -> ViewPlan:
    """Choose the messages of a request view.

    Args:
        protected: System, developer and pinned entries, oldest first.
        summary: The cached summary, or ``None``.
        tail: Entries after the summary's watermark, oldest first (a run of
            the history, up to its end); usually only the newest ones, as
            many as the budget could hold.
        budget: Tokens available for everything returned.
        complete: True when ``tail`` reaches back to the summary's watermark
            (or the start of the history): a result whose call is not found
            then has no call at all.
        count: Counts a message sent in another form than stored; ``None``
            charges it its stored size.

    Returns:
        The plan. The tokens of what it sends never exceed ``budget`` unless
        the protected entries alone do; then ``over_budget`` is set and only
        they are sent.
    """
    plan = ViewPlan()
    sizes = Sizes(count)
    protected_ids = {e.entry_id for e in protected}
    tail = [e for e in bind_ties(tail) if e.entry_id not in protected_ids]
    plan.protected_tokens = sum(e.tokens for e in protected)
    full: set[str] = set()  # previewable entries sent in full
    if plan.protected_tokens > budget:
        plan.over_budget = True
        chosen: list[Entry] = []
    else:
        remaining = budget - plan.protected_tokens
        if summary is not None and summary.tokens <= remaining:
            plan.summary_used = True
            remaining -= summary.tokens
        outside = {cid for e in protected for cid in e.calls}
        chosen = _select_tail(tail, remaining, outside, complete, plan, sizes.cheapest)
        remaining -= sum(map(sizes.cheapest, chosen))
        # Fill what is left with full tool results, newest first.
        for entry in reversed(chosen):
            if entry.preview_data is None:
                continue
            extra = entry.tokens - sizes.preview(entry)
            if extra <= remaining:
                remaining -= extra
                full.add(entry.entry_id)
    plan.dropped = len(tail) - len(chosen)
    # Protected entries always go whole: their full size is what was reserved.
    previewed = {e.entry_id for e in chosen if e.preview_data is not None} - full
    sent = summary if plan.summary_used else None
    lay_out(plan, protected, sent, chosen, previewed, sizes, None if plan.over_budget else budget)
    return plan


def _select_tail(
    tail: Sequence[Entry],
    budget: int,
    outside_calls: set[str],
    complete: bool,
    plan: ViewPlan,
    cost_of: Callable[[Entry], int],
) -> list[Entry]:
    """The newest entries whose whole tool exchanges fit in ``budget``.

    Walking back from the newest entry, a result costs nothing until the
    message that made its call is reached; then the whole exchange is
    charged at once, so an exchange is kept whole or not at all. A result
    whose call is neither in ``tail`` nor in ``outside_calls`` belongs to an
    exchange that started before the tail: it is left out. When ``complete``
    (the tail reaches back to the start of what can be sent), no such call
    exists at all, and leaving the result out is reported as a repair.
    Each entry costs ``cost_of(entry)`` (the form the selection charges first).
    """
    owner: dict[str, int] = {}
    for index, entry in enumerate(tail):
        for cid in entry.calls:
            owner.setdefault(cid, index)
    left_out: set[int] = set()
    pending: dict[int, int] = {}  # index of a calling entry -> tokens of its later results
    used = 0
    start = len(tail)
    for index in range(len(tail) - 1, -1, -1):
        entry = tail[index]
        cost = cost_of(entry)
        if entry.results:
            owners = [owner[r] for r in entry.results if r in owner and owner[r] < index]
            if owners:
                first = min(owners)
                pending[first] = pending.get(first, 0) + cost
                cost = 0
            elif not any(r in owner or r in outside_calls for r in entry.results):
                left_out.add(index)
                cost = 0
                if complete:
                    plan.repairs.extend(f"dropped orphan result {r}" for r in entry.results)
        if pending:
            cost += pending.pop(index, 0)
        if used + cost > budget:
            break
        used += cost
        start = index
    chosen = []
    for index in range(start, len(tail)):
        entry = tail[index]
        if entry.results and (
            index in left_out
            # A result whose call was cut goes with its exchange.
            or any(r in owner and owner[r] < start for r in entry.results)
        ):
            continue
        chosen.append(entry)
    return chosen


class Sizes:
    """What an entry costs in the form it is sent in.

    As stored, the tokens counted at append. A preview is sent with its
    placeholders filled in, and a repair may strip blocks: such a message is
    counted as sent with ``count`` (each preview once per plan); with no
    ``count``, it is charged its stored size.
    """

    def __init__(self, count: Count | None) -> None:
        self._count = count
        self._previews: dict[str, int] = {}

    def preview(self, entry: Entry) -> int:
        """The tokens of ``entry``'s preview as sent."""
        if self._count is None:
            return entry.preview_tokens
        size = self._previews.get(entry.entry_id)
        if size is None:
            preview = entry.preview
            assert preview is not None, "only an entry with a preview is sent as one"
            size = self._previews[entry.entry_id] = self._count(preview)
        return size

    def cheapest(self, entry: Entry) -> int:
        """What the selection charges first: the preview, if there is one."""
        return entry.tokens if entry.preview_data is None else self.preview(entry)

    def sent(self, entry: Entry, message: dict[str, Any], as_preview: bool) -> int:
        """The tokens of ``message``, ``entry`` as sent after a repair stripped it."""
        if self._count is not None:
            return self._count(message)
        return entry.preview_tokens if as_preview else entry.tokens


def lay_out(
    plan: ViewPlan,
    protected: Sequence[Entry],
    summary: SummaryText | None,
    body: Sequence[Entry],
    previewed: set[str],
    sizes: Sizes,
    budget: int | None,
) -> bool:
    """Lay a view out (hoisted protected entries, the summary, the body in order) into ``plan``.

    Entries in ``previewed`` are sent as their preview. A repair only
    removes blocks, so what is sent is no larger than what was charged;
    should the counter say otherwise, the oldest exchanges of the body go,
    then the summary, until it fits ``budget`` (``None``: not checked).

    Returns:
        True when the first layout fit, each message in its stored place
        (what :func:`ctxstore._plan.growth.grow` extends).
    """
    protected_ids = {e.entry_id for e in protected}
    first = True
    while True:
        cut = entry_order(body[0].entry_id) if body else None
        hoisted = [e for e in protected if cut is None or entry_order(e.entry_id) < cut]
        hoisted.sort(key=lambda e: e.kind != "s")  # system first; the sort is stable
        inline = [e for e in protected if cut is not None and entry_order(e.entry_id) >= cut]
        ordered = (
            sorted([*body, *inline], key=lambda e: entry_order(e.entry_id)) if inline else body
        )
        items: list[Entry | None] = [*hoisted, None, *ordered] if summary else [*hoisted, *ordered]
        sent = ViewPlan()
        in_place = _repair_place_and_render(items, summary, previewed, protected_ids, sizes, sent)
        if budget is None or sent.tokens <= budget:
            break
        first = False
        if body:
            start = _next_start(body)
            plan.dropped += start
            body = body[start:]
        elif summary is not None:
            summary = None
        else:
            plan.over_budget = True  # the protected entries alone, as sent
            break
    plan.summary_used = summary is not None
    plan.summary_covers = summary.covers_upto if summary else None
    plan.messages, plan.kept_ids, plan.offloaded = sent.messages, sent.kept_ids, sent.offloaded
    plan.tokens = sent.tokens
    plan.repairs.extend(sent.repairs)
    plan.dropped += sent.dropped
    return first and in_place and bool(body)


def _next_start(body: Sequence[Entry]) -> int:
    """The index of the next entry of ``body`` that starts an exchange (else its length)."""
    earliest = earliest_callers(body)
    return next((i for i in range(1, len(body)) if earliest[i] >= i), len(body))


def _repair_place_and_render(
    items: list[Entry | None],
    summary: SummaryText | None,
    previewed: set[str],
    protected_ids: set[str],
    sizes: Sizes,
    plan: ViewPlan,
) -> bool:
    """Pair calls and results, strip what is left unpaired, count, and place results.

    ``None`` in ``items`` stands for the summary; entries in ``previewed``
    are sent as their preview. Fills ``plan``'s messages, kept ids,
    offloaded ids, tokens and repairs; ``plan.dropped`` counts the tail
    entries a repair left nothing of. Returns True when the items were
    already in the order to send them in.
    """
    pairs = pair(items, plan.repairs)
    rendered: list[dict[str, Any] | None] = [None] * len(items)
    forms: dict[int, tuple[bool, bool]] = {}  # a repaired or previewed item: how it is sent
    for index, entry in enumerate(items):
        if entry is None:
            assert summary is not None
            rendered[index] = summary.message
            plan.tokens += summary.tokens
        elif not entry.calls and not entry.results and entry.preview_data is None:
            rendered[index] = entry.message  # the usual case: sent as stored
            plan.tokens += entry.tokens
        else:
            message, as_preview, stripped = _render(entry, pairs, index, previewed)
            rendered[index], forms[index] = message, (as_preview, stripped)
    # An answering item left with nothing to send answers nothing: its caller loses those
    # calls (a reasoning item whose next item is not sent is not sent either), and so on.
    gone = [i for i in pairs.caller if rendered[i] is None]
    while gone:
        index = gone.pop()
        caller = pairs.caller.pop(index)
        pairs.calls[caller].difference_update(pairs.results.pop(index, ()))
        entry = items[caller]
        if entry is None or rendered[caller] is None:
            continue
        message, as_preview, stripped = _render(entry, pairs, caller, previewed)
        rendered[caller], forms[caller] = message, (as_preview, stripped)
        if rendered[caller] is None:
            plan.repairs.append(f"dropped {_what(entry)}: the item after it is not sent")
            if caller in pairs.caller:
                gone.append(caller)
    for index, (as_preview, stripped) in sorted(forms.items()):
        entry, message = items[index], rendered[index]
        assert entry is not None
        if message is None:
            if entry.entry_id not in protected_ids:
                plan.dropped += 1
            continue
        if stripped:
            plan.tokens += sizes.sent(entry, message, as_preview)
        elif as_preview:
            plan.tokens += sizes.preview(entry)
        else:
            plan.tokens += entry.tokens
        if as_preview:
            plan.offloaded.append(entry.entry_id)
    order = place(len(items), pairs.caller, chained(items, pairs))
    for index in order:
        message = rendered[index]
        if message is not None:
            plan.messages.append(message)
            entry = items[index]
            if entry is not None:
                plan.kept_ids.append(entry.entry_id)
    return isinstance(order, range)


def _render(
    entry: Entry, pairs: Pairs, index: int, previewed: set[str]
) -> tuple[dict[str, Any] | None, bool, bool]:
    """``entry`` (at ``index``) as sent: its message, whether as a preview and stripped.

    The message is ``None`` when a repair leaves nothing of it to send.
    """
    as_preview = entry.entry_id in previewed
    results: Sequence[str] = pairs.results.get(index, ())
    calls = pairs.calls.get(index) or set()
    stripped = len(results) < len(entry.results) or len(calls) < len(entry.calls)
    message: dict[str, Any] | None = entry.preview if as_preview else entry.message
    assert message is not None
    if stripped:
        if len(results) < len(entry.results):
            message = without_results(message, set(results))
        if message is not None and len(calls) < len(entry.calls):
            message = without_calls(message, calls)
    return message, as_preview, stripped


def _what(entry: Entry) -> str:
    """How a repair names an entry it dropped: a reasoning item, or a message, by entry id."""
    kind = "reasoning item" if item_type(entry.message) == REASONING else "message"
    return f"{kind} {entry.entry_id}"
