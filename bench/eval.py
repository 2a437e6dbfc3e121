"""Context quality: how much of what a conversation established reaches the model.

Each generated conversation (:mod:`bench.conversations`: six domains, planted
facts and corrections) is replayed, message by message, through the real
store on real Redis, and a view is read before every assistant turn, as an
agent pod would. Three policies side by side, each on its own session, for
each budget (4,000, 16,000 and 64,000 tokens by default, ``model=None``):

- ``ctxstore``: the store as configured by default (background summaries on;
  a worker that keeps up is simulated in process: whenever a summary is due,
  ``store.summarize(session, LocalSummarizer())`` runs until no more is due);
- ``truncation``: the same store with summaries off
  (``summary_trigger_tokens=0``): the newest messages that fit;
- ``last10``: no store: the system messages and the last 10 messages (the
  start moved forward past tool results, so none is cut from its call).

Metrics, per policy and budget, micro-averaged over facts or views:

- **retention**: the share of planted facts whose key (for a corrected fact,
  its new key) is in the final view's text (case-insensitive); also by fact
  kind, by where the fact was planted (first, middle, last third) and by domain;
- **superseded-survives**: corrected facts whose old key is in the final view
  but whose new key is not (should be 0);
- **fill**: over the views of sessions whose history does not fit the budget,
  the mean of view tokens / budget (cl100k, as ``view.stats`` counts them);
- **cacheable**: the share of consecutive views where the previous view's
  messages are a prefix of the next's (byte-equal JSON per message), the
  providers' prompt-cache condition; also the looser share where the
  unchanged prefix holds at least half the previous view's tokens, and the
  mean share of each view's tokens that the previous view's prefix covers;
- **fitting cut**: of the views whose whole history fits the budget, the
  share that are not that history (byte-equal JSON per message, in order):
  a preview, a drop or a move where none was needed (should be 0);
- **cost per call**: the mean input cost of a view in uncached-token units,
  what the previous view's prefix covers at the cache-read price
  (``CACHE_READ_PRICE``, 0.1), the rest in full;
- **over budget** (``stats.tokens > stats.budget_cl100k`` with
  ``stats.over_budget`` unset) and **orphans** (tool calls or results sent
  without their other half): both must be 0;
- mean view tokens, summaries committed, and wall time.

Run it from the repository root::

    .venv/bin/python -m bench.eval                 # 2 seeds x 6 domains
    .venv/bin/python -m bench.eval --quick         # 1 conversation per domain
    .venv/bin/python -m bench.eval --budgets 8000 --seeds 3,4 --domains coding

It prints the tables (with ``rich`` when it is installed) and writes every
figure, per conversation too, to ``bench/results/eval.json``. The Redis is
``CTXSTORE_REDIS_URL`` when set, else 127.0.0.1:6379 when it answers, else
an embedded one; every key the run writes is under a prefix of its own
(``ctxeval-<hex>``) and is removed at the end: the server may be shared.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import json
import os
import platform
import sys
import time
import uuid
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from bench.conversations import DOMAINS, KINDS, Conversation, Fact, corpus, text_of
from ctxstore import ContextStore, LocalSummarizer, Settings, TiktokenCounter, count_message
from ctxstore.testing import orphans, redis_under_test, remove_keys

__all__ = [
    "DEFAULT_BUDGETS",
    "POLICIES",
    "Tally",
    "ViewSeries",
    "common_prefix",
    "evaluate",
    "is_tool_result",
    "last_messages",
    "main",
    "score_final",
]

POLICIES = ("ctxstore", "truncation", "last10")
"""The policies compared, in the order they are shown."""
STORE_POLICIES = ("ctxstore", "truncation")
DEFAULT_BUDGETS = (4_000, 16_000, 64_000)
DEFAULT_SEEDS = (0, 1)
QUICK_SEEDS = (0,)
LAST_N = 10
TENANT = "eval"
RESULTS = Path(__file__).resolve().parent / "results" / "eval.json"
POSITIONS = ("early", "middle", "late")


# -- scoring: pure functions -------------------------------------------------------------


def is_tool_result(message: dict[str, Any]) -> bool:
    """True for a message that answers tool calls (``role: tool``, or ``tool_result`` blocks)."""
    if message.get("role") == "tool":
        return True
    content = message.get("content")
    return isinstance(content, list) and any(
        isinstance(b, dict) and b.get("type") == "tool_result" for b in content
    )


def last_messages(messages: Sequence[dict[str, Any]], n: int = LAST_N) -> list[dict[str, Any]]:
    """The ``last10`` policy: every system message, then the last ``n`` messages.

    The window's start moves forward past tool results, so no result is sent
    without the call it answers (calls come before their results, so the
    window never holds a call without its results at a call point).
    """
    start = max(0, len(messages) - n)
    while start < len(messages) and is_tool_result(messages[start]):
        start += 1
    protected = [m for m in messages[:start] if m.get("role") in ("system", "developer")]
    return protected + list(messages[start:])


def position_of(fact: Fact, length: int) -> str:
    """Where a fact was planted: ``early``, ``middle`` or ``late`` third of the conversation."""
    return POSITIONS[min(2, fact.index * 3 // max(1, length))]


def common_prefix(before: Sequence[str], after: Sequence[str]) -> int:
    """How many leading items two sequences share (messages, as their JSON)."""
    shared = 0
    for a, b in zip(before, after, strict=False):
        if a != b:
            break
        shared += 1
    return shared


@dataclass
class Tally:
    """Counts behind every metric; tallies of runs add up into aggregates.

    Attributes:
        facts: Planted facts scored.
        retained: Of those, found in the final view (the new key when corrected).
        kinds: Facts per kind (``corrected`` counts corrected facts again).
        kinds_retained: Retained facts per kind.
        positions: Facts per third of the conversation they were planted in.
        positions_retained: Retained facts per third.
        corrected: Corrected facts.
        superseded: Corrected facts whose old key is in the final view and new one is not.
        fill_sum: Sum of view tokens / budget over views whose history does not fit.
        fill_views: Views whose history does not fit.
        pairs: Consecutive view pairs.
        strict: Pairs where the previous view is a prefix of the next.
        loose: Pairs where the shared prefix holds at least half the previous view's tokens.
        reuse_sum: Sum over pairs of shared-prefix tokens / next view tokens.
        growth_sum: Sum over strict pairs of the tokens the next view adds (what a
            model call adds to a view that only grows).
        fit_pairs: Pairs whose history fits the budget (the whole history is sent).
        fit_views: Views whose history fits the budget.
        fit_cut: Of those, views that are not the history itself (byte-equal JSON
            per message, in order): a preview, a drop or a move where none is needed.
        cost_sum: Sum over views of their input cost in uncached-token units: the
            tokens the previous view's prefix covers at the cache-read price
            (:data:`CACHE_READ_PRICE`), the rest at full price.
        views: Views read.
        view_tokens: Their tokens (as the store counts them).
        over_budget: Views over budget without ``stats.over_budget``.
        over_budget_recount: The same, with the view's tokens counted again here.
        overshoot: The largest excess over the budget, in either count (a maximum).
        orphans: Tool calls and results sent without their other half.
        summaries: Summaries committed.
        seconds: Wall time of the replays.
    """

    facts: int = 0
    retained: int = 0
    kinds: Counter[str] = field(default_factory=Counter)
    kinds_retained: Counter[str] = field(default_factory=Counter)
    positions: Counter[str] = field(default_factory=Counter)
    positions_retained: Counter[str] = field(default_factory=Counter)
    corrected: int = 0
    superseded: int = 0
    fill_sum: float = 0.0
    fill_views: int = 0
    pairs: int = 0
    strict: int = 0
    loose: int = 0
    reuse_sum: float = 0.0
    growth_sum: int = 0
    fit_pairs: int = 0
    fit_views: int = 0
    fit_cut: int = 0
    cost_sum: float = 0.0
    views: int = 0
    view_tokens: int = 0
    over_budget: int = 0
    over_budget_recount: int = 0
    overshoot: int = 0
    orphans: int = 0
    summaries: int = 0
    seconds: float = 0.0

    def add(self, other: Tally) -> None:
        """Add ``other``'s counts to these."""
        for f in fields(self):
            mine, theirs = getattr(self, f.name), getattr(other, f.name)
            if isinstance(mine, Counter):
                mine.update(theirs)
            elif f.name == "overshoot":
                self.overshoot = max(mine, theirs)
            else:
                setattr(self, f.name, mine + theirs)

    def summary(self) -> dict[str, Any]:
        """The metrics: shares in 0..1 (``None`` when nothing was measured), and counts."""
        return {
            "retention": _share(self.retained, self.facts),
            "superseded_survives": self.superseded,
            "fill": self.fill_sum / self.fill_views if self.fill_views else None,
            "cacheable": _share(self.strict, self.pairs),
            "cacheable_half": _share(self.loose, self.pairs),
            "prefix_reuse": self.reuse_sum / self.pairs if self.pairs else None,
            "growth_per_call": self.growth_sum / self.strict if self.strict else None,
            "fits_share": _share(self.fit_pairs, self.pairs),
            "fitting_cut": _share(self.fit_cut, self.fit_views),
            "cost_per_call": self.cost_sum / self.views if self.views else None,
            "over_budget": self.over_budget,
            "over_budget_recount": self.over_budget_recount,
            "overshoot_tokens": self.overshoot,
            "orphans": self.orphans,
            "mean_view_tokens": self.view_tokens / self.views if self.views else None,
            "summaries": self.summaries,
            "seconds": round(self.seconds, 2),
            "facts": self.facts,
            "corrected": self.corrected,
            "views": self.views,
            "views_truncating": self.fill_views,
            "by_kind": {
                k: _share(self.kinds_retained[k], self.kinds[k]) for k in (*KINDS, "corrected")
            },
            "by_position": {
                p: _share(self.positions_retained[p], self.positions[p]) for p in POSITIONS
            },
        }


