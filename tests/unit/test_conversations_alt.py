"""The held-out corpus for the context-quality eval: sound, sized, varied, deterministic."""

from __future__ import annotations

import functools
import re
import sys
from collections import Counter
from typing import Any

import pytest
from support.config import REPO

# bench/ is not an installed package: the repository root goes first on sys.path.
sys.path.insert(0, str(REPO))

from bench import conversations
from bench import conversations_alt as alt
from bench.conversations_alt import (
    CORRECTION_MODES,
    DOMAINS,
    KINDS,
    Conversation,
    corpus,
    correction_modes,
    generate,
    style_of,
    text_of,
    verify,
)
from bench.eval import is_tool_result
from ctxstore import TiktokenCounter, count_message
from ctxstore.testing import orphans

SEEDS = (0, 1)


@functools.cache
def conversation(domain: str, seed: int) -> Conversation:
    return generate(domain, seed)


@functools.cache
def sizes(domain: str, seed: int) -> tuple[int, ...]:
    counter = TiktokenCounter()
    return tuple(count_message(counter, m) for m in conversation(domain, seed).messages)


def test_domains_are_new() -> None:
    """Six domains, none shared with the corpus the summarizer is tuned on."""
    assert len(DOMAINS) == 6
    assert not set(DOMAINS) & set(conversations.DOMAINS)
    assert KINDS == conversations.KINDS


@pytest.mark.parametrize("domain", DOMAINS)
def test_each_domain_is_sound(domain: str) -> None:
    """220-380 messages, 20-40 facts of every kind, 3-6 corrections, verify() passes."""
    for seed in SEEDS:
        conv = conversation(domain, seed)
        assert (conv.domain, conv.seed, conv.style) == (domain, seed, style_of(domain, seed))
        assert conv.messages[0]["role"] == "system"
        assert 220 <= len(conv.messages) <= 380
        assert 20 <= len(conv.facts) <= 40
        assert 3 <= sum(f.new_key is not None for f in conv.facts) <= 6
        assert {f.kind for f in conv.facts} == set(KINDS)
        assert {f.carrier for f in conv.facts} <= {"user", "assistant", "tool"}
        assert verify(conv) == []
        assert orphans(conv.messages) == 0
        for fact in conv.facts:
            assert fact.key.lower() in text_of(conv.messages[fact.index]).lower()
            if fact.new_key is not None:
                assert fact.old_key == fact.key
                assert fact.corrected_at is not None and fact.corrected_at > fact.index


@pytest.mark.parametrize("domain", DOMAINS)
def test_verify_passes_for_ten_seeds(domain: str) -> None:
    """Every seed from 0 to 9 yields a conversation whose keys occur only where allowed."""
    for seed in range(10):
        assert verify(generate(domain, seed)) == []


def test_generation_is_deterministic() -> None:
    """The same domain and seed give the same conversation; another seed does not."""
    again = generate("legal", 1)
    assert again == conversation("legal", 1)
    assert generate("legal", 2).messages != again.messages
    assert correction_modes("legal", 1) == correction_modes("legal", 1)
    again.messages.clear()  # a caller's change must not leak into the next call
    assert generate("legal", 1) == conversation("legal", 1)


def test_unknown_domain_is_refused() -> None:
    """A domain of the other corpus is not one of these."""
    with pytest.raises(ValueError, match="unknown domain"):
        generate("coding", 0)


def test_sizes_span_the_budgets() -> None:
    """About 25k to 120k tokens overall, on both sides of 64k; message sizes are realistic."""
    totals = [sum(sizes(d, s)) for d in DOMAINS for s in SEEDS]
    assert min(totals) >= 24_000
    assert max(totals) <= 125_000
    assert any(t > 64_000 for t in totals) and any(t < 64_000 for t in totals)
    chat: list[int] = []
    tool: list[int] = []
    for domain in DOMAINS:
        for seed in SEEDS:
            messages = conversation(domain, seed).messages
            assert max(sizes(domain, seed)) >= 3_000  # every one has a big dump
            for message, size in zip(messages[1:], sizes(domain, seed)[1:], strict=True):
                (tool if is_tool_result(message) else chat).append(size)
    assert sum(20 <= s <= 150 for s in chat) / len(chat) > 0.75
    assert sum(50 <= s <= 1_500 for s in tool) / len(tool) > 0.8


