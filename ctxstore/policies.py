"""Pure compaction policies: entries and a budget in, a plan out, no I/O.

The request view is planned here from what one read returned:

- the *protected* entries, sent whatever happens (system, developer and
  pinned messages);
- the cached summary, if any, standing in for everything up to its watermark;
- the *tail*: the newest entries after the watermark, as many as the budget
  could hold.

A tool exchange (an assistant message that calls tools and every message
that answers those calls, parallel calls included) is kept or dropped as a
unit. After selection, pairs are checked by id in both directions: a result
whose call is not sent, and a call whose result is not sent, are removed, so
an orphan is never sent; each repair is reported.

Entries carry their tool call ids (stored beside the message at append), so
planning never parses a message; only the messages finally sent are decoded.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from pydantic_core import from_json

__all__ = [
    "ENTRY_PLACEHOLDER",
    "Entry",
    "SummaryText",
    "ViewPlan",
    "call_ids",
    "entry_order",
    "plan_view",
    "result_ids",
    "summary_chunks",
    "summary_cut",
]

ENTRY_PLACEHOLDER = "@@ctxstore-entry@@"
"""Stands for the entry id in a stored preview; filled in when it is decoded."""


@dataclass(slots=True)
class Entry:
    """A stored message as the view sees it; decoded only when it is sent.

    Attributes:
        entry_id: Its stream entry id.
        tokens: Its tokens.
        data: The message, as stored (JSON).
        calls: The tool call ids it makes.
        results: The tool call ids it answers.
        kind: ``"s"`` for system/developer, ``"p"`` for pinned, ``""`` otherwise.
        preview_data: A smaller stand-in for a large tool result (JSON), or ``None``.
        preview_tokens: The stand-in's tokens.
    """

    entry_id: str
    tokens: int
    data: bytes
    calls: tuple[str, ...] = ()
    results: tuple[str, ...] = ()
    kind: str = ""
    preview_data: bytes | None = None
    preview_tokens: int = 0
    _message: dict[str, Any] | None = field(default=None, repr=False)

    @classmethod
    def of(
        cls,
        entry_id: str,
        message: dict[str, Any],
        tokens: int,
        *,
        preview: dict[str, Any] | None = None,
        preview_tokens: int = 0,
        kind: str = "",
    ) -> Entry:
        """An entry built from a message dict (tests, and callers without stored bytes)."""
        return cls(
            entry_id,
            tokens,
            json.dumps(message).encode(),
            tuple(call_ids(message)),
            tuple(result_ids(message)),
            kind,
            None if preview is None else json.dumps(preview).encode(),
            preview_tokens,
            message,
        )

    @property
    def message(self) -> dict[str, Any]:
        """The decoded message (decoded once)."""
        if self._message is None:
            self._message = _decode(self.data)
        return self._message

    @property
    def preview(self) -> dict[str, Any] | None:
        """The decoded stand-in, naming this entry's id, or ``None``."""
        if self.preview_data is None:
            return None
        return _decode(
            self.preview_data.replace(ENTRY_PLACEHOLDER.encode(), self.entry_id.encode())
        )

    @property
    def cheapest(self) -> int:
        """The fewest tokens this entry can be sent in."""
        return self.preview_tokens if self.preview_data is not None else self.tokens


def _decode(data: bytes) -> dict[str, Any]:
    value = from_json(data)
    if not isinstance(value, dict):
        raise ValueError("a stored message is not a JSON object")
    return value


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
        tokens: Their tokens (an upper bound after repairs that strip a block).
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


