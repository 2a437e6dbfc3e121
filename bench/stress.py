"""Stress: many writers over one session and over 100, with replaces and views racing.

For each configuration (1, 4, 16 and 64 concurrent writers; over 1 session and
over 100), writer tasks spread over up to 4 processes append tool-using
turns, while in each process a viewer reads request views and a rewriter
replaces or clears sessions. Then every session is audited against what the
writers were told (:func:`ctxstore.testing.audit`): lost, duplicated and
out-of-order appends, and views holding an orphan tool call or result, must
all be 0.

Run: ``make stress`` (``python -m bench.stress [--quick]``). Uses
``CTXSTORE_REDIS_URL``, else 127.0.0.1:6379 if it answers, else an embedded
Redis; writes only keys under its own prefix (its summary jobs go to a queue of
its own), and removes them with arq's keys of its jobs.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import random
import statistics
import sys
import time
import uuid
from collections import Counter
from typing import Any

from ctxstore import ContextStore, Settings, WriteResult
from ctxstore.testing import Ack, audit, orphans, redis_under_test, remove_keys, stop_processes

MAX_PROCESSES = 4


def turn(writer: int, index: int) -> list[dict[str, Any]]:
    """One writer's turn: a user message, a tool call and its result, an answer."""
    call = f"c{writer}-{index}"
    tag = json.dumps({"w": writer, "i": index})
    return [
        {"role": "user", "content": f"{tag} please check"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": call, "type": "function", "function": {"name": "grep", "arguments": "{}"}}
            ],
        },
        {"role": "tool", "tool_call_id": call, "content": "match at line 12\n" * 20},
        {"role": "assistant", "content": "found it"},
    ]


def writer_key(message: dict[str, Any]) -> tuple[int, int] | None:
    """(writer, index) of a stress message's user turn."""
    if message.get("role") != "user" or not isinstance(message.get("content"), str):
        return None
    head = message["content"].split(" please", 1)[0]
    if not head.startswith("{"):
        return None
    body = json.loads(head)
    return body["w"], body["i"]


async def process_main(
    url: str,
    prefix: str,
    tenant: str,
    writers: list[int],
    sessions: list[str],
    turns: int,
    rewrites: bool,
) -> dict[str, Any]:
    """One process: its writer tasks, a viewer and (maybe) a rewriter; report what happened."""
    settings = run_settings(url, prefix, retry_attempts=10)
    acks: list[tuple[str, Ack]] = []
    rewrite_results: list[tuple[str, WriteResult]] = []
    view_ms: list[float] = []
    bad_views = 0
    done = asyncio.Event()
    async with ContextStore.from_settings(settings, tenant=tenant) as store:

        async def write(writer: int) -> None:
            rng = random.Random(writer)
            for index in range(turns):
                session = sessions[rng.randrange(len(sessions))]
                user, *rest = turn(writer, index)
                result = await store.append(session, user)
                acks.append((session, Ack(writer, index, result.entry_id, result.epoch)))
                await store.append_many(session, rest)

        async def view() -> None:
            nonlocal bad_views
            rng = random.Random(-1)
            while not done.is_set():
                started = time.perf_counter()
                seen = await store.view(sessions[rng.randrange(len(sessions))], token_budget=2000)
                view_ms.append((time.perf_counter() - started) * 1000)
                bad_views += orphans(seen.messages) > 0
                await asyncio.sleep(0.005)

        async def rewrite() -> None:
            rng = random.Random(-2)
            n = 0
            while not done.is_set():
                await asyncio.sleep(0.05)
                session = sessions[rng.randrange(len(sessions))]
                if n % 2:
                    result = await store.clear(session)
                else:
                    result = await store.replace(
                        session, [{"role": "system", "content": f"reset {n}"}]
                    )
                rewrite_results.append((session, result))
                n += 1

        background = [asyncio.create_task(view())]
        if rewrites:
            background.append(asyncio.create_task(rewrite()))
        started = time.perf_counter()
        await asyncio.gather(*(write(w) for w in writers))
        elapsed = time.perf_counter() - started
        done.set()
        await asyncio.gather(*background)
    return {
        "acks": acks,
        "rewrites": rewrite_results,
        "elapsed": elapsed,
        "view_ms": view_ms,
        "bad_views": bad_views,
        "appends": len(writers) * turns * 4,
    }