def test_both_formats_and_parallel_calls() -> None:
    """OpenAI format mostly, Anthropic for some; parallel tool calls and failed results occur."""
    convs = [conversation(d, s) for d in DOMAINS for s in SEEDS]
    styles = Counter(c.style for c in convs)
    assert styles["openai"] > styles["anthropic"] > 0
    for conv in convs:
        assert max(_calls(m) for m in conv.messages) >= 2
        blocks = {
            b.get("type")
            for m in conv.messages
            if isinstance(m["content"], list)
            for b in m["content"]
        }
        if conv.style == "anthropic":
            assert {"tool_use", "tool_result"} <= blocks
        else:
            assert not blocks and any(m["role"] == "tool" for m in conv.messages)
    anthropic = [c for c in convs if c.style == "anthropic"]
    assert any(
        b.get("is_error")
        for c in anthropic
        for m in c.messages
        if isinstance(m["content"], list)
        for b in m["content"]
    )


def _calls(message: dict[str, Any]) -> int:
    content = message.get("content")
    blocks = content if isinstance(content, list) else []
    return len(message.get("tool_calls") or ()) + sum(b["type"] == "tool_use" for b in blocks)


def test_corrections_come_in_every_mode() -> None:
    """Over two seeds every correction mode occurs; some corrections never name the old value."""
    modes = Counter(mode for d in DOMAINS for s in SEEDS for _, mode, _ in correction_modes(d, s))
    assert set(modes) == set(CORRECTION_MODES)
    silent = 0
    for domain in DOMAINS:
        for seed in SEEDS:
            conv = conversation(domain, seed)
            for fact in conv.facts:
                if fact.new_key is None or fact.corrected_at is None:
                    continue
                text = text_of(conv.messages[fact.corrected_at]).lower()
                silent += fact.key.lower() not in text
    assert silent >= 5


def test_facts_are_spread_over_carriers_and_positions() -> None:
    """Facts come from users, the assistant and tools, early, in the middle and late."""
    carriers: Counter[str] = Counter()
    thirds: Counter[int] = Counter()
    for conv in corpus(SEEDS):
        for fact in conv.facts:
            carriers[fact.carrier] += 1
            thirds[fact.index * 3 // len(conv.messages)] += 1
    assert all(carriers[c] >= 40 for c in ("user", "assistant", "tool"))
    assert all(thirds[t] >= 60 for t in (0, 1, 2))


def test_phrasing_differs_from_the_tuning_corpus() -> None:
    """No fact template of the tuning corpus shows up here, nor any four words of one."""
    ours = [t for group in alt._PLANT.values() for t in group]
    for table in (alt._FIX_PLAIN, alt._FIX_DECISION, alt._FIX_PREFERENCE, alt._FIX_CONSTRAINT):
        ours += [t for group in table.values() for t in group]
    theirs = [t for group in conversations._SAYS.values() for t in group]
    theirs += [t for group in conversations._FIXES.values() for t in group]
    theirs += list(conversations._DATE_FIXES) + list(conversations._PREFERENCE_FIXES)
    for table in (conversations._DECISION_FIXES, conversations._CONSTRAINT_FIXES):
        theirs += [t for group in table.values() for t in group]
    assert _grams(ours) and _grams(theirs)
    assert not _grams(ours) & _grams(theirs)
    openings = {t.split("{")[0].strip() for t in theirs}
    openings = {o for o in openings if len(o) >= 12}  # e.g. "Correcting myself:"
    text = "\n".join(text_of(conversation(d, 0).messages) for d in DOMAINS)
    assert openings
    assert not [o for o in openings if o in text]


def _grams(templates: list[str], n: int = 4) -> set[str]:
    """Every run of ``n`` words in the fixed text of ``templates`` (between fields)."""
    out: set[str] = set()
    for template in templates:
        for chunk in re.split(r"\{[^}]*\}", template):
            words = re.findall(r"[a-z']+", chunk.lower())
            out |= {" ".join(words[i : i + n]) for i in range(len(words) - n + 1)}
    return out