def entry_order(entry_id: str) -> tuple[int, int]:
    """Sort key of a stream entry id: (milliseconds, sequence)."""
    ms, _, seq = entry_id.partition("-")
    return int(ms), int(seq or 0)


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
        chosen = _select_tail(tail, remaining, outside, complete, plan)
        remaining -= sum(e.cheapest for e in chosen)
        # Fill what is left with full tool results, newest first.
        for entry in reversed(chosen):
            extra = entry.tokens - entry.preview_tokens
            if entry.preview_data is not None and extra <= remaining:
                remaining -= extra
                full.add(entry.entry_id)
    plan.dropped = len(tail) - len(chosen)
    cut = entry_order(chosen[0].entry_id) if chosen else None
    hoisted = [e for e in protected if cut is None or entry_order(e.entry_id) < cut]
    hoisted.sort(key=lambda e: e.kind != "s")  # system first; the sort is stable
    inline = [e for e in protected if cut is not None and entry_order(e.entry_id) >= cut]
    body = sorted(chosen + inline, key=lambda e: entry_order(e.entry_id)) if inline else chosen
    items: list[Entry | None] = [*hoisted, None, *body] if plan.summary_used else [*hoisted, *body]
    # Protected entries always go whole: their full size is what was reserved.
    previewed = {e.entry_id for e in chosen if e.preview_data is not None} - full
    _repair_place_and_render(items, summary, previewed, protected_ids, plan)
    return plan


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
        cost = entry.preview_tokens if entry.preview_data is not None else entry.tokens
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


def _repair_place_and_render(
    items: list[Entry | None],
    summary: SummaryText | None,
    previewed: set[str],
    protected_ids: set[str],
    plan: ViewPlan,
) -> None:
    """Remove orphans in both directions, put results after their call, decode.

    ``None`` in ``items`` stands for the summary; entries in ``previewed``
    are sent as their preview.
    """
    sent_calls = {cid for e in items if e is not None for cid in e.calls}
    answered: set[str] = set()
    drop_results: dict[str, set[str]] = {}
    for entry in items:
        if entry is None:
            continue
        for rid in entry.results:
            if rid in sent_calls and rid not in answered:
                answered.add(rid)
                continue
            kind = "duplicate" if rid in answered else "orphan"
            plan.repairs.append(f"dropped {kind} result {rid}")
            drop_results.setdefault(entry.entry_id, set()).add(rid)
    drop_calls: dict[str, set[str]] = {}
    for entry in items:
        if entry is None:
            continue
        for cid in entry.calls:
            if cid not in answered:
                plan.repairs.append(f"dropped unanswered call {cid}")
                drop_calls.setdefault(entry.entry_id, set()).add(cid)

    rendered: list[tuple[Entry | None, dict[str, Any], tuple[str, ...], tuple[str, ...]]] = []
    for entry in items:
        if entry is None:
            assert summary is not None
            rendered.append((None, summary.message, (), ()))
            plan.tokens += summary.tokens
            continue
        if not entry.calls and not entry.results and entry.preview_data is None:
            plan.tokens += entry.tokens
            rendered.append((entry, entry.message, (), ()))
            continue
        as_preview = entry.entry_id in previewed
        message = entry.preview if as_preview else entry.message
        assert message is not None
        gone_results = drop_results.get(entry.entry_id)
        gone_calls = drop_calls.get(entry.entry_id)
        stripped: dict[str, Any] | None = message
        if gone_results:
            stripped = _without_results(message, gone_results)
        if stripped is not None and gone_calls:
            stripped = _without_calls(stripped, gone_calls)
        if stripped is None:
            if entry.entry_id not in protected_ids:
                plan.dropped += 1
            continue
        if as_preview:
            plan.offloaded.append(entry.entry_id)
            plan.tokens += entry.preview_tokens
        else:
            plan.tokens += entry.tokens
        calls, results = entry.calls, entry.results
        if gone_calls:
            calls = tuple(c for c in calls if c not in gone_calls)
        if gone_results:
            results = tuple(r for r in results if r not in gone_results)
        rendered.append((entry, stripped, calls, results))

    for entry, message, _, _ in _place_results(rendered):
        plan.messages.append(message)
        if entry is not None:
            plan.kept_ids.append(entry.entry_id)


def _without_results(message: dict[str, Any], gone: set[str]) -> dict[str, Any] | None:
    """The message without its results for ``gone`` calls; ``None`` if nothing is left."""
    if message.get("role") == "tool" and message.get("tool_call_id") in gone:
        return None
    content = message.get("content")
    if not isinstance(content, list):
        return message
    blocks = [
        b
        for b in content
        if not (
            isinstance(b, dict) and b.get("type") == "tool_result" and b.get("tool_use_id") in gone
        )
    ]
    return {**message, "content": blocks} if blocks else None