def _share(part: int, whole: int) -> float | None:
    return part / whole if whole else None


CACHE_READ_PRICE = 0.1
"""A cached input token's price relative to an uncached one (the providers' cache reads)."""

FILL_TARGET = 0.85
"""The context-quality issue's budget fill, whenever the history does not fit."""


def cache_target(budget: int) -> float:
    """The issue's cacheable share for ``budget``: 90% at 4k, 95% at 16k, 98% at 64k."""
    return 0.90 if budget < 16_000 else 0.95 if budget < 64_000 else 0.98


def frontier(budget: int, growth: float, fits: float) -> tuple[float, float]:
    """What any view that only grows between cache breaks can reach on these conversations.

    A run of k views, each the previous one plus what a model call added
    (``growth`` tokens on average), ending full, averages ``budget - (k - 1) *
    growth / 2``; each run starts with one break. Pairs whose whole history
    fits (``fits``) are cacheable anyway. Returns the best cacheable share at
    :data:`FILL_TARGET`, and the best fill at :func:`cache_target`.
    """
    if growth <= 0:
        return 1.0, 1.0
    runs_of = 1 + 2 * (1 - FILL_TARGET) * budget / growth  # k at the fill target
    best_cache = fits + (1 - fits) * (1 - 1 / runs_of)
    needed = (cache_target(budget) - fits) / (1 - fits) if fits < 1 else 0.0
    if needed <= 0:
        return best_cache, 1.0
    runs = 1 / (1 - needed) if needed < 1 else float("inf")
    return best_cache, max(0.0, 1 - (runs - 1) * growth / (2 * budget))


