"""Pure compaction policies: messages and a budget in, a plan out, no I/O.

The request view is planned here from what one script read:

- the *protected* entries, sent whatever happens (system, developer and
  pinned messages);
- the cached summary, if any, standing in for everything up to its watermark;
- the *tail*: the newest entries after the watermark, read newest-first by
  the script until the budget was full.

A tool exchange (an assistant message that calls tools and every message
that answers those calls, parallel calls included) is kept or dropped as a
unit. After selection, pairs are checked by id in both directions: a result
whose call is not sent, and a call whose result is not sent, are removed, so
an orphan is never sent; each repair is reported.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "Entry",
    "SummaryText",
    "ViewPlan",
    "call_ids",
    "entry_order",
    "plan_view",
    "result_ids",
]


@dataclass(slots=True)
class Entry:
    """A stored message as the view sees it.

    Attributes:
        entry_id: Its stream entry id.
        message: The decoded message.
        tokens: Its tokens.
        preview: A smaller stand-in for a large tool result, or ``None``.
        preview_tokens: The stand-in's tokens.
        kind: ``"s"`` for system/developer, ``"p"`` for pinned, ``""`` otherwise.
    """

    entry_id: str
    message: dict[str, Any]
    tokens: int
    preview: dict[str, Any] | None = None
    preview_tokens: int = 0
    kind: str = ""

    @property
    def cheapest(self) -> int:
        """The fewest tokens this entry can be sent in."""
        return self.preview_tokens if self.preview is not None else self.tokens


@dataclass(frozen=True, slots=True)
class SummaryText:
    """A cached summary, already wrapped as a message.

    Attributes:
        message: The message to send in place of the summarized turns.
        tokens: Its tokens.
        covers_upto: The last entry id it covers.
    """

    message: dict[str, Any]
    tokens: int
    covers_upto: str


@dataclass(slots=True)
class ViewPlan:
    """The messages a view sends, and what was left out.

    Attributes:
        messages: The messages, in the order to send them.
        tokens: Their tokens (an upper bound after repairs).
        kept_ids: Entry ids sent, in order.
        dropped: Tail entries read but not sent.
        offloaded: Entry ids sent as a preview.
        repairs: One line per tool-pair repair.
        over_budget: True when the protected entries alone exceed the budget.
        summary_used: True when the summary was sent.
        protected_tokens: Tokens of the protected entries.
    """

    messages: list[dict[str, Any]] = field(default_factory=list)
    tokens: int = 0
    kept_ids: list[str] = field(default_factory=list)
    dropped: int = 0
    offloaded: list[str] = field(default_factory=list)
    repairs: list[str] = field(default_factory=list)
    over_budget: bool = False
    summary_used: bool = False
    protected_tokens: int = 0


def call_ids(message: dict[str, Any]) -> list[str]:
    """The tool call ids a message makes (OpenAI ``tool_calls`` and ``tool_use`` blocks)."""
    ids = [c["id"] for c in message.get("tool_calls") or () if isinstance(c, dict) and "id" in c]
    content = message.get("content")
    if isinstance(content, list):
        ids.extend(
            b["id"]
            for b in content
            if isinstance(b, dict) and b.get("type") == "tool_use" and "id" in b
        )
    return ids


def result_ids(message: dict[str, Any]) -> list[str]:
    """The tool call ids a message answers (``tool_call_id`` and ``tool_result`` blocks)."""
    ids = []
    if message.get("role") == "tool" and isinstance(message.get("tool_call_id"), str):
        ids.append(message["tool_call_id"])
    content = message.get("content")
    if isinstance(content, list):
        ids.extend(
            b["tool_use_id"]
            for b in content
            if isinstance(b, dict) and b.get("type") == "tool_result" and "tool_use_id" in b
        )
    return ids


def plan_view(
    protected: Sequence[Entry],
    summary: SummaryText | None,
    tail: Sequence[Entry],
    budget: int,
    *,
    complete: bool = False,
) -> ViewPlan:
    """Choose the messages of a request view.

    Args:
        protected: System, developer and pinned entries, oldest first.
        summary: The cached summary, or ``None``.
        tail: Entries after the summary's watermark, oldest first; usually
            only the newest ones, as many as the budget could hold.
        budget: Tokens available for everything returned.
        complete: True when ``tail`` reaches back to the summary's watermark
            (or the start of the history): a result whose call is not found
            then has no call at all.

    Returns:
        The plan. The tokens of what it sends never exceed ``budget`` unless
        the protected entries alone do; then ``over_budget`` is set and only
        they are sent.
    """
    plan = ViewPlan()
    protected_ids = {e.entry_id for e in protected}
    tail = [e for e in tail if e.entry_id not in protected_ids]
    plan.protected_tokens = sum(e.tokens for e in protected)
    if plan.protected_tokens > budget:
        plan.over_budget = True
        plan.dropped = len(tail)
        chosen: list[Entry] = []
        remaining = 0
    else:
        remaining = budget - plan.protected_tokens
        if summary is not None and summary.tokens <= remaining:
            plan.summary_used = True
            remaining -= summary.tokens
        outside = {cid for e in protected for cid in call_ids(e.message)}
        chosen = _select_tail(tail, remaining, outside, complete, plan)
        plan.dropped = len(tail) - len(chosen)
        remaining -= sum(e.cheapest for e in chosen)
        # Fill what is left with full tool results, newest first.
        for entry in reversed(chosen):
            if entry.preview is not None and entry.tokens - entry.preview_tokens <= remaining:
                remaining -= entry.tokens - entry.preview_tokens
                entry.preview = None
    cut = chosen[0].entry_id if chosen else None
    hoisted = [e for e in protected if cut is None or entry_order(e.entry_id) < entry_order(cut)]
    hoisted.sort(key=lambda e: e.kind != "s")  # system first; the sort is stable
    body = sorted(
        chosen + [e for e in protected if e not in hoisted], key=lambda e: entry_order(e.entry_id)
    )
    items: list[tuple[Entry | None, dict[str, Any]]] = [(e, _payload(e, plan)) for e in hoisted]
    if plan.summary_used and summary is not None:
        items.append((None, summary.message))
        plan.tokens += summary.tokens
    items.extend((e, _payload(e, plan)) for e in body)
    _repair_and_place(items, plan)
    return plan


def entry_order(entry_id: str) -> tuple[int, int]:
    """Sort key of a stream entry id: (milliseconds, sequence)."""
    ms, _, seq = entry_id.partition("-")
    return int(ms), int(seq or 0)


def _payload(entry: Entry, plan: ViewPlan) -> dict[str, Any]:
    if entry.preview is not None:
        plan.offloaded.append(entry.entry_id)
        plan.tokens += entry.preview_tokens
        return entry.preview
    plan.tokens += entry.tokens
    return entry.message


def _select_tail(
    tail: Sequence[Entry], budget: int, outside_calls: set[str], complete: bool, plan: ViewPlan
) -> list[Entry]:
    """The newest entries whose whole tool exchanges fit in ``budget``.

    Walking back from the newest entry, a result costs nothing until the
    message that made its call is reached; then the whole exchange is
    charged at once, so an exchange is kept whole or not at all. A result
    whose call is neither in ``tail`` nor in ``outside_calls`` belongs to an
    exchange that started before the tail: it is left out. When ``complete``
    (the tail reaches back to the start of what can be sent), no such call
    exists at all, and leaving the result out is reported as a repair.
    """
    owner = _call_owners(tail)
    left_out: set[int] = set()
    pending: dict[int, int] = {}  # index of a calling entry -> tokens of its later results
    used = 0
    start = len(tail)
    for index in range(len(tail) - 1, -1, -1):
        entry = tail[index]
        answers = result_ids(entry.message)
        owners = {owner[r] for r in answers if r in owner and owner[r] < index}
        cost = 0
        if owners:
            first = min(owners)
            pending[first] = pending.get(first, 0) + entry.cheapest
        elif answers and not any(r in owner or r in outside_calls for r in answers):
            left_out.add(index)
            if complete:
                plan.repairs.extend(f"dropped orphan result {r}" for r in answers)
        else:
            cost = entry.cheapest
        cost += pending.pop(index, 0)
        if used + cost > budget:
            break
        used += cost
        start = index
    chosen = []
    for index in range(start, len(tail)):
        if index in left_out:
            continue
        answers = result_ids(tail[index].message)
        if any(r in owner and owner[r] < start for r in answers):
            continue  # its call was cut: the exchange goes whole
        chosen.append(tail[index])
    return chosen


def _call_owners(entries: Iterable[Entry]) -> dict[str, int]:
    owner: dict[str, int] = {}
    for index, entry in enumerate(entries):
        for cid in call_ids(entry.message):
            owner.setdefault(cid, index)
    return owner


def _repair_and_place(items: list[tuple[Entry | None, dict[str, Any]]], plan: ViewPlan) -> None:
    """Remove orphans in both directions, then put results right after their call."""
    calls: set[str] = set()
    answered: set[str] = set()
    for _, message in items:
        calls.update(call_ids(message))
    kept: list[tuple[Entry | None, dict[str, Any]]] = []
    for entry, message in items:
        fixed = _strip_results(message, calls, answered, plan)
        if fixed is None:
            _uncount(entry, plan)
        else:
            kept.append((entry, fixed))
    final: list[tuple[Entry | None, dict[str, Any]]] = []
    for entry, message in kept:
        fixed = _strip_calls(message, answered, plan)
        if fixed is None:
            _uncount(entry, plan)
        else:
            final.append((entry, fixed))
    placed = _place_results(final)
    plan.messages = [m for _, m in placed]
    plan.kept_ids = [e.entry_id for e, _ in placed if e is not None]


def _uncount(entry: Entry | None, plan: ViewPlan) -> None:
    if entry is None:
        return
    if entry.entry_id in plan.offloaded:
        plan.offloaded.remove(entry.entry_id)
        plan.tokens -= entry.preview_tokens
    else:
        plan.tokens -= entry.tokens
    plan.dropped += 1


def _strip_results(
    message: dict[str, Any], calls: set[str], answered: set[str], plan: ViewPlan
) -> dict[str, Any] | None:
    """Drop results whose call is not sent, and second results for one call."""
    if message.get("role") == "tool" and isinstance(message.get("tool_call_id"), str):
        cid = message["tool_call_id"]
        if cid not in calls:
            plan.repairs.append(f"dropped orphan result {cid}")
            return None
        if cid in answered:
            plan.repairs.append(f"dropped duplicate result {cid}")
            return None
        answered.add(cid)
    content = message.get("content")
    if not isinstance(content, list):
        return message
    blocks = []
    changed = False
    for block in content:
        if isinstance(block, dict) and block.get("type") == "tool_result":
            cid = block.get("tool_use_id")
            if cid not in calls or cid in answered:
                kind = "orphan" if cid not in calls else "duplicate"
                plan.repairs.append(f"dropped {kind} result {cid}")
                changed = True
                continue
            answered.add(cid)
        blocks.append(block)
    if not changed:
        return message
    if not blocks:
        return None
    return {**message, "content": blocks}


def _strip_calls(
    message: dict[str, Any], answered: set[str], plan: ViewPlan
) -> dict[str, Any] | None:
    """Drop calls whose result is not sent; drop the message if nothing is left."""
    made = call_ids(message)
    missing = [cid for cid in made if cid not in answered]
    if not missing:
        return message
    for cid in missing:
        plan.repairs.append(f"dropped unanswered call {cid}")
    fixed = dict(message)
    gone = set(missing)
    if message.get("tool_calls"):
        left = [c for c in message["tool_calls"] if c.get("id") not in gone]
        if left:
            fixed["tool_calls"] = left
        else:
            del fixed["tool_calls"]
    content = message.get("content")
    content = message.get("content")
    if isinstance(content, list):
        content = [
            b
            for b in content
            if not (isinstance(b, dict) and b.get("type") == "tool_use" and b.get("id") in gone)
        ]
        fixed["content"] = content
    if not fixed.get("tool_calls") and not call_ids(fixed) and not content:
        return None
    return fixed


def _place_results(
    items: list[tuple[Entry | None, dict[str, Any]]],
) -> list[tuple[Entry | None, dict[str, Any]]]:
    """Move each answering message right after the message that made the call.

    Messages from several pods can interleave (a user message between a call
    and its result); providers require results to follow their call.
    """
    placed: list[tuple[Entry | None, dict[str, Any]]] = []
    taken = [False] * len(items)
    for index, (entry, message) in enumerate(items):
        if taken[index]:
            continue
        taken[index] = True
        placed.append((entry, message))
        made = set(call_ids(message))
        if not made:
            continue
        for later in range(index + 1, len(items)):
            if not taken[later] and made.intersection(result_ids(items[later][1])):
                taken[later] = True
                placed.append(items[later])
    return placed
