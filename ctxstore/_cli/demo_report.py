"""What the demo shows once the pods are done: each history checked, then three acts.

- **The histories**: each session's stored messages against its scripted
  conversation: none lost, none doubled, every tool result after its call.
- **Recall**: the engineer's last question is about two rows of a large tool
  result that the view left out; the agent finds them with the recall tools
  (``search_history``, then ``read_entry``, a view read before each model
  call) and answers.
- **What the model gets**: the budgeted view for the next call; its makeup,
  no repair needed, and the line of its summary that still holds the
  maintenance window stated in the first message.
- **The prompt cache**: over every model call the pods made, what the input
  costs with prompt caching (:data:`CACHE_HIT` for the prefix the previous
  call of the session sent too, :data:`CACHE_WRITE` for the rest), for
  ctxstore's views and for plain truncation to the same budget.

The pure parts (:func:`cache_cost`, :func:`plain_truncation`) are tested
on their own.
"""

from __future__ import annotations

import hashlib
import json
import re
import textwrap
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ctxstore import (
    ContextStore,
    RecallTools,
    RequestView,
    StoredMessage,
    TiktokenCounter,
    count_message,
)
from ctxstore._cli.demo_story import Story
from ctxstore._layout.formats import call_ids, result_ids

__all__ = [
    "CACHE_HIT",
    "CACHE_WRITE",
    "Act",
    "CacheCost",
    "History",
    "ModelCall",
    "cache_cost",
    "check_history",
    "fingerprint",
    "plain_truncation",
    "show_cache",
    "show_recall",
    "show_view",
]

CACHE_HIT = 0.1
"""What an input token of a cached prefix costs, against an uncached one (Anthropic's prices)."""
CACHE_WRITE = 1.25
"""What an input token past the cached prefix costs: it is written to the cache."""
_INDENT = "   "
_ENTRY = re.compile(r"^- entry (\S+) \(tool\):", re.MULTILINE)
"""A search_history result's line for a hit in a tool result."""
_NEXT_PAGE = re.compile(r"read_entry offset=(\d+)\]$")
_SPAN = re.compile(r"characters (\d+) to (\d+) of (\d+)")


def fingerprint(message: dict[str, Any]) -> str:
    """A message's identity for the prompt cache: equal only for byte-equal messages."""
    data = json.dumps(message, sort_keys=True, ensure_ascii=False).encode()
    return hashlib.blake2b(data, digest_size=8).hexdigest()


@dataclass(frozen=True)
class ModelCall:
    """One model call a pod made: the input it sent, as the view gave it.

    Attributes:
        turn: The turn it was made in.
        step: Its place among the turn's model calls.
        messages: Each message sent, as ``(fingerprint, tokens)``.
        history: Messages in the session's history when the view was read.
        repairs: The view's tool-pair repairs (none, for well-formed appends).
    """

    turn: int
    step: int
    messages: tuple[tuple[str, int], ...]
    history: int
    repairs: tuple[str, ...] = ()


@dataclass(frozen=True)
class CacheCost:
    """What a series of model calls' input costs with prompt caching, per call on average.

    Attributes:
        calls: The model calls.
        tokens: Input tokens a call.
        cached: Of them, the tokens of the prefix the session's previous call sent too.
        cost: What a call's input costs, in uncached input tokens.
    """

    calls: int
    tokens: float
    cached: float
    cost: float


def cache_cost(sessions: Iterable[Sequence[Sequence[tuple[str, int]]]]) -> CacheCost:
    """The mean prompt-cache cost of model calls, each session's in order, as (fingerprint, tokens).

    A call's cached prefix is the run of leading messages equal to the
    previous call's (the providers' cache condition); its first call has none.
    """
    calls = tokens = cached = 0
    cost = 0.0
    for series in sessions:
        previous: Sequence[tuple[str, int]] = ()
        for messages in series:
            shared = 0
            for before, now in zip(previous, messages, strict=False):
                if before[0] != now[0]:
                    break
                shared += now[1]
            total = sum(size for _, size in messages)
            calls, tokens, cached = calls + 1, tokens + total, cached + shared
            cost += CACHE_HIT * shared + CACHE_WRITE * (total - shared)
            previous = messages
    if not calls:
        return CacheCost(0, 0.0, 0.0, 0.0)
    return CacheCost(calls, tokens / calls, cached / calls, cost / calls)


def plain_truncation(
    messages: Sequence[dict[str, Any]], sizes: Sequence[int], budget: int
) -> list[int]:
    """Plain truncation: the system messages, then the newest messages that fit ``budget``.

    Returns the indices kept. It stops at the first message that does not
    fit, and starts after any tool result at the front, so that no result
    is sent without its call.
    """
    system = [i for i, m in enumerate(messages) if m.get("role") == "system"]
    room = budget - sum(sizes[i] for i in system)
    start = len(messages)
    while start > 0 and (start - 1 in system or sizes[start - 1] <= room):
        start -= 1
        if start not in system:
            room -= sizes[start]
    while start < len(messages) and messages[start].get("role") == "tool":
        start += 1
    return [*(i for i in system if i < start), *range(start, len(messages))]


