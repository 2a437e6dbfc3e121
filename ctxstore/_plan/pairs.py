"""Tool pairs in a view: match calls and results by id, strip the unmatched, place results.

A provider takes a message's results in the messages right after it, each
call id once. After the view has chosen its entries, :func:`pair` matches
each answering entry with one calling entry (both directions: a result
stored before its call, as when two pods race, is moved after it),
:func:`without_results` / :func:`without_calls` strip what is left unpaired,
and :func:`place` gives the order to send them in, keeping the stored order
when it is already valid. A reasoning item is tied to the item after it as a
call to its result (:func:`bind_ties`), so each of these keeps the two
together: sent both or neither. Pure functions over entries and message dicts.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from ctxstore._layout.codec import Entry
from ctxstore._layout.formats import (
    REASONING,
    REASONING_TIE,
    call_ids,
    item_type,
    result_id,
    result_ids,
)

__all__ = [
    "Pairs",
    "bind_ties",
    "chained",
    "in_place",
    "pair",
    "place",
    "without_calls",
    "without_results",
]


def bind_ties(entries: Sequence[Entry]) -> Sequence[Entry]:
    """``entries`` with each reasoning item's open tie answered by the entry after it.

    A reasoning item "calls" an id of its own (``REASONING_TIE``), which the
    item appended after it in the same batch "answers". One that ended its
    batch, or whose next item was popped or rewound away, calls an id nobody
    answers: the entry after it in the history, if any, answers it here (a
    copy of that entry, the others as they are). ``entries`` must be a run of
    the history in its order (a view's tail, a summary's entries); a tie left
    open (the reasoning item is the last one) stays an unanswered call, which
    the view does not send.
    """
    bound: list[Entry] | None = None
    for index in range(len(entries) - 1):
        entry = entries[index]
        if not entry.calls:
            continue
        after = entries[index + 1]
        ties = tuple(
            c for c in entry.calls if c.startswith(REASONING_TIE) and c not in after.results
        )
        if ties:
            if bound is None:
                bound = list(entries)
            bound[index + 1] = replace(after, results=after.results + ties)
    return entries if bound is None else bound


@dataclass(slots=True)
class Pairs:
    """How the calls and results of a view's items are paired (items by index)."""

    results: dict[int, list[str]] = field(default_factory=dict)
    """Per answering item, the results it keeps, in order."""
    calls: dict[int, set[str]] = field(default_factory=dict)
    """Per calling item, its calls that are answered."""
    caller: dict[int, int] = field(default_factory=dict)
    """Per answering item that keeps a result, the item whose calls it answers."""


def pair(items: Sequence[Entry | None], repairs: list[str]) -> Pairs:
    """Pair each call with one result, and each answering item with one calling item.

    A provider takes a message's results in the messages right after it, each
    call id once. So, in order, each answering item answers one calling item:
    of those making its ids, the nearest before it (an item stored before
    every call it answers, as when two pods race, answers the nearest after
    it and is moved after it). It keeps the results of that item's calls
    whose id is not answered yet, and loses the others: a result with no
    call sent (orphan), of an id answered already (duplicate), or of another
    calling item (one message answering two). A call left unanswered is
    removed: an id made twice (a message appended twice, say) is answered
    once, and its other calls are repeats. Each removal, and each move, is
    reported in ``repairs``.
    """
    makers: dict[str, list[int]] = {}  # call id -> the items making it, in order
    calling: list[tuple[int, Entry]] = []
    answering: list[int] = []
    for index, entry in enumerate(items):
        if entry is None:
            continue
        if entry.calls:
            calling.append((index, entry))
            for cid in entry.calls:
                makers.setdefault(cid, []).append(index)
        if entry.results:
            answering.append(index)
    pairs = Pairs()
    answered: set[str] = set()
    lost: dict[int, list[str]] = {}
    stored_first: list[int] = []

    def take(index: int, entry: Entry, caller: int | None) -> None:
        kept = pairs.results[index] = []
        for rid in entry.results:
            if caller is not None and rid not in answered and caller in makers.get(rid, ()):
                answered.add(rid)
                kept.append(rid)
                pairs.calls.setdefault(caller, set()).add(rid)
                continue
            if rid not in makers:
                why = f"dropped orphan result {rid}"
            elif rid in answered:
                why = f"dropped duplicate result {rid}"
            else:
                why = f"dropped result {rid} of a message answering two calling messages"
            lost.setdefault(index, []).append(why)
        if kept and caller is not None:
            pairs.caller[index] = caller

    for index in answering:
        entry = items[index]
        assert entry is not None
        nearest = -1  # the nearest item before it making one of its ids not answered yet
        for rid in entry.results:
            made = makers.get(rid)
            if made is None or made[0] > index or rid in answered:
                continue
            maker = made[-1] if made[-1] < index else made[bisect_left(made, index) - 1]
            nearest = max(nearest, maker)
        if nearest >= 0:
            take(index, entry, nearest)
        else:
            stored_first.append(index)
    moved = []
    answers = set(answering)
    for index in stored_first:
        entry = items[index]
        assert entry is not None
        after = [
            i
            for rid in entry.results
            if rid not in answered
            for i in makers.get(rid, ())
            if i > index and i not in answers  # no cycle: a caller after it answers nothing
        ]
        take(index, entry, min(after, default=None))
        if index in pairs.caller:
            moved.append(index)
    for index in sorted(lost):
        repairs.extend(lost[index])
    for index, entry in calling:
        done = pairs.calls.get(index, set())
        for cid in entry.calls:
            if cid in done:
                continue
            if cid.startswith(REASONING_TIE):
                repairs.append(f"dropped reasoning item {entry.entry_id}: no item after it is sent")
            else:
                repairs.append(
                    f"dropped {'repeated' if cid in answered else 'unanswered'} call {cid}"
                )
    repairs.extend(f"moved result {r} after its call" for i in moved for r in pairs.results[i])
    return pairs


