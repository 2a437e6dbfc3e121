"""Random conversations for ``plan_view``: tool calls of both styles, interleaved, lost, doubled."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hypothesis import strategies as st

from ctxstore._layout.codec import Entry, SummaryText
from ctxstore._layout.formats import call_ids, result_ids
from support.helpers import an_call, an_result, assistant, oa_call, oa_result, system, user


@dataclass
class Scenario:
    """A random conversation and what is passed to plan_view."""

    history: list[Entry]
    protected: list[Entry]
    summary: SummaryText | None
    tail: list[Entry]
    budget: int
    complete: bool


class _Ids:
    def __init__(self, ms: int) -> None:
        self.ms, self.seq = ms, -1

    def next(self, same_ms: bool) -> str:
        if same_ms and self.seq >= 0:
            self.seq += 1
        else:
            self.ms, self.seq = self.ms + 1, 0
        return f"{self.ms}-{self.seq}"


def is_result(message: dict[str, Any]) -> bool:
    return bool(result_ids(message))


def _preview_of(message: dict[str, Any]) -> dict[str, Any]:
    """A stand-in of a result message that answers the same calls."""
    if message.get("role") == "tool":
        return {**message, "content": "preview"}
    return {
        **message,
        "content": [
            {**b, "content": "preview"} if b.get("type") == "tool_result" else b
            for b in message["content"]
        ],
    }


@st.composite
def scenarios(draw: st.DrawFn) -> Scenario:
    """Random conversations, tool calls in both styles, interleaved, missing or doubled.

    Now and then a calling message is appended again (its call ids made twice),
    or one message answers calls of two calling messages.
    """
    ids = _Ids(draw(st.sampled_from([0, 997, 99_998])))
    small = st.integers(0, 30)
    messages: list[tuple[dict[str, Any], str]] = []  # (message, kind)
    for i in range(draw(st.integers(0, 2))):
        messages.append((system(f"rule {i}"), "s"))
    pending: list[dict[str, Any]] = []  # result messages not yet appended
    made: list[dict[str, Any]] = []  # the calling messages so far
    calls = 0

    def new_call() -> str:
        nonlocal calls
        calls += 1
        return f"call_{calls}"

    for _ in range(draw(st.integers(0, 16))):
        action = draw(
            st.sampled_from(
                ["user", "assistant", "openai", "anthropic", "openai", "anthropic", "flush"] * 2
                + ["system", "orphan", "again", "joint"]
            )
        )
        if action == "again" and made:  # appended twice (a retry under a new key, say)
            messages.append((made[draw(st.integers(0, len(made) - 1))], ""))
        elif action == "joint" and len(made) > 1:  # one message answering two callers
            pair = draw(
                st.lists(st.integers(0, len(made) - 1), min_size=2, max_size=2, unique=True)
            )
            both = [draw(st.sampled_from(call_ids(made[i]))) for i in pair]
            messages.append((an_result(*both), ""))
        elif action == "flush" and pending:
            messages.append((pending.pop(draw(st.integers(0, len(pending) - 1))), ""))
        elif action in ("user", "flush", "again", "joint"):
            messages.append((user(f"u{len(messages)}"), ""))
        elif action == "assistant":
            messages.append((assistant(f"a{len(messages)}"), ""))
        elif action == "system":
            messages.append((system("late rule"), "s"))
        elif action == "orphan":
            ghost = f"ghost_{len(messages)}"
            messages.append((draw(st.sampled_from([oa_result(ghost), an_result(ghost)])), ""))
        else:
            cids = [new_call() for _ in range(draw(st.integers(1, 3)))]
            results = []
            if action == "openai":
                made.append(oa_call(*cids, text=draw(st.sampled_from([None, "", "hm"]))))
                messages.append((made[-1], ""))
                for cid in cids:
                    copies = draw(st.sampled_from([1, 1, 1, 0, 2]))  # in flight, duplicated
                    results += [oa_result(cid, f"r{n}") for n in range(copies)]
            else:
                made.append(an_call(*cids, text=draw(st.sampled_from([None, "hm"]))))
                messages.append((made[-1], ""))
                answered = [c for c in cids if draw(st.integers(0, 4)) != 2]  # else in flight
                split = draw(st.integers(0, len(answered)))
                for part in (answered[:split], answered[split:]):
                    if part:
                        results.append(an_result(*part, text=draw(st.sampled_from([None, "+"]))))
            for result in results:  # answered at once, after another message, or later
                when = draw(st.sampled_from(["now", "now", "interleaved", "later"]))
                if when == "interleaved":
                    messages.append((user(f"u{len(messages)}, from another pod"), ""))
                if when == "later":
                    pending.append(result)
                else:
                    messages.append((result, ""))
    for message in pending:
        if draw(st.booleans()):  # else still in flight
            messages.append((message, ""))

    history = []
    for message, kind in messages:
        preview, preview_tokens = None, 0
        if is_result(message) and draw(st.booleans()):  # a large result, and its preview
            tokens = draw(st.integers(20, 120))
            preview, preview_tokens = _preview_of(message), draw(st.integers(1, 15))
        else:
            tokens = draw(small)
        if not kind and draw(st.integers(0, 14)) == 7:  # 0 is drawn far more often
            kind = "p"
        entry_id = ids.next(draw(st.booleans()))
        history.append(
            Entry.of(
                entry_id, message, tokens, preview=preview, preview_tokens=preview_tokens, kind=kind
            )
        )

    start = draw(st.integers(0, len(history)))
    tail = history[start:]
    protected = [e for e in history if e.kind]
    summary = None
    if start > 0 and draw(st.booleans()):
        summary = SummaryText(user("summary so far"), draw(small), history[start - 1].entry_id)
    complete = start == 0 or (summary is not None and draw(st.booleans()))
    floor = sum(e.tokens for e in protected)
    near = floor + (summary.tokens if summary else 0)
    full = sum(e.tokens for e in tail if not e.kind)
    cheap = sum(e.cheapest for e in tail if not e.kind)
    budget = draw(
        st.one_of(
            st.integers(floor, near + full + 10),
            st.integers(near + cheap // 2, near + full + 10),
            st.integers(near, near + cheap),  # where previews matter
            st.integers(max(0, near - 2), near + 2),  # around the summary's threshold
            st.integers(near + full, near + full + 20),  # everything fits
            st.integers(0, floor),  # below the protected floor: over budget
        )
    )
    return Scenario(history, protected, summary, tail, budget, complete)
