"""Forks: their cost at 100, 1,000 and 10,000 messages, and their views against a plain one's.

Histories are the realistic agent conversations of :mod:`bench.conversations`,
back to back, summarized as a worker would keep them (a job whenever one is
due, by a stub summarizer that answers at once: the summaries' quality is not
what is measured here).

- **fork**: the first fork of a session (the one that may freeze the source's
  log) and the median of the next ones, each into a new session; the entries
  each copied into its own log (at most the bridge: ``bridge_tokens``, 48,000).
  A history shorter than the bridge is copied whole; past it, the cost
  stays put. Target: a fork at 10,000 messages within 1.5x the one at 1,000
  (medians): its cost follows the bridge, not the history.
- **view**: ``view(budget=16,000)`` of a fork against the same history in a
  plain session that was never forked, timed alternately, warm (the pod
  viewed it before) and cold (it did not). Target: the fork's within 1.25x.

Every key is under a prefix of the run's own, deleted at the end. Run it from
the repository root::

    .venv/bin/python -m bench.fork_bench [--quick]
"""

from __future__ import annotations

import secrets
import statistics
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from bench.conversations import DOMAINS, generate
from bench.runner import run_bench
from ctxstore import ContextStore, Settings
from ctxstore.models import Summary
from ctxstore.testing import remove_keys

FORK_TARGET = 1.5
"""The most a fork at 10,000 messages may cost against one at 1,000 (medians)."""
VIEW_TARGET = 1.25
"""The most a fork's view may cost against a plain session's (medians)."""
BUDGET = 16_000


class StubSummarizer:
    """Answers at once with a summary of about 600 tokens: the worker, minus the model."""

    name = "stub"

    async def summarize(
        self, previous: str | None, messages: Sequence[dict[str, Any]], *, max_tokens: int
    ) -> str:
        """The ledger alone (the one-level protocol)."""
        return "Ledger: " + "fact " * 150

    async def summarize_levels(
        self, previous: Summary | None, messages: Sequence[dict[str, Any]], **_: Any
    ) -> Summary:
        """The same ledger and narrative, whatever the messages."""
        return Summary("Ledger: " + "fact " * 150, "Narrative: " + "event " * 450)


def history(count: int) -> list[dict[str, Any]]:
    """``count`` messages of realistic conversations, back to back."""
    messages: list[dict[str, Any]] = []
    seed = 1
    while len(messages) < count:
        for domain in DOMAINS:
            messages += generate(domain, seed).messages
        seed += 1
    return messages[:count]


async def fill(store: ContextStore, session: str, messages: list[dict[str, Any]]) -> None:
    """Append in batches, summarizing whenever a summary is due, as a worker would."""
    for start in range(0, len(messages), 250):
        results = await store.append_many(session, messages[start : start + 250])
        if any(r.summary_due for r in results):
            await store.summarize(session, StubSummarizer())


async def alternated(
    a: Callable[[], Awaitable[Any]], b: Callable[[], Awaitable[Any]], calls: int
) -> tuple[float, float]:
    """Medians of ``a`` and ``b`` timed alternately (a noisy machine hits both alike)."""
    times: tuple[list[float], list[float]] = ([], [])
    for i in range(calls):
        for which in (0, 1) if i % 2 == 0 else (1, 0):
            started = time.perf_counter()
            await (a, b)[which]()
            times[which].append(time.perf_counter() - started)
    return statistics.median(times[0]), statistics.median(times[1])


async def measure(store: ContextStore, sizes: Sequence[int], quick: bool) -> list[float]:
    """A row per size; returns each size's fork p50 and then its warm view ratio."""
    for count in sizes:
        messages = history(count)
        await fill(store, f"s{count}", messages)
        await fill(store, f"plain{count}", messages)
    first: dict[int, tuple[float, Any]] = {}
    for count in sizes:
        started = time.perf_counter()
        made = await store.fork(f"s{count}", f"f{count}-0")
        first[count] = (time.perf_counter() - started, made)
    # Forks of every size in turn (a noisy machine hits them alike), each to a new session.
    times: dict[int, list[float]] = {count: [] for count in sizes}
    copied: dict[int, list[int]] = {count: [] for count in sizes}
    for i in range(10 if quick else 30):
        for count in [*sizes[i % len(sizes) :], *sizes[: i % len(sizes)]]:
            started = time.perf_counter()
            made = await store.fork(f"s{count}", f"f{count}-{i + 1}")
            times[count].append(time.perf_counter() - started)
            copied[count].append(made.copied)
    out: list[float] = []
    for count in sizes:
        fork_id, plain_id = f"f{count}-1", f"plain{count}"

        def view(session: str) -> Callable[[], Awaitable[Any]]:
            return lambda: store.view(session, token_budget=BUDGET)

        def cold(session: str) -> Callable[[], Awaitable[Any]]:
            async def run() -> Any:
                store._viewer.warm.discard(store.tenant, session)
                return await store.view(session, token_budget=BUDGET)

            return run

        for session in (fork_id, plain_id):
            await store.view(session, token_budget=BUDGET)  # the anchor is placed once
        calls = 100 if quick else 400
        warm_plain, warm_fork = await alternated(view(plain_id), view(fork_id), calls)
        cold_plain, cold_fork = await alternated(cold(plain_id), cold(fork_id), calls // 2)
        first_s, first_made = first[count]
        fork_p50 = statistics.median(times[count])
        shared = (await store.info(fork_id)).shared_messages
        warm_ratio, cold_ratio = warm_fork / warm_plain, cold_fork / cold_plain
        print(f"{count:>9,}{first_s * 1e3:>12.2f} ms{first_made.copied:>7,}"
              f"{fork_p50 * 1e3:>11.2f} ms{statistics.median(copied[count]):>7,.0f}{shared:>8,}"
              f"{warm_plain * 1e3:>9.2f} ms{warm_fork * 1e3:>8.2f} ms{warm_ratio:>7.2f}x"
              f"{cold_plain * 1e3:>9.2f} ms{cold_fork * 1e3:>8.2f} ms"
              f"{cold_ratio:>7.2f}x")  # fmt: skip
        out.append(fork_p50)
        out.append(warm_ratio)
    return out


async def run(url: str, quick: bool) -> bool:
    prefix = f"ctxbench-{secrets.token_hex(5)}"
    settings = Settings(redis_url=url, key_prefix=prefix)
    store = ContextStore.from_settings(settings, tenant="bench")
    try:
        print(f"{'history':>9}{'first fork':>15}{'copied':>7}{'fork p50':>14}{'copied':>7}"
              f"{'shared':>8}{'warm view: plain':>20}{'fork':>11}{'ratio':>8}"
              f"{'cold view: plain':>20}{'fork':>11}{'ratio':>8}")  # fmt: skip
        figures = await measure(store, (100, 1_000, 10_000), quick)
    finally:
        await store.aclose()
        await remove_keys(url, prefix)
    forks, views = figures[0::2], figures[1::2]
    ratio = forks[2] / forks[1]
    ok = ratio <= FORK_TARGET and max(views) <= VIEW_TARGET
    print(f"\nfork p50 at 10,000 messages / at 1,000: {ratio:.2f}x (target <= {FORK_TARGET}x); "
          f"warm fork view / plain view: {' '.join(f'{v:.2f}x' for v in views)} "
          f"(target <= {VIEW_TARGET}x) {'ok' if ok else 'OVER'}")  # fmt: skip
    return ok


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark; exit status 1 when a ratio is over its target."""
    return run_bench(run, __doc__, argv)


if __name__ == "__main__":
    sys.exit(main())