def score_final(
    facts: Sequence[Fact], messages: Sequence[dict[str, Any]], length: int, tally: Tally
) -> list[dict[str, Any]]:
    """Score the final view against the planted facts; return the facts it lost.

    Args:
        facts: The conversation's facts.
        messages: The final view's messages.
        length: The conversation's length in messages (for the fact's position).
        tally: Where the counts go.

    Returns:
        One entry per fact not retained (and per superseded value that
        survived), for the JSON report.
    """
    text = text_of(list(messages)).lower()
    lost: list[dict[str, Any]] = []
    for fact in facts:
        kept = fact.current.lower() in text
        where = position_of(fact, length)
        tally.facts += 1
        tally.kinds[fact.kind] += 1
        tally.positions[where] += 1
        if kept:
            tally.retained += 1
            tally.kinds_retained[fact.kind] += 1
            tally.positions_retained[where] += 1
        if fact.new_key is not None:
            tally.corrected += 1
            tally.kinds["corrected"] += 1
            tally.kinds_retained["corrected"] += kept
            if not kept and fact.key.lower() in text:
                tally.superseded += 1
                lost.append({"kind": fact.kind, "key": fact.current, "superseded_by": fact.key})
                continue
        if not kept:
            lost.append({"kind": fact.kind, "key": fact.current, "index": fact.index})
    return lost