def _without_calls(message: dict[str, Any], gone: set[str]) -> dict[str, Any] | None:
    """The message without its ``gone`` calls; ``None`` if nothing is left to send."""
    fixed = dict(message)
    if message.get("tool_calls"):
        left = [c for c in message["tool_calls"] if c.get("id") not in gone]
        if left:
            fixed["tool_calls"] = left
        else:
            del fixed["tool_calls"]
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
    items: list[tuple[Entry | None, dict[str, Any], tuple[str, ...], tuple[str, ...]]],
) -> list[tuple[Entry | None, dict[str, Any], tuple[str, ...], tuple[str, ...]]]:
    """Move each answering message right after the message that made the call.

    Messages from several pods can interleave (a user message between a call
    and its result); providers require results to follow their call. Linear
    in the number of messages and results.
    """
    if _already_placed(items):
        return items
    answering: dict[str, list[int]] = {}
    for index, (_, _, _, results) in enumerate(items):
        for rid in results:
            answering.setdefault(rid, []).append(index)
    placed = []
    taken = [False] * len(items)
    for index, item in enumerate(items):
        if taken[index]:
            continue
        taken[index] = True
        placed.append(item)
        if not item[2]:
            continue
        later = sorted({j for cid in item[2] for j in answering.get(cid, ()) if j > index})
        for j in later:
            if not taken[j]:
                taken[j] = True
                placed.append(items[j])
    return placed


def _already_placed(
    items: list[tuple[Entry | None, dict[str, Any], tuple[str, ...], tuple[str, ...]]],
) -> bool:
    """True when every answering message already follows its call (the usual case)."""
    open_calls: frozenset[str] = frozenset()
    for _, _, calls, results in items:
        if results:
            if not open_calls.issuperset(results):
                return False
        else:
            open_calls = frozenset(calls)
    return True


def summary_cut(entries: Sequence[Entry], keep_tokens: int, open_window: int = 0) -> int:
    """How many of ``entries`` (oldest first, all after the watermark) a summary covers.

    At least ``keep_tokens`` stay raw at the end, and the cut never falls
    inside a tool exchange: a message that makes calls and every message
    answering them end up on the same side. A call not answered yet (a tool
    still running) holds the cut before it too, unless more than
    ``open_window`` tokens came after it (then it is taken as abandoned;
    views strip unanswered calls). Returns 0 when nothing may be covered.
    """
    used = 0
    cut = len(entries)
    while cut > 0 and used < keep_tokens:
        cut -= 1
        used += entries[cut].tokens
    if used < keep_tokens:
        return 0
    answered = {rid for e in entries for rid in e.results}
    after = 0
    for index in range(len(entries) - 1, -1, -1):
        if after > open_window:
            break
        if index < cut and any(cid not in answered for cid in entries[index].calls):
            cut = index  # a tool still running: its call stays raw
        after += entries[index].tokens
    earliest = _earliest_callers(entries)
    while cut > 0 and earliest[cut] < cut:
        cut = earliest[cut]  # keep the whole exchange raw
    return cut


def summary_chunks(entries: Sequence[Entry], limit: int) -> list[list[Entry]]:
    """Split ``entries`` into runs of at most ``limit`` tokens, between exchanges when possible.

    A run ends where no exchange spans the boundary; an exchange larger than
    ``limit`` gets a run of its own (split only if a single message is over).
    """
    earliest = _earliest_callers(entries)
    chunks: list[list[Entry]] = []
    start = 0
    while start < len(entries):
        end = start
        used = 0
        safe = start  # the last end at which no exchange is cut
        while end < len(entries) and (end == start or used + entries[end].tokens <= limit):
            used += entries[end].tokens
            end += 1
            if earliest[end] >= end:
                safe = end
        stop = safe if safe > start else end
        chunks.append(list(entries[start:stop]))
        start = stop
    return chunks


def _earliest_callers(entries: Sequence[Entry]) -> list[int]:
    """For each index i, the earliest calling entry of any result at or after i.

    ``len(entries)`` where there is none; the list has one extra slot at the end.
    """
    owner: dict[str, int] = {}
    for index, entry in enumerate(entries):
        for cid in entry.calls:
            owner.setdefault(cid, index)
    earliest = [len(entries)] * (len(entries) + 1)
    for index in range(len(entries) - 1, -1, -1):
        low = earliest[index + 1]
        for rid in entries[index].results:
            caller = owner.get(rid)
            if caller is not None and caller < low:
                low = caller
        earliest[index] = low
    return earliest
