"""Amplifier's call forms in request views: paired by id like the others, on real Redis.

Amplifier's orchestrators write a call in ``tool_calls`` as ``{"id", "tool",
"arguments"}`` and again as a ``tool_call`` content block, and its result as
a ``role: tool`` message. A view never sends one without the other, at any
budget, in a session that mixes them with OpenAI's and Anthropic's forms.
"""

from __future__ import annotations

from typing import Any

import pytest
from support.helpers import an_call, an_result, oa_call, oa_result, paired, turn, user

from ctxstore import ContextStore, count_message
from ctxstore.testing import orphans


def amp_call(*ids: str, text: str = "Looking.") -> dict[str, Any]:
    """An assistant message calling ``ids`` as loop-basic stores an Anthropic answer."""
    content: list[dict[str, Any]] = [
        {"type": "thinking", "thinking": "plan", "signature": "sig", "visibility": "internal"},
        {"type": "text", "text": text, "visibility": None},
    ]
    content += [
        {"type": "tool_call", "id": c, "name": "grep", "input": {"q": c}, "visibility": None}
        for c in ids
    ]
    calls = [{"id": c, "tool": "grep", "arguments": {"q": c}} for c in ids]
    return {"role": "assistant", "content": content, "tool_calls": calls}


def amp_result(cid: str, text: str = "a match") -> dict[str, Any]:
    """A tool result as loop-basic stores it."""
    return {"role": "tool", "tool_call_id": cid, "content": text}


def sent_calls(message: dict[str, Any]) -> tuple[list[str], list[str]]:
    """The ids in a message's tool_calls, and in its tool_call blocks."""
    content = message.get("content")
    blocks = (
        [b["id"] for b in content if b.get("type") == "tool_call"]
        if isinstance(content, list)
        else []
    )
    return [c["id"] for c in message.get("tool_calls") or ()], blocks


async def test_an_unanswered_amplifier_call_is_sent_neither_in_tool_calls_nor_as_a_block(
    store: ContextStore,
) -> None:
    """A turn cut short (one of two results stored): the answered call goes, the other is cut."""
    await store.append_many(
        "s", [user("check both"), amp_call("a", "b"), amp_result("a"), user("continue")]
    )
    view = await store.view("s", token_budget=5_000)
    assert [m["role"] for m in view.messages] == ["user", "assistant", "tool", "user"]
    assert sent_calls(view.messages[1]) == (["a"], ["a"])
    assert view.stats.repairs == ["dropped unanswered call b"]
    assert paired(view.messages) == 1
    assert view.stats.tokens == sum(count_message(store.counter, m) for m in view.messages)


async def test_an_amplifier_result_stored_before_its_call_is_sent_after_it(
    store: ContextStore,
) -> None:
    """Two pods racing store the result first: the view sends it right after its call."""
    await store.append_many("s", [user("go"), amp_result("a"), amp_call("a"), user("next")])
    view = await store.view("s", token_budget=5_000)
    assert [m["role"] for m in view.messages] == ["user", "assistant", "tool", "user"]
    assert view.stats.repairs == ["moved result a after its call"]
    assert paired(view.messages) == 1


MIXED = [
    user("start"),
    amp_call("amp1", "amp2"),
    amp_result("amp1", "x " * 40),
    amp_result("amp2"),
    turn(1),
    oa_call("oa1"),
    oa_result("oa1"),
    an_call("an1", "an2", text="two at once"),
    an_result("an1", "an2"),
    turn(2),
    {
        "role": "assistant",
        "content": "",
        "tool_calls": [{"id": "amp3", "tool": "read", "arguments": {"path": "a.py"}}],
    },
    {"role": "tool", "name": "read", "tool_call_id": "amp3", "content": "print('a')"},
    user("and now?"),
]


@pytest.mark.parametrize("budget", [15, 80, 130, 250, 300, 5_000])
async def test_every_budget_sends_whole_exchanges_of_every_form(
    store: ContextStore, budget: int
) -> None:
    """At each budget: no orphan, each result right after its call, counted as sent, in budget."""
    await store.append_many("s", MIXED)
    view = await store.view("s", token_budget=budget)
    assert orphans(view.messages) == 0, view.messages
    paired(view.messages)
    assert view.stats.tokens == sum(count_message(store.counter, m) for m in view.messages)
    assert view.stats.tokens <= budget
    for message in view.messages:
        made, blocked = sent_calls(message)
        assert not blocked or blocked == made  # a block is never sent without its entry
    if budget == 5_000:
        assert view.messages == MIXED
