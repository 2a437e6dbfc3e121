"""Previews of large tool results: one budget per message, and only when smaller."""

from __future__ import annotations

import json
from typing import Any

from redis.asyncio import Redis

from ctxstore import ContextStore, Settings, TiktokenCounter, count_message
from ctxstore._plan.offload import make_preview

COUNTER = TiktokenCounter()
LINE = "line of log output with details\n"


def results_message(texts: list[str]) -> dict[str, Any]:
    """A user message answering one tool call per text (Anthropic style)."""
    return {
        "role": "user",
        "content": [
            {"type": "tool_result", "tool_use_id": f"c{i}", "content": text}
            for i, text in enumerate(texts)
        ],
    }


def preview_of(message: dict[str, Any], *, preview_tokens: int) -> tuple[dict[str, Any], int]:
    """The preview of ``message`` (threshold 100), decoded, and its tokens."""
    tokens = count_message(COUNTER, message)
    made = make_preview(message, tokens, COUNTER, threshold=100, preview_tokens=preview_tokens)
    assert made is not None
    data, counted = made
    assert counted < tokens
    return json.loads(data), counted


def kept_chars(text: str) -> int:
    """Characters of a shortened text that are the original's: all but the note."""
    if "[ctxstore:" not in text:
        return len(text)
    note = text[text.index("\n\n[ctxstore:") : text.rindex("]\n\n") + 3]
    return len(text) - len(note)


def test_one_large_result_keeps_about_preview_tokens() -> None:
    """A single large result keeps about preview_tokens of head and tail."""
    message = results_message([LINE * 600])
    preview, _ = preview_of(message, preview_tokens=100)
    text = preview["content"][0]["content"]
    assert "not shown" in text
    assert kept_chars(text) <= 100 * len(LINE * 600) / count_message(COUNTER, message)


def test_the_preview_budget_is_per_message_not_per_result() -> None:
    """Twenty large results share one preview budget: the kept text stays within it."""
    message = results_message([LINE * 300] * 20)
    tokens = count_message(COUNTER, message)
    preview, counted = preview_of(message, preview_tokens=200)
    texts = [block["content"] for block in preview["content"]]
    assert all("not shown" in text for text in texts)
    budget = 200 * len(LINE * 300) * 20 / tokens  # preview_tokens, in characters
    assert sum(kept_chars(text) for text in texts) <= budget
    # Per result, each kept 200 tokens: over 4,000 in all, notes aside.
    assert counted < 20 * 200 / 2


def test_small_results_are_kept_whole_and_leave_their_share_to_the_large() -> None:
    """A result under its share is sent whole; the large one gets what it left."""
    short = "exit code 0"
    preview, _ = preview_of(results_message([short, LINE * 600]), preview_tokens=100)
    assert preview["content"][0]["content"] == short
    assert "not shown" in preview["content"][1]["content"]


def test_no_preview_when_it_would_not_be_smaller() -> None:
    """Many short results over the threshold: the 'preview' would be the message: None."""
    for message in (
        results_message(["a short tool answer of a few words"] * 40),
        {
            "role": "tool",
            "tool_call_id": "c",
            "content": [{"type": "text", "text": "a few words here"}] * 40,
        },
    ):
        tokens = count_message(COUNTER, message)
        assert tokens > 100
        assert make_preview(message, tokens, COUNTER, threshold=100, preview_tokens=10) is None


async def test_a_message_with_no_smaller_preview_is_stored_without_one(
    settings: Settings, tenant: str, raw_redis: Redis
) -> None:
    """The store keeps no stand-in equal to the message, and views send it whole."""
    small = settings.model_copy(
        update={"offload_threshold_tokens": 100, "offload_preview_tokens": 10}
    )
    call = {"id": "c", "type": "function", "function": {"name": "ls", "arguments": "{}"}}
    answer = {
        "role": "tool",
        "tool_call_id": "c",
        "content": [{"type": "text", "text": "a few words here"}] * 40,
    }
    async with ContextStore.from_settings(small, tenant=tenant) as store:
        results = await store.append_many(
            "s",
            [
                {"role": "user", "content": "list it"},
                {"role": "assistant", "content": None, "tool_calls": [call]},
                answer,
            ],
        )
        ((_, fields),) = await raw_redis.xrange(
            store.keys("s").log, results[2].entry_id, results[2].entry_id
        )
        assert b"v" not in fields and b"vt" not in fields
        view = await store.view("s", token_budget=10_000)
        assert view.messages[-1] == answer and view.stats.offloaded == []