class ViewSeries:
    """Scores a replay's views one after the other: fill, prefixes, budget, orphans.

    Args:
        tally: Where the counts go.
        counter: Counts the tokens of each message sent (memoized by its JSON).
    """

    def __init__(self, tally: Tally, counter: TiktokenCounter) -> None:
        self.tally = tally
        self._counter = counter
        self._sizes: dict[str, int] = {}
        self._previous: list[str] | None = None
        self._previous_tokens: list[int] = []

    def add(
        self,
        messages: Sequence[dict[str, Any]],
        *,
        tokens: int | None,
        budget: int,
        history_tokens: int,
        flagged: bool = False,
        history: Sequence[dict[str, Any]] | None = None,
    ) -> None:
        """Score one view.

        Args:
            messages: The view's messages.
            tokens: Their tokens as the store counted them (``None``: count them here).
            budget: The budget, in the same (cl100k) tokens.
            history_tokens: The tokens of the whole history at this point.
            flagged: The store set ``stats.over_budget`` (its protected
                messages alone exceed the budget): not a violation.
            history: The whole history at this point, when known: a view of a
                history that fits and is not that history counts as cut.
        """
        dumps = [json.dumps(m, sort_keys=True, ensure_ascii=False) for m in messages]
        sizes = [self._size(d, m) for d, m in zip(dumps, messages, strict=True)]
        recount = sum(sizes)
        tokens = recount if tokens is None else tokens
        t = self.tally
        t.views += 1
        t.view_tokens += tokens
        if history_tokens > budget:
            t.fill_views += 1
            t.fill_sum += tokens / budget
        elif history is not None:
            t.fit_views += 1
            whole = [json.dumps(m, sort_keys=True, ensure_ascii=False) for m in history]
            t.fit_cut += dumps != whole
        if not flagged:
            t.over_budget += tokens > budget
            t.over_budget_recount += max(tokens, recount) > budget
            t.overshoot = max(t.overshoot, max(tokens, recount) - budget)
        t.orphans += orphans(messages)
        if self._previous is None:
            t.cost_sum += recount
        else:
            shared = common_prefix(self._previous, dumps)
            kept = sum(self._previous_tokens[:shared])
            t.cost_sum += recount - kept + CACHE_READ_PRICE * kept
            before = sum(self._previous_tokens)
            extends = shared == len(self._previous)
            t.pairs += 1
            t.strict += extends
            t.loose += 2 * kept >= before
            t.reuse_sum += kept / max(1, recount)
            t.fit_pairs += history_tokens <= budget
            if extends:
                t.growth_sum += recount - before
        self._previous, self._previous_tokens = dumps, sizes

    def _size(self, dump: str, message: dict[str, Any]) -> int:
        size = self._sizes.get(dump)
        if size is None:
            size = self._sizes[dump] = count_message(self._counter, message)
        return size


