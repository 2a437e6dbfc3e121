"""Load test of the whole topology: pods, workers and a Redis Cluster.

For a cluster of 1 primary and then of 3 primaries (started here, on
loopback ports), simulated agent pods (processes, each running many agent
tasks) play tool-using conversations over many sessions of several tenants,
reading the request view before every "model call", while summary workers
(separate processes, the queue on a single Redis) keep summaries up to date.
It reports:

- appends/s (messages) and views/s over the whole run;
- view latency p50/p99, as the pods saw it;
- summary lag: tokens past the summary watermark, sampled across sessions
  during the run (median and p95) and at the end, and jobs committed;
- lost, duplicated and out-of-order appends (every session audited against
  what the pods were told) and views holding an orphan tool call or result:
  all must be 0.

Run: ``make load`` (``python -m bench.load [--quick]``). The queue lives on
``CTXSTORE_REDIS_URL``, else 127.0.0.1:6379 if it answers, else an embedded
Redis; only keys under this run's prefix are written there, and removed.

This machine has two cores: pods, workers and every Redis node share them,
so the figures show correctness under load and relative cost, not the
throughput of a real deployment.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import random
import statistics
import sys
import time
import uuid
from collections import Counter
from typing import Any

from redis.asyncio import Redis

from ctxstore import ContextStore, Settings
from ctxstore.testing import (
    Ack,
    LocalCluster,
    audit,
    orphans,
    redis_under_test,
    remove_keys,
    stop_processes,
)

TENANTS = 4
SESSIONS_PER_TENANT = 25
PODS = 3
AGENTS_PER_POD = 16
WORKERS = 2
BUDGET = 6_000


def settings_for(cluster_url: str, queue_url: str, prefix: str) -> Settings:
    """The pods' and workers' settings: store on the cluster, queue on a single Redis."""
    return Settings(
        redis_url=cluster_url,
        redis_cluster=True,
        queue_url=queue_url,
        key_prefix=prefix,
        queue_name=f"{prefix}:summaries",
        summary_trigger_tokens=6_000,
        summary_keep_tokens=2_000,
        retry_attempts=10,
    )


def session_names() -> list[tuple[str, str]]:
    """Every (tenant, session) of the run."""
    return [(f"tenant{t}", f"conv{s}") for t in range(TENANTS) for s in range(SESSIONS_PER_TENANT)]


def turn(agent: str, index: int, rng: random.Random) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """One agent turn: the user message, then the assistant's calls, results and answer."""
    call = f"{agent}-{index}"
    user: dict[str, Any] = {
        "role": "user",
        "content": json.dumps({"a": agent, "i": index}) + " check the build",
    }
    output = "\n".join(
        f"line {n}: value={rng.randint(0, 10**6)}" for n in range(rng.choice((5, 20, 80)))
    )
    rest: list[dict[str, Any]] = [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": call,
                    "type": "function",
                    "function": {"name": "run_tests", "arguments": "{}"},
                }
            ],
        },
        {"role": "tool", "tool_call_id": call, "content": output},
        {"role": "assistant", "content": f"turn {index} of {agent}: all green"},
    ]
    return user, rest


def key_of(message: dict[str, Any]) -> tuple[str, int] | None:
    """(agent, turn) of a user message a pod appended."""
    if message.get("role") != "user" or not str(message.get("content", "")).startswith("{"):
        return None
    body = json.loads(str(message["content"]).split(" check", 1)[0])
    return body["a"], body["i"]


async def pod_main(settings: Settings, pod: int, seconds: float) -> dict[str, Any]:
    """One pod: many agents, each looping view -> append a whole turn, for ``seconds``."""
    names = session_names()
    stores: dict[str, ContextStore] = {}
    base = ContextStore.from_settings(settings, tenant=names[0][0])
    acks: list[tuple[str, str, Ack]] = []
    views: list[float] = []
    bad_views = 0
    appended = 0
    deadline = time.monotonic() + seconds

    def store_for(tenant: str) -> ContextStore:
        if tenant not in stores:
            stores[tenant] = base.for_tenant(tenant)
        return stores[tenant]

    async def agent(number: int) -> None:
        nonlocal bad_views, appended
        rng = random.Random(f"{pod}:{number}")
        name = f"p{pod}a{number}"
        index = 0
        while time.monotonic() < deadline:
            tenant, session = names[rng.randrange(len(names))]
            store = store_for(tenant)
            started = time.perf_counter()
            view = await store.view(session, token_budget=BUDGET)
            views.append((time.perf_counter() - started) * 1000)
            bad_views += orphans(view.messages) > 0
            user, rest = turn(name, index, rng)
            result = await store.append(session, user)
            acks.append((tenant, session, Ack(name, index, result.entry_id, result.epoch)))
            await store.append_many(session, rest)
            appended += 1 + len(rest)
            index += 1

    try:
        await asyncio.gather(*(agent(n) for n in range(AGENTS_PER_POD)))
    finally:
        await base.aclose()
    return {"acks": acks, "views": views, "bad_views": bad_views, "appended": appended}


def _pod(settings_json: str, pod: int, seconds: float, out: Any) -> None:
    out.put(asyncio.run(pod_main(Settings.model_validate_json(settings_json), pod, seconds)))


def _worker(settings_json: str) -> None:
    from workers import build_worker

    build_worker(Settings.model_validate_json(settings_json)).run()


