"""What metrics cost: append and view with metrics on against off, on the same server.

Two stores on one Redis, identical but for ``Settings.metrics`` (the one on
records to a registry of its own). Calls are timed alternately (which goes
first alternates too), so load on a shared server weighs on both alike;
figures are medians of sequential awaits.

- **append**: a ~200 B chat turn (its own session per store).
- **view**: ``view(session, token_budget=8000)`` of a 200-message session.

Target: on within 1.05x of off (median), for each. No tracer provider is
set, as in a pod without an OpenTelemetry SDK.

Every key is under a prefix of the run's own (``ctxbench-<hex>``), deleted at
the end: the server may be shared. Run it from the repository root::

    .venv/bin/python -m bench.metrics_bench [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import secrets
import statistics
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from prometheus_client import CollectorRegistry

from ctxstore import ContextStore, Settings
from ctxstore.testing import redis_under_test, remove_keys

TARGET = 1.05
"""The most ``on / off`` may be (median)."""


def turn(i: int) -> dict[str, Any]:
    role = "user" if i % 2 == 0 else "assistant"
    return {"role": role, "content": f"turn {i}: " + "the quick brown fox jumps " * 7}


Call = Callable[[], Awaitable[Any]]


def appender(store: ContextStore) -> Call:
    counter = iter(range(10**9))
    return lambda: store.append("appended", turn(next(counter)))


def viewer(store: ContextStore) -> Call:
    return lambda: store.view("viewed", token_budget=8000)


async def paired(on: Call, off: Call, samples: int) -> tuple[float, float]:
    """Median seconds of ``on`` and of ``off``, timed alternately."""
    times: dict[bool, list[float]] = {True: [], False: []}
    for i in range(samples):
        order = (True, False) if i % 2 == 0 else (False, True)
        for which in order:
            call = on if which else off
            started = time.perf_counter()
            await call()
            times[which].append(time.perf_counter() - started)
    return statistics.median(times[True]), statistics.median(times[False])


async def run(url: str, samples: int) -> bool:
    prefix = f"ctxbench-{secrets.token_hex(5)}"
    base = Settings(
        redis_url=url,
        key_prefix=prefix,
        queue_name=f"{prefix}:summaries",
        summary_trigger_tokens=0,
    )
    registry = CollectorRegistry()
    on = ContextStore.from_settings(base, tenant="bench", registry=registry)
    off = ContextStore.from_settings(base.model_copy(update={"metrics": False}), tenant="bench")
    ok = True
    try:
        for store in (on, off):
            await store.append_many("viewed", [turn(i) for i in range(200)])
            for i in range(50):  # warm up: connections, scripts
                await store.append("warm", turn(i))
                await store.view("viewed", token_budget=8000)
        rows = []
        figures: list[tuple[str, Call, Call]] = [
            ("append", appender(on), appender(off)),
            ("view", viewer(on), viewer(off)),
        ]
        for name, with_on, with_off in figures:
            with_metrics, without = await paired(with_on, with_off, samples)
            ratio = with_metrics / without
            ok &= ratio <= TARGET
            rows.append((name, with_metrics, without, ratio))
        print(f"{'':8}{'metrics on':>14}{'metrics off':>14}{'ratio':>8}  (target <= {TARGET}x)")
        for name, a, b, ratio in rows:
            verdict = "ok" if ratio <= TARGET else "OVER"
            print(f"{name:8}{a * 1e6:>11.0f} us{b * 1e6:>11.0f} us{ratio:>7.3f}x  {verdict}")
    finally:
        await on.aclose()
        await off.aclose()
        await remove_keys(url, prefix)
    return ok


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark; exit status 1 when a ratio is over the target."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="fewer samples: a smoke run")
    args = parser.parse_args(argv)
    samples = 300 if args.quick else 3000
    with redis_under_test() as (url, source):
        print(f"Redis: {source}; {samples} samples per figure")
        return 0 if asyncio.run(run(url, samples)) else 1


if __name__ == "__main__":
    sys.exit(main())