# -- replays -------------------------------------------------------------------------------


class _Worker:
    """A summary worker that keeps up: due jobs run in process, at once, until none is due."""

    def __init__(self) -> None:
        self.summarizer = LocalSummarizer()
        self.due: set[str] = set()

    async def on_due(self, tenant: str, session: str, generation: int) -> None:
        """The store's ``on_summary_due``: note the session instead of queueing a job."""
        self.due.add(session)

    async def catch_up(self, store: ContextStore, session: str, flagged: bool) -> int:
        """Run the session's summary jobs if one is due; return how many committed."""
        if not flagged and session not in self.due:
            return 0
        self.due.discard(session)
        committed = 0
        for _ in range(100):  # a bound, never reached: each job covers what is due
            outcome = await store.summarize(session, self.summarizer)
            committed += outcome.status == "committed"
            if not outcome.next_generation:
                break
        return committed


@dataclass
class _Run:
    """One replay's result: which conversation, policy and budget, its tally, what it lost."""

    conversation: Conversation
    policy: str
    budget: int
    tally: Tally
    lost: list[dict[str, Any]]

    def record(self) -> dict[str, Any]:
        summary = self.tally.summary()
        return {
            "domain": self.conversation.domain,
            "seed": self.conversation.seed,
            "policy": self.policy,
            "budget": self.budget,
            **{k: v for k, v in summary.items() if k not in ("by_kind", "by_position")},
            "lost": self.lost,
        }


async def _replay(
    store: ContextStore,
    worker: _Worker,
    policy: str,
    conversation: Conversation,
    budget: int,
    counter: TiktokenCounter,
) -> _Run:
    """Append the conversation to a fresh session, reading a view at every call point."""
    session = f"{conversation.domain}-s{conversation.seed}-{policy}-{budget}"
    tally = Tally()
    series = ViewSeries(tally, counter)
    points = set(conversation.call_points)
    final: list[dict[str, Any]] = []
    started = time.perf_counter()
    for index, message in enumerate(conversation.messages):
        result = await store.append(session, message)
        tally.summaries += await worker.catch_up(store, session, result.summary_due)
        if index in points:
            view = await store.view(session, token_budget=budget)
            stats = view.stats
            series.add(
                view.messages,
                tokens=stats.tokens,
                budget=stats.budget_cl100k,
                history_tokens=stats.history_tokens,
                flagged=stats.over_budget,
                history=conversation.messages[: index + 1],
            )
            final = view.messages
    tally.seconds = time.perf_counter() - started
    await store.delete(session)  # keep the shared server's memory down as the run goes
    lost = score_final(conversation.facts, final, len(conversation.messages), tally)
    return _Run(conversation, policy, budget, tally, lost)


def _replay_last(
    conversation: Conversation, sizes: Sequence[int], budget: int, counter: TiktokenCounter
) -> _Run:
    """The ``last10`` policy, computed without the store."""
    tally = Tally()
    series = ViewSeries(tally, counter)
    points = set(conversation.call_points)
    final: list[dict[str, Any]] = []
    started = time.perf_counter()
    history = 0
    for index, size in enumerate(sizes):
        history += size
        if index in points:
            final = last_messages(conversation.messages[: index + 1])
            series.add(
                final,
                tokens=None,
                budget=budget,
                history_tokens=history,
                history=conversation.messages[: index + 1],
            )
    tally.seconds = time.perf_counter() - started
    lost = score_final(conversation.facts, final, len(conversation.messages), tally)
    return _Run(conversation, "last10", budget, tally, lost)


