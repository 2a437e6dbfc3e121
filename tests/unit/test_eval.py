"""The context-quality eval: its conversation generator, its scoring, one real run."""

from __future__ import annotations

import copy
import functools
import sys
import uuid
from typing import Any

import pytest
from redis.asyncio import Redis
from support.config import REPO

# bench/ is not an installed package, and pytest puts each test's folder (not the
# repository root) first on sys.path: the root goes first so ``bench`` is the repository's.
sys.path.insert(0, str(REPO))

from bench.conversations import (
    DOMAINS,
    KINDS,
    Conversation,
    Fact,
    call_points,
    generate,
    text_of,
    verify,
)
from bench.eval import (
    Tally,
    ViewSeries,
    common_prefix,
    evaluate,
    frontier,
    is_tool_result,
    last_messages,
    score_final,
)
from ctxstore import TiktokenCounter, count_message
from ctxstore.testing import orphans


@functools.cache
def conversation(domain: str, seed: int) -> Conversation:
    return generate(domain, seed)


@functools.cache
def tokens(domain: str, seed: int) -> int:
    counter = TiktokenCounter()
    return sum(count_message(counter, m) for m in conversation(domain, seed).messages)


@pytest.mark.parametrize("domain", DOMAINS)
def test_each_domain_is_sound(domain: str) -> None:
    """Every domain: 220-380 messages, 20-40 facts of every kind, 3-6 corrections, keys unique."""
    for seed in (0, 1):
        conv = conversation(domain, seed)
        assert conv.messages[0]["role"] == "system"
        assert 220 <= len(conv.messages) <= 380
        assert 20 <= len(conv.facts) <= 40
        assert 3 <= sum(f.new_key is not None for f in conv.facts) <= 6
        assert {f.kind for f in conv.facts} == set(KINDS)
        assert verify(conv) == []
        assert orphans(conv.messages) == 0
        for fact in conv.facts:
            assert fact.key.lower() in text_of(conv.messages[fact.index]).lower()


def test_generation_is_deterministic() -> None:
    """The same domain and seed give the same conversation; another seed does not."""
    again = generate("debugging", 1)
    assert again == conversation("debugging", 1)
    assert generate("debugging", 2).messages != again.messages


def test_sizes_span_the_budgets() -> None:
    """Across two seeds, conversations run from about 25k to 120k tokens, on both sides of 64k."""
    sizes = [tokens(domain, seed) for domain in DOMAINS for seed in (0, 1)]
    assert min(sizes) >= 25_000
    assert max(sizes) <= 125_000
    assert any(s > 64_000 for s in sizes) and any(s < 64_000 for s in sizes)


def test_both_formats_and_parallel_calls() -> None:
    """OpenAI and Anthropic formats both occur, and so do parallel tool calls."""
    convs = [conversation(domain, seed) for domain in DOMAINS for seed in (0, 1)]
    assert {c.style for c in convs} == {"openai", "anthropic"}
    for conv in convs:
        assert max(_calls(m) for m in conv.messages) >= 2
        kinds = {b.get("type") for m in conv.messages if isinstance(m["content"], list)
                 for b in m["content"]}  # fmt: skip
        if conv.style == "anthropic":
            assert {"tool_use", "tool_result"} <= kinds
        else:
            assert not kinds and any(m["role"] == "tool" for m in conv.messages)


def _calls(message: dict[str, Any]) -> int:
    """Tool calls an assistant message makes, in either format."""
    content = message.get("content")
    blocks = content if isinstance(content, list) else []
    return len(message.get("tool_calls") or ()) + sum(b["type"] == "tool_use" for b in blocks)


def test_call_points_precede_every_assistant_turn() -> None:
    """A view is read before every assistant message and after the last message."""
    conv = conversation("support", 0)
    assert conv.call_points == call_points(conv.messages)
    points = set(conv.call_points)
    assert len(conv.messages) - 1 in points
    for i, message in enumerate(conv.messages[1:], 1):
        assert (message["role"] == "assistant") == (i - 1 in points) or i == len(conv.messages)


def test_verify_catches_a_key_planted_twice() -> None:
    """A key found in a second message, or a new value before its correction, is reported."""
    conv = conversation("coding", 0)
    fact = next(f for f in conv.facts if f.new_key is None)
    leaked = copy.deepcopy(conv.messages)
    leaked[-1] = {"role": "user", "content": f"remember {fact.key}?"}
    assert any(fact.key in p for p in verify(_with(conv, leaked)))
    fixed = next(f for f in conv.facts if f.new_key is not None)
    early = copy.deepcopy(conv.messages)
    early[fixed.index] = {"role": "user", "content": f"it is {fixed.new_key}"}
    assert any(str(fixed.new_key) in p for p in verify(_with(conv, early)))


def _with(conv: Conversation, messages: list[dict[str, Any]]) -> Conversation:
    return Conversation(
        conv.domain, conv.seed, conv.style, messages, conv.facts, call_points(messages)
    )