async def sample_lag(settings: Settings, until: float, samples: list[int]) -> None:
    """Every half second, the tokens past the watermark of a few random sessions."""
    names = session_names()
    rng = random.Random(0)
    async with ContextStore.from_settings(settings, tenant=names[0][0]) as base:
        stores = {t: base.for_tenant(t) for t, _ in names}
        while time.monotonic() < until:
            for tenant, session in rng.sample(names, 10):
                info = await stores[tenant].info(session)
                if info.exists:
                    samples.append(info.tokens_unsummarized)
            await asyncio.sleep(0.5)


async def finish(settings: Settings, reports: list[dict[str, Any]]) -> dict[str, Any]:
    """Audit every session, and read the final summary state."""
    names = session_names()
    totals = Counter[str]()
    final_lag: list[int] = []
    runs = 0
    async with ContextStore.from_settings(settings, tenant=names[0][0]) as base:
        for tenant, session in names:
            store = base.for_tenant(tenant)
            acks = [a for r in reports for t, s, a in r["acks"] if (t, s) == (tenant, session)]
            found = await audit(store, session, acks, key_of=key_of)
            totals.update(
                lost=found.lost, duplicated=found.duplicated, out_of_order=found.out_of_order
            )
            info = await store.info(session)
            if info.exists:
                final_lag.append(info.tokens_unsummarized)
                runs += info.summary_runs
    return {"totals": totals, "final_lag": final_lag, "summary_runs": runs}


async def settle(settings: Settings, limit_s: float) -> float:
    """Wait (bounded) for the summary queue to drain; return how long it took."""
    started = time.monotonic()
    client = Redis.from_url(settings.queue_url or "")
    try:
        while time.monotonic() - started < limit_s:
            if not await client.zcard(settings.queue_name):
                break
            await asyncio.sleep(0.2)
    finally:
        await client.aclose()
    return time.monotonic() - started


def run_topology(primaries: int, queue_url: str, seconds: float) -> dict[str, Any]:
    """One cluster size: start it, run pods and workers, audit, stop it."""
    cluster = LocalCluster.start(primaries=primaries, replicas=0)
    prefix = f"ctxload-{uuid.uuid4().hex[:8]}"
    settings = settings_for(cluster.url, queue_url, prefix)
    raw = settings.model_dump_json()
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    workers = [context.Process(target=_worker, args=(raw,)) for _ in range(WORKERS)]
    pods = [context.Process(target=_pod, args=(raw, p, seconds, queue)) for p in range(PODS)]
    try:
        for process in workers:
            process.start()
        started = time.monotonic()
        for process in pods:
            process.start()
        lag: list[int] = []
        asyncio.run(sample_lag(settings, started + seconds, lag))
        reports = [queue.get(timeout=seconds + 120) for _ in pods]
        for process in pods:
            process.join()
        elapsed = time.monotonic() - started
        drained = asyncio.run(settle(settings, 60))
        stop_processes(workers, timeout=60)  # SIGTERM: arq finishes its job first
        end = asyncio.run(finish(settings, reports))
    finally:
        stop_processes(pods + workers)  # none left running, whatever failed
        cluster.stop()
        asyncio.run(remove_keys(queue_url, prefix))
    views = sorted(v for r in reports for v in r["views"])
    appended = sum(r["appended"] for r in reports)
    totals = end["totals"]
    return {
        "primaries": primaries,
        "seconds": round(elapsed, 1),
        "appends_per_s": appended / seconds,
        "views_per_s": len(views) / seconds,
        "view_p50_ms": statistics.median(views),
        "view_p99_ms": views[int(0.99 * (len(views) - 1))],
        "lag_median": statistics.median(lag) if lag else 0,
        "lag_p95": sorted(lag)[int(0.95 * (len(lag) - 1))] if lag else 0,
        "final_lag_max": max(end["final_lag"], default=0),
        "summary_runs": end["summary_runs"],
        "queue_drained_s": round(drained, 1),
        "lost": totals["lost"],
        "duplicated": totals["duplicated"],
        "out_of_order": totals["out_of_order"],
        "orphan_views": sum(r["bad_views"] for r in reports),
        "acks": sum(len(r["acks"]) for r in reports),
    }


def main(argv: list[str] | None = None) -> int:
    """Run both topologies and print the table; exit 1 if any count is not 0."""
    parser = argparse.ArgumentParser(prog="python -m bench.load", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="a 10 s run per topology")
    parser.add_argument("--seconds", type=float, default=30.0)
    args = parser.parse_args(argv)
    seconds = 10.0 if args.quick else args.seconds
    failed = False
    with redis_under_test() as (queue_url, label):
        print(
            f"queue: {label}; {PODS} pods x {AGENTS_PER_POD} agents, {WORKERS} workers, "
            f"{TENANTS} tenants x {SESSIONS_PER_TENANT} sessions, view budget {BUDGET:,}"
        )
        columns = ("primaries", "appends/s", "views/s", "view p50", "view p99", "lag p50",
                   "lag p95", "lag end", "jobs", "lost", "dup", "order", "orphan")  # fmt: skip
        print("  ".join(f"{c:>9}" for c in columns))
        for primaries in (1, 3):
            row = run_topology(primaries, queue_url, seconds)
            counts = (row["lost"], row["duplicated"], row["out_of_order"], row["orphan_views"])
            failed = failed or any(counts)
            cells = (
                row["primaries"], f"{row['appends_per_s']:.0f}", f"{row['views_per_s']:.0f}",
                f"{row['view_p50_ms']:.2f}ms", f"{row['view_p99_ms']:.2f}ms",
                int(row["lag_median"]),
                row["lag_p95"], row["final_lag_max"], row["summary_runs"], *counts,
            )  # fmt: skip
            print("  ".join(f"{c:>9}" for c in cells), flush=True)
    print("FAILED: a count is not 0" if failed else "OK: 0 lost, duplicated, out of order, orphans")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