async def evaluate(
    url: str,
    conversations: Sequence[Conversation],
    budgets: Sequence[int] = DEFAULT_BUDGETS,
    *,
    prefix: str | None = None,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Replay every conversation under every policy and budget; return the report.

    Args:
        url: The Redis to run on (it may be shared: only the run's keys are touched).
        conversations: The conversations.
        budgets: Token budgets of the views.
        prefix: The key prefix of the run (``ctxeval-<hex>`` by default); its
            keys are removed at the end, whatever happens.
        progress: Called with a line after each conversation.

    Returns:
        The report: ``settings``, ``conversations``, ``results`` (one per
        policy and budget, with ``by_kind``, ``by_position`` and
        ``by_domain``) and ``runs`` (one per conversation, policy and budget).
    """
    prefix = prefix or f"ctxeval-{uuid.uuid4().hex[:10]}"
    worker = _Worker()
    counter = TiktokenCounter()
    common: dict[str, Any] = {
        "redis_url": url,
        "key_prefix": prefix,
        "queue_name": f"{prefix}:summaries",
    }
    stores = {
        "ctxstore": ContextStore.from_settings(
            Settings(**common), tenant=TENANT, on_summary_due=worker.on_due
        ),
        "truncation": ContextStore.from_settings(
            Settings(**common, summary_trigger_tokens=0),
            tenant=TENANT,
            on_summary_due=worker.on_due,
        ),
    }
    runs: list[_Run] = []
    described: list[dict[str, Any]] = []
    started = time.perf_counter()
    try:
        for conversation in conversations:
            began = time.perf_counter()
            sizes = [count_message(counter, m) for m in conversation.messages]
            described.append(_describe(conversation, sizes))
            for budget in budgets:
                for policy in STORE_POLICIES:
                    runs.append(
                        await _replay(stores[policy], worker, policy, conversation, budget, counter)
                    )
                runs.append(_replay_last(conversation, sizes, budget, counter))
            if progress is not None:
                progress(
                    f"{conversation.domain}/{conversation.seed}: {sum(sizes):,} tokens, "
                    f"{len(conversation.messages)} messages, "
                    f"{len(budgets) * len(POLICIES)} runs in {time.perf_counter() - began:.1f}s"
                )
    finally:
        for store in stores.values():
            await store.aclose()
        await remove_keys(url, prefix)
    store_settings = stores["ctxstore"].settings
    return {
        "settings": {
            "budgets": list(budgets),
            "model": None,
            "summarizer": worker.summarizer.name,
            "summary_trigger_tokens": store_settings.summary_trigger_tokens,
            "summary_keep_tokens": store_settings.summary_keep_tokens,
            "summary_max_tokens": store_settings.summary_max_tokens,
            "offload_threshold_tokens": store_settings.offload_threshold_tokens,
            "last_n": LAST_N,
        },
        "seconds": round(time.perf_counter() - started, 2),
        "conversations": described,
        "results": _aggregate(runs, budgets),
        "runs": [run.record() for run in runs],
    }


def _describe(conversation: Conversation, sizes: Sequence[int]) -> dict[str, Any]:
    facts = conversation.facts
    return {
        "domain": conversation.domain,
        "seed": conversation.seed,
        "style": conversation.style,
        "messages": len(conversation.messages),
        "tokens": sum(sizes),
        "largest_message_tokens": max(sizes),
        "facts": len(facts),
        "corrections": sum(1 for f in facts if f.new_key is not None),
        "facts_by_kind": dict(Counter(f.kind for f in facts)),
        "call_points": len(conversation.call_points),
    }


def _aggregate(runs: Sequence[_Run], budgets: Sequence[int]) -> list[dict[str, Any]]:
    results = []
    for policy in POLICIES:
        for budget in budgets:
            mine = [r for r in runs if r.policy == policy and r.budget == budget]
            total = Tally()
            domains: dict[str, Tally] = {}
            for run in mine:
                total.add(run.tally)
                domains.setdefault(run.conversation.domain, Tally()).add(run.tally)
            summary = total.summary()
            summary["by_domain"] = {
                domain: {
                    k: v
                    for k, v in tally.summary().items()
                    if k not in ("by_kind", "by_position", "seconds")
                }
                for domain, tally in domains.items()
            }
            if summary["growth_per_call"] is not None and summary["fits_share"] is not None:
                best_cache, best_fill = frontier(
                    budget, summary["growth_per_call"], summary["fits_share"]
                )
                summary["best_cacheable_at_fill_target"] = best_cache
                summary["best_fill_at_cache_target"] = best_fill
            results.append({"policy": policy, "budget": budget, **summary})
    return results


# -- the report ------------------------------------------------------------------------------


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}%"


def _tables(report: dict[str, Any]) -> list[tuple[str, list[str], list[list[str]]]]:
    """The report's tables: (title, headers, rows)."""
    conversations = [
        [
            c["domain"],
            str(c["seed"]),
            c["style"],
            str(c["messages"]),
            f"{c['tokens']:,}",
            f"{c['largest_message_tokens']:,}",
            str(c["facts"]),
            str(c["corrections"]),
            str(c["call_points"]),
        ]
        for c in report["conversations"]
    ]
    main = [
        [
            r["policy"],
            f"{r['budget']:,}",
            _pct(r["retention"]),
            _pct(r["fill"]),
            _pct(r["cacheable"]),
            _pct(r["cacheable_half"]),
            _pct(r["prefix_reuse"]),
            _pct(r["fitting_cut"]),
            "-" if r["cost_per_call"] is None else f"{r['cost_per_call']:,.0f}",
            str(r["superseded_survives"]),
            str(r["orphans"]),
            str(r["over_budget"]),
            "-" if r["mean_view_tokens"] is None else f"{r['mean_view_tokens']:,.0f}",
            str(r["summaries"]),
            f"{r['seconds']:.1f}",
        ]
        for r in report["results"]
    ]
    results = report["results"]
    bounds = [
        [
            r["policy"],
            f"{r['budget']:,}",
            "-" if r["growth_per_call"] is None else f"{r['growth_per_call']:,.0f}",
            _pct(r["fits_share"]),
            _pct(r["fill"]),
            _pct(r["cacheable"]),
            _pct(r.get("best_cacheable_at_fill_target")),
            f"{100 * cache_target(r['budget']):.0f}%",
            _pct(r.get("best_fill_at_cache_target")),
        ]
        for r in results
        if r["policy"] != "last10"
    ]
    budgets = report["settings"]["budgets"]
    columns = [(p, b) for b in budgets for p in POLICIES]
    by = {(r["policy"], r["budget"]): r for r in results}
    counts: Counter[str] = Counter()
    for c in report["conversations"]:
        counts.update(c["facts_by_kind"])
        counts["corrected"] += c["corrections"]
    kinds = [
        [kind, str(counts[kind])] + [_pct(by[col]["by_kind"][kind]) for col in columns]
        for kind in (*KINDS, "corrected")
    ]
    kinds.append(["all", str(sum(counts[k] for k in KINDS))] + [
        _pct(by[col]["retention"]) for col in columns
    ])  # fmt: skip
    return [
        (
            "Conversations (tokens: cl100k)",
            [
                "domain",
                "seed",
                "format",
                "messages",
                "tokens",
                "largest",
                "facts",
                "corrections",
                "views",
            ],
            conversations,
        ),
        (
            "Context quality by policy and budget",
            [
                "policy",
                "budget",
                "retention",
                "fill",
                "cacheable",
                "cache>=half",
                "prefix reuse",
                "fitting cut",
                "cost / call",
                "superseded",
                "orphans",
                "over budget",
                "mean tokens",
                "summaries",
                "seconds",
            ],
            main,
        ),
        (
            "Fill against the prompt cache: the best any view that only grows between "
            f"cache breaks can do at this growth ({100 * FILL_TARGET:.0f}% fill targeted)",
            [
                "policy",
                "budget",
                "growth / call",
                "history fits",
                "fill",
                "cacheable",
                "best cacheable at fill target",
                "cache target",
                "best fill at it",
            ],
            bounds,
        ),
        (
            "Retention by fact kind",
            ["kind", "facts"] + [f"{p} {b // 1000}k" for p, b in columns],
            kinds,
        ),
    ]


def render_plain(report: dict[str, Any]) -> str:
    """The report's tables as plain text."""
    out: list[str] = []
    for title, headers, rows in _tables(report):
        widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]
        out += ["", title]
        out.append("  ".join(h.rjust(w) for h, w in zip(headers, widths, strict=True)))
        out.append("  ".join("-" * w for w in widths))
        out += ["  ".join(c.rjust(w) for c, w in zip(r, widths, strict=True)) for r in rows]
    return "\n".join(out)


def _print(report: dict[str, Any]) -> None:
    """Print the tables: with rich when it is installed, as plain text otherwise."""
    try:
        # Imported by name: rich is optional, and not one of the project's dependencies
        # (so the type checker must not need it).
        console_module: Any = importlib.import_module("rich.console")
        table_module: Any = importlib.import_module("rich.table")
    except ImportError:
        print(render_plain(report))
        return
    console = console_module.Console()
    if console.width < 160:  # piped output defaults to 80 columns: the tables are wider
        console = console_module.Console(width=160)
    for title, headers, rows in _tables(report):
        table = table_module.Table(title=title, title_justify="left")
        for i, header in enumerate(headers):
            table.add_column(header, justify="left" if i == 0 else "right")
        for row in rows:
            table.add_row(*row)
        console.print(table)


def _ints(text: str) -> list[int]:
    try:
        return [int(part.replace("_", "")) for part in text.split(",") if part.strip()]
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers: {text!r}") from exc


def _domains(text: str) -> list[str]:
    chosen = [d.strip() for d in text.split(",") if d.strip()]
    unknown = [d for d in chosen if d not in DOMAINS]
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown domains {unknown}; from {', '.join(DOMAINS)}")
    return chosen


def main(argv: Sequence[str] | None = None) -> None:
    """Parse the arguments, run the eval, print the tables and write the JSON report."""
    parser = argparse.ArgumentParser(
        prog="python -m bench.eval",
        description="Context quality: planted facts, budgets and policies, on real Redis.",
    )
    parser.add_argument("--quick", action="store_true", help="one conversation per domain (seed 0)")
    parser.add_argument(
        "--budgets",
        type=_ints,
        default=list(DEFAULT_BUDGETS),
        help="comma-separated token budgets (default: 4000,16000,64000)",
    )
    parser.add_argument(
        "--seeds", type=_ints, default=None, help="comma-separated seeds (default: 0,1)"
    )
    parser.add_argument(
        "--domains", type=_domains, default=list(DOMAINS), help="comma-separated domains"
    )
    parser.add_argument(
        "--json", type=Path, default=RESULTS, help=f"where to write the report ({RESULTS})"
    )
    args = parser.parse_args(argv)
    seeds = args.seeds if args.seeds is not None else QUICK_SEEDS if args.quick else DEFAULT_SEEDS
    if any(b <= 0 for b in args.budgets):
        parser.error("budgets must be positive")
    started = time.perf_counter()
    conversations = corpus(seeds, args.domains)
    generated = time.perf_counter() - started
    with redis_under_test() as (url, source):
        print(f"Redis: {source}; {len(conversations)} conversations", file=sys.stderr)
        report = asyncio.run(
            evaluate(
                url,
                conversations,
                args.budgets,
                progress=lambda line: print(line, file=sys.stderr, flush=True),
            )
        )
    report["run"] = {
        "seeds": list(seeds),
        "domains": list(args.domains),
        "quick": args.quick,
        "redis": source,
        "generation_seconds": round(generated, 2),
        "total_seconds": round(time.perf_counter() - started, 2),
        "python": platform.python_version(),
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
    }
    _print(report)
    print(
        f"\n{len(conversations)} conversations x {len(args.budgets)} budgets x "
        f"{len(POLICIES)} policies in {report['run']['total_seconds']:.1f}s "
        f"(generation {generated:.1f}s); report: {args.json}"
    )
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
