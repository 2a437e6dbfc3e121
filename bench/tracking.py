"""What Redis's server-assisted client-side caching (``CLIENT TRACKING``) would cost an append.

The cost-per-turn issue asks to consider ``CLIENT TRACKING`` (RESP3) for hot
views. A pod that tracked what its views read would hear of another pod's
append by an invalidation message, but a view must still make a round trip
to be sure none is on its way (an append acknowledged to another pod may
not have reached this pod's socket yet), and that round trip is what a hot
view costs today (its two small reads beside it add little: see
``bench.turns``'s PING row). What tracking adds is on the write side: each
write of a tracked key sends every tracking pod an invalidation. This
benchmark measures that.

On a private Redis 7, one store appends ~1 KB messages one at a time to one
session; after each append, K reader connections read, one command at a
time, what a hot view after another's message reads (the session's counters
and its newest entry), with tracking off and on (RESP3, invalidations on
the reader's own connection), in alternating phases, each way first in
turn. Reported: the server's CPU (``INFO cpu``) per append and its K reads,
medians of the phases (what tracking adds is the invalidations the append
sends, and the reads' keeping of the tracking table), and the invalidations
the readers got.

Needs redis-py 6 or later (redis-py 5 drops a RESP3 connection when an
invalidation arrives). Run it from the repository root::

    .venv-sdk/bin/python -m bench.tracking      # make bench-tracking
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
from collections.abc import Sequence
from typing import Any

import redis
from redis.asyncio import Redis

from bench.bench import SHIPPED_CONF, conversation, private_redis
from bench.turns import server_counters
from ctxstore import ContextStore, Settings

SESSION = "tracked"


async def phase(
    store: ContextStore,
    raw: Redis,
    readers: Sequence[Any],  # redis-py 6+ clients: typed for the oldest redis-py checked
    keys: tuple[str, str],
    appends: int,
    tracking: bool,
) -> tuple[float, int]:
    """Server CPU (us) per append and its reads, and the invalidations the readers got."""
    meta, log = keys
    got = 0

    async def heard(_message: object) -> None:
        nonlocal got
        got += 1

    for reader in readers:
        await reader.execute_command("CLIENT", "TRACKING", "ON" if tracking else "OFF")
        connection = reader.connection
        assert connection is not None
        connection._parser.set_invalidation_push_handler(heard)
    messages = conversation(appends, 1024)
    cpu0, _ = await server_counters(raw)
    for message in messages:
        await store.append(SESSION, message)
        for reader in readers:
            await reader.hmget(meta, "epoch", "count")  # one connection: tracking is its own
            await reader.xrevrange(log, "+", "-", count=1)
    cpu1, _ = await server_counters(raw)
    return (cpu1 - cpu0) / appends * 1e6, got


async def compare(
    url: str, store: ContextStore, raw: Redis, count: int, appends: int, rounds: int
) -> tuple[float, float, int]:
    """Median server CPU without and with tracking for ``count`` readers, and the pushes."""
    keys = store.keys(SESSION)
    readers = [Redis.from_url(url, protocol=3, single_connection_client=True) for _ in range(count)]
    off: list[float] = []
    on: list[float] = []
    pushes = 0
    try:
        for round_ in range(rounds):
            # Each way first in turn: the session grows, and the machine drifts.
            for tracking in (False, True) if round_ % 2 == 0 else (True, False):
                cpu, got = await phase(
                    store, raw, readers, (keys.meta, keys.log), appends, tracking
                )
                (on if tracking else off).append(cpu)
                if not tracking and got:
                    raise RuntimeError(f"{got} invalidations with tracking off")
                if tracking and got < appends * count:  # each append invalidates each reader
                    raise RuntimeError(f"{got} invalidations, {appends * count} expected")
                pushes += got
    finally:
        for reader in readers:
            await reader.aclose()
    return statistics.median(off), statistics.median(on), pushes


async def run(readers_counts: Sequence[int], appends: int, rounds: int) -> None:
    """Alternate phases without and with tracking, for each number of readers."""
    with private_redis(SHIPPED_CONF) as (url, note):
        if url is None:
            print(f"skipped: {note}")
            return
        print(note)
        settings = Settings(redis_url=url, key_prefix="tracking", view_cache_bytes=0)
        raw = Redis.from_url(url)
        print(
            f"\n{'readers':>8}{'CPU us, no tracking':>24}{'tracking':>12}"
            f"{'added per reader':>20}{'invalidations':>16}"
        )
        try:
            async with ContextStore.from_settings(settings, tenant="bench") as store:
                for count in readers_counts:
                    a, b, pushes = await compare(url, store, raw, count, appends, rounds)
                    print(
                        f"{count:>8}{a:>24.1f}{b:>12.1f}{(b - a) / count:>20.1f}"
                        f"{pushes / (rounds * appends * count):>16.2f}"
                    )
        finally:
            await raw.aclose()


def main(argv: Sequence[str] | None = None) -> None:
    """Run the tracking benchmark."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--appends", type=int, default=500, help="appends per phase")
    parser.add_argument(
        "--rounds", type=int, default=8, help="phases each way (even: each way first as often)"
    )
    args = parser.parse_args(argv)
    if int(redis.__version__.split(".")[0]) < 6:
        print(
            f"skipped: redis-py {redis.__version__} drops a RESP3 connection on an "
            "invalidation; run it with redis-py 6 or later (.venv-sdk)"
        )
        return
    asyncio.run(run((1, 4, 16), args.appends, args.rounds))


if __name__ == "__main__":
    main()