def chained(items: Sequence[Entry | None], pairs: Pairs) -> set[int]:
    """The items of a run of Responses call items (``in_place``'s ``chained``), by index.

    A role-less item whose calls are answered; a reasoning item only when the
    item answering it (the one after it) is one too: a reasoning item that led
    to a message ends the run, so results of the calls before it are not sent
    after that message.
    """
    runs: set[int] = set()
    answer = {caller: index for index, caller in pairs.caller.items()}
    for index in range(len(items) - 1, -1, -1):
        entry = items[index]
        if entry is None or not pairs.calls.get(index):
            continue
        kind = item_type(entry.message)
        if kind is not None and (kind != REASONING or answer.get(index) in runs):
            runs.add(index)
    return runs


def place(count: int, caller: dict[int, int], chained: set[int]) -> Sequence[int]:
    """The order to send ``count`` items in: each answering item right after its caller.

    Answering items keep their order among themselves; every other item
    keeps its place. Items already in a valid order (see ``in_place``) keep
    it. Linear in the number of items.
    """
    if in_place(count, caller, chained):
        return range(count)
    answers: dict[int, list[int]] = {}
    for index in sorted(caller):
        answers.setdefault(caller[index], []).append(index)
    order: list[int] = []
    for index in range(count):
        if index in caller:
            continue  # placed with its caller
        if index not in answers:
            order.append(index)
            continue
        stack = [index]
        while stack:
            item = stack.pop()
            order.append(item)
            stack.extend(reversed(answers.get(item, ())))
    return order


def in_place(count: int, caller: dict[int, int], chained: set[int]) -> bool:
    """True when each answering item already follows its caller's group (the usual case).

    A group is the last item that answers nothing, or a run of Responses call
    items (``chained``: role-less items whose calls are answered), as the
    Responses API and the OpenAI Agents SDK send parallel calls: ``[call 1,
    call 2, output 1, output 2]``. A chat or Anthropic message's calls are one
    message, so its group is that message. A call item that answers the one
    before it (as one answers its reasoning item) joins that item's group.
    """
    group: set[int] = set()
    for index in range(count):
        owner = caller.get(index)
        if owner is None:
            if index in chained and index - 1 in group and index - 1 in chained:
                group.add(index)  # a parallel call, right after the one before
            else:
                group = {index}
        elif owner not in group:
            return False
        elif index in chained:
            group.add(index)  # a call item answering its reasoning: the group goes on
    return True


def without_results(message: dict[str, Any], keep: set[str]) -> dict[str, Any] | None:
    """The message with only its results for ``keep`` (each once); ``None`` if nothing is left."""
    if item_type(message) is not None:  # a Responses item answers one id: all or nothing
        return message if all(rid in keep for rid in result_ids(message)) else None
    own = message.get("tool_call_id") if message.get("role") == "tool" else None
    if isinstance(own, str) and own not in keep:
        return None
    content = message.get("content")
    if not isinstance(content, list):
        return message
    seen: set[str] = set()
    blocks = []
    for block in content:
        rid = result_id(block)
        if rid is not None:
            if rid not in keep or rid in seen:
                continue
            seen.add(rid)  # a block answering the message's own call is kept, once
        blocks.append(block)
    if blocks or seen or isinstance(own, str):  # a tool message answering its call stays
        return {**message, "content": blocks}
    return None


def without_calls(message: dict[str, Any], keep: set[str]) -> dict[str, Any] | None:
    """The message with only its calls for ``keep``; ``None`` if nothing is left to send.

    A Responses item makes one call, or none of its own (a reasoning item
    "calls" the item after it): unanswered, it is not sent.
    """
    if item_type(message) is not None:
        own = call_ids(message)
        return message if own and all(cid in keep for cid in own) else None
    fixed = dict(message)
    if message.get("tool_calls"):
        left = [c for c in message["tool_calls"] if c.get("id") in keep]
        if left:
            fixed["tool_calls"] = left
        else:
            del fixed["tool_calls"]
    content = message.get("content")
    if isinstance(content, list):
        # Anthropic's tool_use blocks, and the tool_call blocks Amplifier writes beside tool_calls.
        content = [
            b
            for b in content
            if not (
                isinstance(b, dict)
                and b.get("type") in ("tool_use", "tool_call")
                and b.get("id") not in keep
            )
        ]
        fixed["content"] = content
    if not fixed.get("tool_calls") and not call_ids(fixed) and not content:
        return None
    return fixed