def test_score_final_counts_retention_and_superseded_values() -> None:
    """Retention uses a corrected fact's new key; an old key alone counts as superseded."""
    facts = [
        Fact("number", "1,536", 1, "the batch size", "user"),
        Fact("path", "/etc/a.toml", 2, "the config", "tool"),
        Fact("date", "3 May", 3, "the review", "user", "3 May", "9 June", 5),
        Fact("name", "Ana Lind", 4, "the owner", "user", "Ana Lind", "Bo Berg", 6),
    ]
    view = [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": [{"type": "text", "text": "The batch size is 1,536."}]},
        {"role": "user", "content": "<summary>The review was on 3 MAY.</summary>"},
        {"role": "assistant", "content": "Owner: Ana Lind, now bo berg."},
    ]
    tally = Tally()
    lost = score_final(facts, view, 8, tally)
    assert (tally.facts, tally.retained, tally.corrected, tally.superseded) == (4, 2, 2, 1)
    assert tally.kinds_retained == {"number": 1, "name": 1, "corrected": 1}
    assert {entry["key"] for entry in lost} == {"/etc/a.toml", "9 June"}
    assert tally.summary()["retention"] == 0.5


def test_last_messages_keeps_system_and_whole_exchanges() -> None:
    """last10 sends system messages and never starts its window on a tool result."""
    messages: list[dict[str, Any]] = [{"role": "system", "content": "s"}]
    for i in range(4):
        messages += [
            {"role": "user", "content": f"q{i}"},
            {"role": "assistant", "content": None, "tool_calls": [_call(f"a{i}"), _call(f"b{i}")]},
            {"role": "tool", "tool_call_id": f"a{i}", "content": "x"},
            {"role": "tool", "tool_call_id": f"b{i}", "content": "y"},
        ]
    window = last_messages(messages)
    assert window[0]["role"] == "system"
    assert not is_tool_result(window[1])
    assert orphans(window) == 0
    assert len(window) <= 11
    assert last_messages(messages[:3]) == messages[:3]


def _call(call_id: str) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": "f", "arguments": "{}"}}


def test_view_series_scores_prefixes_fill_and_budget() -> None:
    """Strict prefixes, the half-prefix variant, fill and over-budget views are counted."""
    tally = Tally()
    series = ViewSeries(tally, TiktokenCounter())
    a = {"role": "user", "content": "alpha " * 50}
    b = {"role": "assistant", "content": "beta " * 10}
    c = {"role": "user", "content": "gamma"}
    series.add([a, b], tokens=90, budget=100, history_tokens=80)
    series.add([a, b, c], tokens=95, budget=100, history_tokens=200)
    series.add([a, c], tokens=120, budget=100, history_tokens=300)
    series.add([c], tokens=150, budget=100, history_tokens=400, flagged=True)
    assert (tally.views, tally.pairs, tally.strict, tally.loose) == (4, 3, 1, 2)
    assert tally.fill_views == 3
    assert tally.fill_sum == pytest.approx(0.95 + 1.2 + 1.5)
    assert tally.over_budget == 1
    assert common_prefix(["x", "y"], ["x", "z", "y"]) == 1
    counter = TiktokenCounter()
    assert tally.growth_sum == count_message(counter, c)  # the one strict pair grew by c
    assert tally.fit_pairs == 0  # every pair's history was past the budget


def test_the_frontier_is_what_views_that_only_grow_can_reach() -> None:
    """Runs that grow by g and end full: fill and cache trade off as the issue's targets can't."""
    # 4k, 200 tokens a call, no history that fits: 85% fill allows runs of 1 + 6.144 views,
    # so 86% cacheable; 90% cacheable needs runs of 10, which average 78% of the budget.
    best_cache, best_fill = frontier(4_096, 200, 0.0)
    assert best_cache == pytest.approx(1 - 1 / 7.144, abs=1e-3)
    assert best_fill == pytest.approx(1 - 9 * 200 / (2 * 4_096), abs=1e-3)
    # Pairs whose whole history fits are cacheable whatever the fill.
    assert frontier(4_096, 200, 0.5)[0] > best_cache
    assert frontier(4_096, 200, 0.5)[1] > best_fill
    # Small growth meets both; nothing but a fit is free.
    cache, fill = frontier(64_000, 100, 0.0)
    assert cache > 0.98 and fill > 0.85
    assert frontier(4_096, 0, 0.0) == (1.0, 1.0)


async def test_evaluate_on_real_redis(redis_url: str) -> None:
    """One conversation at one budget on real Redis: sound views, and no key left behind."""
    conv = conversation("planning", 2)  # the smallest of the first seeds
    prefix = f"ctxeval-test-{uuid.uuid4().hex[:8]}"
    report = await evaluate(redis_url, [conv], [4_000], prefix=prefix)
    results = {r["policy"]: r for r in report["results"]}
    assert set(results) == {"ctxstore", "truncation", "last10"}
    for policy in ("ctxstore", "truncation"):
        assert results[policy]["orphans"] == 0
        assert results[policy]["over_budget"] == 0
        assert results[policy]["views"] == len(conv.call_points)
        assert 0 <= results[policy]["retention"] <= 1
    assert results["truncation"]["summaries"] == 0
    assert report["conversations"][0]["tokens"] > 25_000
    client = Redis.from_url(redis_url)
    try:
        assert [k async for k in client.scan_iter(match=f"{prefix}*")] == []
    finally:
        await client.aclose()