@dataclass
class History:
    """A session's stored history, checked against its scripted conversation.

    Attributes:
        stored: The messages as stored, in order.
        lost: Scripted messages not stored.
        doubled: Messages stored more than once.
        misordered: Tool results stored before their call.
    """

    stored: list[StoredMessage]
    lost: int
    doubled: int
    misordered: int

    @property
    def sound(self) -> bool:
        """Nothing lost, nothing doubled, every result after its call."""
        return self.lost == self.doubled == self.misordered == 0


async def check_history(store: ContextStore, story: Story) -> History:
    """Read the session's history and check it against the turns the pods played."""
    stored = [entry async for entry in store.iter_history(story.session)]
    scripted = Counter(fingerprint(m) for turn in story.turns for m in turn.messages)
    found = Counter(fingerprint(entry.message) for entry in stored)
    called: set[str] = set()
    misordered = 0
    for entry in stored:
        called.update(call_ids(entry.message))
        misordered += sum(answered not in called for answered in result_ids(entry.message))
    # Each scripted message is unique: a second copy, or any other message, is one too many.
    lost, doubled = sum((scripted - found).values()), sum((found - scripted).values())
    return History(stored, lost, doubled, misordered)


def _text(messages: Iterable[dict[str, Any]]) -> str:
    return "\n".join(str(m.get("content") or "") for m in messages)


def _window_line(text: str, window: str) -> str | None:
    """The first line of ``text`` naming both ends of the window (``02:00-04:00``)."""
    opens, closes = window.split()[1].split("-")
    return next((ln.strip() for ln in text.splitlines() if opens in ln and closes in ln), None)


@dataclass
class Act:
    """What an act found, for the demo's verdict and its test.

    Attributes:
        repairs: The repairs of the views it read (none, for well-formed appends).
        left_out: The view for the question held no row that answers it.
        rows: The rows recall found.
        fact: The line of the final view that holds the window, if any.
    """

    repairs: list[str] = field(default_factory=list)
    left_out: bool = False
    rows: list[str] = field(default_factory=list)
    fact: str | None = None


async def show_recall(store: ContextStore, story: Story, budget: int, act: Act) -> None:
    """Ask the last question and answer it as an agent loop would, through the recall tools.

    A view is read before each model call; the model's calls are the
    search for the role the page names, then the pages of the entry found
    until the rows appear.
    """
    w, session = story.world, story.session
    await store.append(session, story.question, idempotency_key="question")
    print(_wrap(f'the engineer: "{story.question["content"]}"'))
    view = await _view(store, session, budget, act)
    act.left_out = w.app not in _text(view.messages)
    held = "no row of the connection log (turn 3)" if act.left_out else "a row of it still"
    print(f"{_INDENT}the view for the answer ({view.stats.tokens:,} tokens) holds {held}")
    tools = RecallTools(store, session)
    found = await _tool(store, tools, session, "search_history", {"query": w.user})
    entry = _ENTRY.search(found)
    hits = found.splitlines()[0].split(",", 1)[0] if found else "no answer"
    named = f"; the tool result among them is entry {entry[1]}" if entry else ""
    print(f'{_INDENT}search_history("{w.user}"): {hits}{named}')
    offset: int | None = 0
    while entry is not None and offset is not None and not act.rows:
        await _view(store, session, budget, act)
        arguments = {"entry_id": entry[1]} | ({"offset": offset} if offset else {})
        page = await _tool(store, tools, session, "read_entry", arguments)
        span = _SPAN.search(page)
        read = f"characters {int(span[1]):,}-{int(span[2]):,}" if span else "it"
        read += f" of {int(span[3]):,}" if span and not offset else ""
        act.rows = [line for line in page.splitlines() if f",{w.user}," in line]
        rows = _count(len(act.rows), "row") if act.rows else "no row"
        more = f", offset {offset:,}" if offset else ""
        print(f"{_INDENT}read_entry({entry[1]}{more}): {read}, {rows} with {w.user}")
        following = _NEXT_PAGE.search(page)
        offset = int(following[1]) if following else None
    for row in act.rows:
        print(f"{_INDENT}   {row}")
    if act.rows:
        await _view(store, session, budget, act)
        answer = {"role": "assistant", "content": story.answer}
        await store.append(session, answer, idempotency_key="answer")
        print(_wrap(f"the agent: {story.answer}"))


