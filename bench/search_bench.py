"""History search: its latency at 1,000 and 10,000 messages, and what it costs appends.

Histories are the realistic agent conversations of :mod:`bench.conversations`
(chat, tool calls and results in three formats), back to back.

- **index**: building a session's whole index at once (what a worker or the
  first search does), and the index's memory beside the stream's.
- **search**: ``search(session, query, limit=5)`` on an up-to-date index, for
  queries naming planted facts (what they are about and their value):
  medians over every query, at 1,000 and 10,000 messages. A rare word's
  search (a planted name or error, found in a few entries) reads its few
  postings whatever the history's length; a common word's ("error") reads
  one posting per entry holding it, so it grows with its matches.
  ``get_entry`` (one round trip) is the floor beside them.
- **append**: an append to a session whose index is kept up to date (the
  worker's step every 20 appends, untimed) against one whose index is never
  built, timed alternately. Target: within 1.05x (median). Appends never
  touch the index, so this shows the index does not slow them down.

Every key is under a prefix of the run's own, deleted at the end. Run it
from the repository root::

    .venv/bin/python -m bench.search_bench [--quick]
"""

from __future__ import annotations

import secrets
import statistics
import sys
import time
from collections.abc import Sequence
from typing import Any

from bench.conversations import DOMAINS, generate, text_of
from bench.runner import run_bench
from ctxstore import ContextStore, Settings
from ctxstore._parts.search import terms
from ctxstore.testing import remove_keys

TARGET = 1.05
"""The most an append with indexing on may cost against off (median)."""


def history(count: int) -> tuple[list[dict[str, Any]], list[tuple[str, str]]]:
    """``count`` messages, and (query, key) pairs for facts planted in them with a rare key."""
    messages: list[dict[str, Any]] = []
    facts: list[tuple[str, str]] = []
    seed = 1
    while len(messages) < count:
        for domain in DOMAINS:
            conversation = generate(domain, seed)
            start = len(messages)
            messages += conversation.messages
            facts += [
                (f"{f.subject} {f.key}", f.key)
                for f in conversation.facts
                if start + f.index < count
            ]
        seed += 1
    messages = messages[:count]
    texts = [text_of(m).lower() for m in messages]
    rare = [(q, k) for q, k in facts if sum(k.lower() in t for t in texts) <= 3]
    return messages, rare


async def fill(store: ContextStore, session: str, messages: list[dict[str, Any]]) -> None:
    for start in range(0, len(messages), 500):
        await store.append_many(session, messages[start : start + 500])


async def median_of(calls: int, make: Any) -> float:
    times = []
    for i in range(calls):
        started = time.perf_counter()
        await make(i)
        times.append(time.perf_counter() - started)
    return statistics.median(times)


async def measure(store: ContextStore, raw: Any, count: int, quick: bool) -> None:
    """One row: index build, index size, search latencies and recall at ``count`` messages."""
    messages, facts = history(count)
    session = f"h{count}"
    await fill(store, session, messages)
    started = time.perf_counter()
    await store.index(session)
    build = time.perf_counter() - started
    keys = store.keys(session)
    index_mb = (await raw.memory_usage(keys.index) or 0) / 1e6
    stream_mb = (await raw.memory_usage(keys.log) or 0) / 1e6
    queries = facts[: 20 if quick else 80]
    found = 0
    for query, key in queries:
        for hit in await store.search(session, query, limit=5):
            entry = await store.get_entry(session, hit.entry_id)
            if entry is not None and key.lower() in text_of(entry.message).lower():
                found += 1
                break
    reps = 3 if quick else 10
    search = await median_of(
        len(queries) * reps, lambda i: store.search(session, queries[i % len(queries)][0])
    )
    word = next(k for _, k in facts if len(terms(k)) == 1 and not any(c.isdigit() for c in k))
    rare = await median_of(50 * reps, lambda i: store.search(session, word))
    common = await median_of(50 * reps, lambda i: store.search(session, "error"))
    first = (await store.tail(session, 1))[0].entry_id
    floor = await median_of(50 * reps, lambda i: store.get_entry(session, first))
    print(f"{count:>9,}{build:>11.2f} s{index_mb:>10.2f}{stream_mb:>11.2f}"
          f"{search * 1e3:>9.2f} ms{rare * 1e3:>8.2f} ms{common * 1e3:>10.2f} ms"
          f"{floor * 1e3:>8.2f} ms{found / len(queries):>8.0%}")  # fmt: skip


async def run(url: str, quick: bool) -> bool:
    prefix = f"ctxbench-{secrets.token_hex(5)}"
    settings = Settings(redis_url=url, key_prefix=prefix, summary_trigger_tokens=0)
    store = ContextStore.from_settings(settings, tenant="bench")
    raw = store._connection.client  # the same server, for MEMORY USAGE
    ok = True
    try:
        print(f"{'history':>9}{'index build':>13}{'index MB':>10}{'stream MB':>11}"
              f"{'search p50':>12}{'rare word':>11}{'common word':>13}{'get_entry':>11}"
              f"{'found@5':>9}")  # fmt: skip
        for count in (1_000, 10_000):
            await measure(store, raw, count, quick)

        samples = 400 if quick else 3000
        turn = {"role": "user", "content": "turn: " + "the quick brown fox jumps " * 7}
        await store.append_many("indexed", [turn] * 200)
        await store.append_many("plain", [turn] * 200)
        times: dict[str, list[float]] = {"indexed": [], "plain": []}
        for i in range(samples):
            for session in ("indexed", "plain") if i % 2 == 0 else ("plain", "indexed"):
                started = time.perf_counter()
                await store.append(session, turn)
                times[session].append(time.perf_counter() - started)
            if i % 20 == 19:
                await store.index("indexed")  # the worker's step, untimed
        on, off = statistics.median(times["indexed"]), statistics.median(times["plain"])
        ratio = on / off
        ok &= ratio <= TARGET
        verdict = "ok" if ratio <= TARGET else "OVER"
        print(f"\nappend p50: index kept up to date {on * 1e6:.0f} us, never built "
              f"{off * 1e6:.0f} us: {ratio:.3f}x (target <= {TARGET}x) {verdict}")  # fmt: skip
    finally:
        await store.aclose()
        await remove_keys(url, prefix)
    return ok


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark; exit status 1 when the append ratio is over the target."""
    return run_bench(run, __doc__, argv)


if __name__ == "__main__":
    sys.exit(main())