def _child(args: tuple[Any, ...], out: Any) -> None:
    out.put(asyncio.run(process_main(*args)))


async def run_config(url: str, writers: int, sessions: int, turns: int) -> dict[str, Any]:
    """Run one configuration in fresh processes and audit every session."""
    prefix = f"ctxstress-{uuid.uuid4().hex[:8]}"
    tenant = "stress"
    names = [f"s{i:03d}" for i in range(sessions)]
    processes = min(writers, MAX_PROCESSES)
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    children = [
        context.Process(
            target=_child,
            args=(
                (url, prefix, tenant, list(range(p, writers, processes)), names, turns, p == 0),
                queue,
            ),
        )
        for p in range(processes)
    ]
    try:
        for child in children:
            child.start()
        reports = [queue.get(timeout=600) for _ in children]
        for child in children:
            child.join()
        settings = run_settings(url, prefix)
        totals = Counter[str]()
        async with ContextStore.from_settings(settings, tenant=tenant) as store:
            for session in names:
                acks = [a for r in reports for s, a in r["acks"] if s == session]
                rewrites = [w for r in reports for s, w in r["rewrites"] if s == session]
                found = await audit(store, session, acks, rewrites, key_of=writer_key)
                totals.update(
                    lost=found.lost, duplicated=found.duplicated, out_of_order=found.out_of_order
                )
    finally:
        stop_processes(children)  # none left running, whatever failed
        await remove_keys(url, prefix)  # the keys, the queue and arq's keys of its jobs
    appends = sum(r["appends"] for r in reports)
    elapsed = max(r["elapsed"] for r in reports)
    views = [ms for r in reports for ms in r["view_ms"]]
    return {
        "writers": writers,
        "sessions": sessions,
        "processes": processes,
        "appends": appends,
        "seconds": elapsed,
        "appends_per_s": appends / elapsed,
        "views": len(views),
        "view_p50_ms": statistics.median(views) if views else 0.0,
        "rewrites": sum(len(r["rewrites"]) for r in reports),
        "lost": totals["lost"],
        "duplicated": totals["duplicated"],
        "out_of_order": totals["out_of_order"],
        "orphan_views": sum(r["bad_views"] for r in reports),
    }


def run_settings(url: str, prefix: str, **extra: Any) -> Settings:
    """Settings for one configuration: its own key prefix and its own summary queue.

    The summary trigger stays on, as in production, but its jobs go to a queue
    no worker serves, never to the shared default one.
    """
    return Settings(redis_url=url, key_prefix=prefix, queue_name=f"{prefix}:summaries", **extra)


def main(argv: list[str] | None = None) -> int:
    """Run every configuration; exit 1 if any count is not 0."""
    parser = argparse.ArgumentParser(prog="python -m bench.stress", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="fewer appends, for a smoke run")
    parser.add_argument("--total", type=int, default=12_000, help="appends per configuration")
    args = parser.parse_args(argv)
    total = 1_200 if args.quick else args.total
    with redis_under_test() as (url, label):
        print(f"Redis: {label}")
        columns = (
            ("writers", 7), ("sessions", 8), ("procs", 5), ("msgs", 8), ("msgs/s", 10),
            ("views", 6), ("view p50", 9), ("rewrites", 8), ("lost", 5), ("dup", 4),
            ("order", 5), ("orphan", 6),
        )  # fmt: skip
        print(" ".join(f"{name:>{width}}" for name, width in columns))
        failed = False
        for sessions in (1, 100):
            for writers in (1, 4, 16, 64):
                turns = max(1, total // (writers * 4))
                row = asyncio.run(run_config(url, writers, sessions, turns))
                counts = (row["lost"], row["duplicated"], row["out_of_order"], row["orphan_views"])
                failed = failed or any(counts)
                cells = (
                    row["writers"], row["sessions"], row["processes"], row["appends"],
                    f"{row['appends_per_s']:.0f}", row["views"], f"{row['view_p50_ms']:.2f}ms",
                    row["rewrites"], *counts,
                )  # fmt: skip
                line = " ".join(f"{cell:>{w}}" for cell, (_, w) in zip(cells, columns, strict=True))
                print(line, flush=True)
        print(
            "FAILED: a count is not 0"
            if failed
            else "OK: 0 lost, duplicated, out of order, orphans"
        )
    return 1 if failed else 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONHASHSEED", "0")
    sys.exit(main())