async def show_view(store: ContextStore, story: Story, budget: int, act: Act) -> None:
    """Print the view for the next model call: its makeup, the window's line, plain truncation's."""
    w, counter = story.world, TiktokenCounter()
    stored = [entry async for entry in store.iter_history(story.session)]
    view = await _view(store, story.session, budget, act)
    st = view.stats
    summary = next((m for m in view.messages if str(m["content"]).startswith("<summary>")), None)
    parts, covered = ["the system prompt"], 0
    if summary is not None:
        ids = [entry.entry_id for entry in stored]
        covered = ids.index(st.summary_covers) + 1 if st.summary_covers in ids else 0
        tokens = count_message(counter, summary)
        parts.append(f"a summary of the first {covered} messages ({tokens:,} tokens)")
    raw = st.messages - len(parts)
    shown = "as a preview" if len(st.offloaded) == 1 else "as previews"
    previews = f" ({_count(len(st.offloaded), 'tool result')} {shown})" if st.offloaded else ""
    parts.append(f"the {raw} newest messages{previews}")
    repaired = _count(len(st.repairs), "repair") if st.repairs else "no repair needed"
    print(_wrap(f"{st.tokens:,} of {budget:,} tokens: {', '.join(parts)}; {repaired}"))
    stands = ""
    if summary is not None:
        summarized = min(st.dropped, covered - 1)  # the system prompt is sent, not summarized
        them = "them" if summarized == st.dropped else f"{summarized} of them"
        stands = f"the summary stands for {them}; "
    print(_wrap(f"{st.dropped} older messages are left out ({stands}search_history finds them)"))
    act.fact = _window_line(_text(view.messages), w.window)
    if act.fact is None:
        print(f"{_INDENT}the window ({w.window}), said in the first message, is not in it")
    else:
        where = "it"
        if summary is not None and act.fact in str(summary["content"]):
            where = "its summary"
        print(_wrap(f'the window, said in the first message, is still in {where}: "{act.fact}"'))
    messages = [entry.message for entry in stored]
    sizes = [count_message(counter, m) for m in messages]
    kept = plain_truncation(messages, sizes, budget)
    plain = (
        "the window is in them too"
        if _window_line(_text(messages[i] for i in kept), w.window)
        else "the window is not in them"
    )
    print(
        f"{_INDENT}plain truncation to the same budget keeps the {len(kept) - 1} newest messages "
        f"({sum(sizes[i] for i in kept):,} tokens): {plain}"
    )


async def _view(store: ContextStore, session: str, budget: int, act: Act) -> RequestView:
    """The view before a model call, its repairs noted."""
    view = await store.view(session, token_budget=budget)
    act.repairs += view.stats.repairs
    return view


async def _tool(
    store: ContextStore, tools: RecallTools, session: str, name: str, arguments: dict[str, Any]
) -> str:
    """Append a model's call of a recall tool; run it as an agent loop would; append its result."""
    call = {
        "id": f"call_recall_{name}_{arguments.get('offset', 0)}",
        "type": "function",
        "function": {"name": name, "arguments": json.dumps(arguments)},
    }
    await store.append(session, {"role": "assistant", "content": None, "tool_calls": [call]})
    result = await tools.run(call)
    if result is None:
        return ""
    await store.append(session, result)
    return str(result["content"])


def _count(n: int, thing: str) -> str:
    return f"{n} {thing}" if n == 1 else f"{n} {thing}s"


def _wrap(text: str) -> str:
    return textwrap.fill(
        text, 100, initial_indent=_INDENT, subsequent_indent=_INDENT + "  ", break_on_hyphens=False
    )


def show_cache(
    calls: dict[str, list[ModelCall]], histories: dict[str, History], budget: int
) -> tuple[CacheCost, CacheCost]:
    """Print what the pods' model calls' input costs, ctxstore's views against plain truncation."""
    counter = TiktokenCounter()
    ours, theirs = [], []
    for session, made in calls.items():
        messages = [entry.message for entry in histories[session].stored]
        sizes = [count_message(counter, m) for m in messages]
        prints = [fingerprint(m) for m in messages]
        ordered = sorted(made, key=lambda c: (c.turn, c.step))
        ours.append([c.messages for c in ordered])
        plain = (plain_truncation(messages[: c.history], sizes, budget) for c in ordered)
        theirs.append([tuple((prints[i], sizes[i]) for i in kept) for kept in plain])
    store_cost, plain_cost = cache_cost(ours), cache_cost(theirs)
    print(
        _wrap(
            f"{store_cost.calls} model calls, their input priced as Anthropic's prompt cache "
            f"prices it: {CACHE_HIT:g}x for the prefix the session's previous call sent too, "
            f"{CACHE_WRITE:g}x for the rest"
        )
    )
    for name, cost in (("ctxstore's views", store_cost), ("plain truncation", plain_cost)):
        share = cost.cached / cost.tokens if cost.tokens else 0.0
        print(
            f"{_INDENT}{name:<17} {cost.tokens:>6,.0f} tokens a call, {share:4.0%} of them cached: "
            f"billed as {cost.cost:>6,.0f} uncached tokens"
        )
    if store_cost.cost and plain_cost.cost:
        saved = 1 - store_cost.cost / plain_cost.cost
        more = store_cost.tokens / plain_cost.tokens - 1 if plain_cost.tokens else 0.0
        print(
            f"{_INDENT}with ctxstore's views a call's input costs {saved:.0%} less, "
            f"and holds {more:.0%} {'more' if more >= 0 else 'fewer'} tokens"
        )
    return store_cost, plain_cost
