"""A full Redis still answers every read; a store closed for good ends every call at once.

A full Redis (``maxmemory 1``, ``noeviction``, on a private server) refuses every
command queued in MULTI: a transaction of reads goes again as one script that only
reads. So on a full Redis (a single server, a cluster, the embedded Redis 6) every
public read answers as before, by EVALSHA or FCALL, as a tenant's own user too (its
limits key read-only), for read commands of 8,000+ words, a list whose session is gone
and a search with no index (which writes no index); a refused write leaves every key as
it was and is a typed error; a session can be deleted, and a tenant forgotten, to make
room.

A closed store fails every call in flight then, or made later, with StoreClosedError at
once (a call waiting out its backoff, or for a pooled connection on a stalled server,
too) and leaves no connection open (a pipeline, a summary hand-off, a cluster script's
second send). A store whose calls waited for pooled connections, or a cluster store,
works under a second asyncio.run.
"""

from __future__ import annotations

import asyncio
import json
import re
import secrets
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, suppress
from pathlib import Path
from typing import Any

import pytest
from redis import exceptions as rex
from redis.asyncio import Redis
from support.config import cluster_or_skip
from support.helpers import key_states, load_library, loop_until, turn, user
from support.servers import PrivateRedis, ServerPool, all_keys

from ctxstore import (
    ContextStore,
    CtxstoreError,
    Settings,
    StoreClosedError,
    StoreFullError,
    TenantLimits,
)
from ctxstore._redis import connection as _connection
from ctxstore._redis.coalescer import Coalescer
from ctxstore._redis.functions import load_functions
from ctxstore._tenant.acl import render_acl, tenant_user_name
from ctxstore.testing import LocalCluster as Cluster


def settings_for(url: str, mode: str = "eval", **changes: Any) -> Settings:
    """Settings on ``url`` under this module's prefix, scripts run by ``mode``."""
    options: dict[str, Any] = {"summary_trigger_tokens": 100_000, **changes}
    return Settings(
        redis_url=url, key_prefix="fa", queue_name="fa:summaries", script_mode=mode, **options
    )


@asynccontextmanager
async def full(*nodes: Redis) -> AsyncIterator[None]:
    """``nodes`` past maxmemory (noeviction) inside the block; emptied of limits after."""
    for node in nodes:
        await node.config_set("maxmemory-policy", "noeviction")
        await node.config_set("maxmemory", 1)
    try:
        yield
    finally:
        for node in nodes:
            await node.config_set("maxmemory", 0)


async def _seed(store: ContextStore) -> None:
    """A tenant with a pinned, checkpointed, rewound, forked and indexed session."""
    await store.set_limits(TenantLimits(session_tokens=10_000_000))
    await store.append("s", {"role": "system", "content": "You are terse."})
    first = await store.append_many("s", [turn(i) for i in range(30)])
    await store.pin("s", first[3].entry_id)
    await store.checkpoint("s", "cp")
    await store.search("s", "turn lazy dog")  # the index, up to here
    await store.rewind("s", first[20].entry_id)  # a branch of what came after
    await store.append_many("s", [turn(i) for i in range(100, 110)])
    await store.fork("s", "f", at=first[10].entry_id)
    await store.append("f", user("only in the fork"))
    view = await store.view("s", token_budget=400, model="gpt-4o")
    await store.record_usage(view, view.stats.tokens + 10, model="gpt-4o")


async def _every_read(store: ContextStore) -> dict[str, Any]:
    """What each public read of the tenant answers, as plain data."""
    out: dict[str, Any] = {}
    for session in ("s", "f", "missing"):
        out[session, "messages"] = await store.get_messages(session)
        out[session, "info"] = repr(await store.info(session, pins=False))
        page = await store.read(session, limit=3)
        out[session, "page"] = repr(page)
        if page.next_after:
            out[session, "next"] = repr(await store.read(session, after=page.next_after, limit=5))
        out[session, "tail"] = repr(await store.tail(session, 4))
        out[session, "iter"] = [m.entry_id async for m in store.iter_history(session)]
        out[session, "checkpoints"] = repr(await store.checkpoints(session))
        branches = await store.branches(session)
        out[session, "branches"] = repr(branches)
        for branch in branches:
            out[session, branch.branch_id] = repr(
                await store.read_branch(session, branch.branch_id)
            )
        for budget, model in ((100_000, None), (300, "gpt-4o"), (60, None)):
            view = await store.view(session, token_budget=budget, model=model)
            out[session, "view", budget] = [view.messages, view.stats.tokens]
        out[session, "missing entry"] = await store.get_entry(session, "1-0")
        out[session, "search"] = repr(await store.search(session, "turn lazy dog", limit=3))
    exported = [line async for line in store.export_session("s")]
    out["export"] = [re.sub(r'"exported_at_ms":\d+', "", line) for line in exported]
    out["limits"] = repr(await store.limits())
    out["sessions"] = sorted(s.session for s in await store.list_sessions())
    out["tenants"] = await store.list_tenants()
    return out


@pytest.mark.parametrize("mode", ["eval", "auto", "functions", "auto, no library"])
async def test_every_public_read_answers_as_before_on_a_full_redis(
    server: PrivateRedis, mode: str
) -> None:
    """Pages, branches, exports, limits, tenants, searches: the same answers once it is full.

    Each round reads cold (a store of its own), then warm.
    """
    if mode == "auto, no library":
        mode = "auto"
    else:
        await load_library(server.url())
    config = settings_for(server.url(), mode)
    async with ContextStore.from_settings(config, tenant="acme") as store:
        await _seed(store)
    async with ContextStore.from_settings(config, tenant="acme") as store:
        await _every_read(store)  # its views' summary requests, made before the fill
        before = await _every_read(store)
    admin = Redis.from_url(server.url())
    try:
        async with full(admin), ContextStore.from_settings(config, tenant="acme") as store:
            assert await _every_read(store) == before
            assert await _every_read(store) == before
    finally:
        await admin.aclose()


@pytest.mark.parametrize(
    "mode",
    [
        "eval",
        "auto",
        "functions",
    ],
)
async def test_list_sessions_answers_on_a_full_redis_when_a_listed_session_is_gone(
    server: PrivateRedis, mode: str
) -> None:
    """A session whose keys went (expired) is still listed: the listing answers without it."""
    await load_library(server.url())
    config = settings_for(server.url(), mode)
    admin = Redis.from_url(server.url())
    try:
        async with ContextStore.from_settings(config, tenant="acme") as store:
            await store.append("kept", turn(0))
            await store.append("gone", turn(0))
            await admin.delete(*store.keys("gone").all())  # as its TTL would
            async with full(admin):
                listed = [s.session for s in await store.list_sessions()]
        assert listed == ["kept"]
    finally:
        await admin.aclose()


@pytest.mark.parametrize(
    "mode",
    [
        "eval",
        "auto",
        "functions",
    ],
)
async def test_a_search_of_a_session_never_indexed_answers_on_a_full_redis(
    server: PrivateRedis, mode: str
) -> None:
    """README: reads, views and searches still answer on a full Redis; here, with no index."""
    await load_library(server.url())
    config = settings_for(server.url(), mode)
    admin = Redis.from_url(server.url())
    try:
        async with ContextStore.from_settings(config, tenant="acme") as store:
            await store.append_many("s", [turn(i) for i in range(5)])
            await store.append("s", {"role": "user", "content": "a lazy dog sleeps"})
            async with full(admin):
                hits = await store.search("s", "lazy dog sleeps")
                assert await admin.exists(store.keys("s").index) == 0  # none was written
            indexed = await store.search("s", "lazy dog sleeps")  # room again: indexed
        assert hits and hits == indexed
    finally:
        await admin.aclose()


ADMIN_LINE = "user default on nopass ~* &* +@all\n"
"""The test's own admin (the rendered file holds no default user)."""


async def acl_server(servers: ServerPool) -> tuple[PrivateRedis, str]:
    """A private Redis 7 running the rendered users for tenant acme, its library loaded.

    Returns the server and the URL of acme's own user.
    """
    base = settings_for("redis://unused")
    name = tenant_user_name("acme")
    passwords = {n: secrets.token_urlsafe(12) for n in ("ctxstore-pod", "ctxstore-worker", name)}
    server = servers.start(acl=render_acl(base, ["acme"], passwords) + ADMIN_LINE)
    await load_library(server.url())  # as the admin
    return server, server.url(name, passwords[name])


async def test_a_tenant_user_reads_its_limits_on_a_full_redis(servers: ServerPool) -> None:
    """A tenant's own user (FCALL only, its limits read-only) reads them once Redis is full."""
    server, url = await acl_server(servers)
    async with ContextStore.from_settings(settings_for(server.url()), tenant="acme") as operator:
        await operator.set_limits(TenantLimits(sessions=7))
    admin = Redis.from_url(server.url())
    try:
        async with ContextStore.from_settings(settings_for(url, "auto"), tenant="acme") as store:
            await store.append("s", turn(0))
            assert (await store.limits()).sessions == 7
            async with full(admin):
                assert len(await store.get_messages("s")) == 1  # its own keys: read
                assert (await store.limits()).sessions == 7
    finally:
        await admin.aclose()


async def test_a_tenant_users_append_on_a_full_redis_says_it_is_full(servers: ServerPool) -> None:
    """A tenant's own user appending on a full Redis is told it is full, not that it may not."""
    server, url = await acl_server(servers)
    admin = Redis.from_url(server.url())
    try:
        async with ContextStore.from_settings(settings_for(url, "auto"), tenant="acme") as store:
            await store.append("s", turn(0))
        async with (
            full(admin),
            ContextStore.from_settings(settings_for(url, "auto"), tenant="acme") as store,
        ):
            with pytest.raises(StoreFullError):
                await store.append("s", turn(1))
    finally:
        await admin.aclose()


async def _fill_every_type(admin: Redis) -> None:
    """One key of each type under one hash tag, with awkward values."""
    odd = b"\x00\r\n-ERR not an error\r\n$-1\xff"
    await admin.set("{r}str", odd * 1000)
    await admin.set("{r}num", "9007199254740993")  # past a double's integers
    await admin.hset("{r}hash", mapping={f"f{i}": (odd if i % 7 else b"") for i in range(5000)})
    for i in range(3000):
        await admin.xadd("{r}log", {"m": odd, "i": str(i)}, id=f"{i + 1}-{i % 3}")
    await admin.zadd("{r}z", {"a": 1.5, "b": -0.1, "c": 1e300, "d": 3, odd: 2})
    await admin.zadd("{r}z", {"inf": float("inf"), "ninf": float("-inf")})
    await admin.sadd("{r}set", "x", "y", odd)
    await admin.rpush("{r}list", "x", "", odd)
    await admin.pexpire("{r}hash", 10**12)


READS: list[tuple[Any, ...]] = [
    ("GET", "{r}str"),
    ("GET", "{r}missing"),
    ("GET", "{r}num"),
    ("MGET", "{r}str", "{r}missing", "{r}num"),
    ("STRLEN", "{r}str"),
    ("EXISTS", "{r}str", "{r}missing", "{r}str"),
    ("TYPE", "{r}hash"),
    ("TYPE", "{r}missing"),
    ("PTTL", "{r}str"),
    ("PTTL", "{r}missing"),
    ("TTL", "{r}hash"),
    ("HGET", "{r}hash", "f1"),
    ("HGET", "{r}hash", "f0"),
    ("HGET", "{r}hash", "nope"),
    ("HMGET", "{r}hash", "f1", "nope", "f0", "f2"),
    ("HMGET", "{r}missing", "a", "b"),
    ("HGETALL", "{r}hash"),
    ("HGETALL", "{r}missing"),
    ("HLEN", "{r}hash"),
    ("HEXISTS", "{r}hash", "f3"),
    ("HKEYS", "{r}hash"),
    ("HVALS", "{r}hash"),
    ("HSTRLEN", "{r}hash", "f1"),
    ("XRANGE", "{r}log", "-", "+"),
    ("XRANGE", "{r}log", "(5-2", "+", "COUNT", 3),
    ("XRANGE", "{r}missing", "-", "+"),
    ("XREVRANGE", "{r}log", "+", "-", "COUNT", 10),
    ("XLEN", "{r}log"),
    ("XLEN", "{r}missing"),
    ("LRANGE", "{r}list", 0, -1),
    ("LLEN", "{r}list"),
    ("SMEMBERS", "{r}set"),
    ("SISMEMBER", "{r}set", "x"),
    ("SCARD", "{r}missing"),
    ("ZRANGE", "{r}z", 0, -1, "WITHSCORES"),
    ("ZRANGEBYSCORE", "{r}z", "-inf", "+inf", "WITHSCORES", "LIMIT", 1, 3),
    ("ZREVRANGE", "{r}z", 0, 2),
    ("ZREVRANGEBYSCORE", "{r}z", "+inf", "(0", "WITHSCORES"),
    ("ZSCORE", "{r}z", "c"),
    ("ZSCORE", "{r}z", "nope"),
    ("ZMSCORE", "{r}z", "a", "nope", "inf"),
    ("ZCARD", "{r}z"),
    ("ZCOUNT", "{r}z", "-inf", "+inf"),
    ("ZRANK", "{r}z", "d"),
    ("ZRANK", "{r}z", "nope"),
]


def _pairs(flat: list[Any]) -> dict[Any, Any]:
    return dict(zip(flat[::2], flat[1::2], strict=True))


@pytest.mark.parametrize("mode", ["eval", "functions"])
async def test_every_read_a_transaction_may_hold_answers_the_same_through_the_script(
    server: PrivateRedis, mode: str
) -> None:
    """Every command of ``_READS`` answers the same by MULTI/EXEC and by read.lua.

    Nil values inside arrays, empty and missing keys, binary values, an integer past a
    double's, infinite scores, a 5,000-field hash, a 3,000-entry stream.
    """
    await load_library(server.url())
    admin = Redis.from_url(server.url())
    try:
        await _fill_every_type(admin)
        async with ContextStore.from_settings(settings_for(server.url(), mode), tenant="acme") as s:
            connection = s._connection
            by_multi = await connection.transaction(READS, key="{r}str")
            async with full(admin):
                by_script = await connection.transaction(READS, key="{r}str")
        for command, multi, script in zip(READS, by_multi, by_script, strict=True):
            if command[0] in ("PTTL", "TTL") and isinstance(multi, int) and multi > 0:
                assert 0 <= multi - script < 5_000, command  # time passed between the two
                continue
            if command[0] == "HGETALL":  # a hash being rehashed walks in another order
                multi, script = _pairs(multi), _pairs(script)
            elif command[0] in ("HKEYS", "HVALS", "SMEMBERS"):
                multi, script = sorted(multi), sorted(script)
            assert multi == script, command
    finally:
        await admin.aclose()


@pytest.mark.parametrize("mode", ["eval", "functions"])
async def test_a_read_of_many_words_answers_through_the_script(
    server: PrivateRedis, mode: str
) -> None:
    """HMGET of 9,000 fields (by str and by bytes), MGET and EXISTS of 8,001 keys: as MULTI.

    Lua passes a function at most ~8,000 values: read.lua sends such a command in parts
    (4,000 words, then 4,000, then the rest; and 4,000 exactly in one).
    """
    await load_library(server.url())
    admin = Redis.from_url(server.url())
    fields = [f"f{i}" for i in range(9_000)]
    keys = [f"{{r}}k{i}" for i in range(8_001)]
    try:
        await admin.hset("{r}hash", mapping=dict.fromkeys(fields[::3], "v"))
        await admin.mset(dict.fromkeys(keys[1::2], "w"))
        commands = [
            ("HMGET", "{r}hash", *fields),
            ("GET", keys[1]),
            ("MGET", *keys),
            ("HMGET", "{r}hash", *fields[:4_000]),
            ("EXISTS", *keys),
            ("HLEN", "{r}hash"),
            (b"hmget", b"{r}hash", *(f.encode() for f in fields)),  # bytes, lower case
        ]
        async with ContextStore.from_settings(settings_for(server.url(), mode), tenant="acme") as s:
            by_multi = await s._connection.transaction(commands)
            async with full(admin):
                by_script = await s._connection.transaction(commands)
        assert by_script == by_multi
        assert by_multi[0][:4] == [b"v", None, None, b"v"] and len(by_multi[0]) == 9_000
        assert by_multi[2][:2] == [None, b"w"] and len(by_multi[2]) == 8_001
        assert by_multi[4] == 4_000 and by_multi[6] == by_multi[0]
    finally:
        await admin.aclose()


@pytest.mark.parametrize("mode", ["eval", "auto", "functions"])
async def test_appends_a_full_redis_refuses_leave_every_key_as_it_was(
    server: PrivateRedis, mode: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Appends a full Redis refuses change no key: the counters still equal the stream.

    To a session, to a new one, pinned, idempotent, if at a sequence, with a large
    message: StoreFullError each, and no warning for the index touch each sends after
    its script (a full Redis refuses it too: the error raised says so).
    """
    await load_library(server.url())
    admin = Redis.from_url(server.url())
    big = {"role": "tool", "tool_call_id": "c", "content": "x" * 200_000}
    touching = settings_for(server.url(), mode, index_interval=0.0)  # a touch on every write
    try:
        async with ContextStore.from_settings(touching, tenant="acme") as s:
            await s.append_many("s", [turn(i) for i in range(5)])
            keys = sorted(await all_keys(server.url()))
            before = await key_states(admin, keys)
            async with full(admin):
                attempts = [
                    s.append("s", turn(9)),
                    s.append("s", turn(9), pinned=True, idempotency_key="k1"),
                    s.append("s", turn(9), expected_seq=5),
                    s.append_many("s", [turn(9), big]),
                    s.append_many("new", [turn(9), turn(10)]),
                ]
                with caplog.at_level("WARNING", logger="ctxstore"):
                    for attempt in attempts:
                        with pytest.raises(StoreFullError):
                            await attempt
                assert "refused" not in caplog.text
            assert sorted(await all_keys(server.url())) == keys
            assert await key_states(admin, keys) == before
            info = await s.info("s")
            assert (info.count, info.seq) == (5, 5) == (await admin.xlen(s.keys("s").log), 5)
    finally:
        await admin.aclose()


@pytest.mark.parametrize("mode", ["eval", "auto", "functions"])
async def test_a_session_can_be_deleted_to_make_room_on_a_full_redis(
    server: PrivateRedis, mode: str
) -> None:
    """README: on a full Redis a session can still be deleted to make room."""
    await load_library(server.url())
    admin = Redis.from_url(server.url())
    try:
        async with ContextStore.from_settings(settings_for(server.url(), mode), tenant="acme") as s:
            await s.append_many("s", [turn(i) for i in range(5)])
            async with full(admin):
                assert await s.delete("s")
            assert await s.get_messages("s") == []
    finally:
        await admin.aclose()


async def test_a_tenant_can_be_forgotten_to_make_room_on_a_full_redis(
    server: PrivateRedis,
) -> None:
    """Deleting a whole tenant is what an operator does first on a full Redis."""
    admin = Redis.from_url(server.url())
    try:
        async with ContextStore.from_settings(settings_for(server.url()), tenant="acme") as s:
            await s.append_many("s", [turn(i) for i in range(5)])
            await s.append_many("t", [turn(i) for i in range(5)])
            async with full(admin):
                assert await s.forget_tenant() == 2
            assert await s.list_sessions() == []
    finally:
        await admin.aclose()


async def test_a_search_on_a_full_redis_writes_no_index(server: PrivateRedis) -> None:
    """By EVALSHA, a search on a full Redis answers without writing an index past maxmemory."""
    admin = Redis.from_url(server.url())
    try:
        async with ContextStore.from_settings(settings_for(server.url()), tenant="acme") as s:
            await s.append_many("s", [turn(i) for i in range(50)])
            async with full(admin):
                await s.search("s", "lazy dog")
                grown = await admin.exists(s.keys("s").index)
        assert not grown
    finally:
        await admin.aclose()


_TWO_RUNS = r"""
import asyncio, json, sys
from ctxstore import ContextStore, Settings
url, cluster, most, calls = sys.argv[1], sys.argv[2] == "1", int(sys.argv[3]), int(sys.argv[4])
settings = Settings(redis_url=url, redis_cluster=cluster, key_prefix="fa", queue_name="fa:q",
    script_mode="eval", max_connections=most, retry_attempts=1, operation_timeout=5)
store = ContextStore.from_settings(settings, tenant="acme")
async def run():
    await store.append("s", {"role": "user", "content": "x"})
    got = await asyncio.gather(*(store.get_messages("s") for _ in range(calls)),
                               return_exceptions=True)
    return [repr(r)[:200] for r in got if isinstance(r, BaseException)][:3]
async def close():
    await store.aclose()
rounds = []
for _ in range(2):
    try:
        rounds.append(asyncio.run(run()))
    except Exception as exc:
        rounds.append(["raised: " + repr(exc)[:200]])
try:
    asyncio.run(close())
except Exception as exc:
    rounds.append(["aclose raised: " + repr(exc)[:200]])
print(json.dumps(rounds))
"""


def _two_runs(url: str, *, cluster: bool, most: int, calls: int) -> list[list[str]]:
    """What each of two asyncio.run of one store failed with (then its close, if it did)."""
    done = subprocess.run(
        [sys.executable, "-c", _TWO_RUNS, url, "1" if cluster else "0", str(most), str(calls)],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return list(json.loads(done.stdout.strip().splitlines()[-1]))


def test_a_store_whose_calls_wait_for_connections_works_under_a_second_asyncio_run(
    private: PrivateRedis,
) -> None:
    """More calls than connections, in two event loops one after the other: none fails."""
    assert _two_runs(private.url(), cluster=False, most=2, calls=300) == [[], []]


@pytest.fixture(scope="module")
def own_cluster() -> Iterator[Cluster]:
    """A Redis Cluster of this module's own (3 primaries, no replica)."""
    with cluster_or_skip(replicas=0) as running:
        yield running


def test_a_cluster_store_works_under_a_second_asyncio_run(own_cluster: Cluster) -> None:
    """README: a store used again under a new event loop connects anew; on a cluster too."""
    assert _two_runs(own_cluster.url, cluster=True, most=64, calls=5) == [[], []]


async def test_every_public_read_answers_as_before_on_a_full_cluster(
    own_cluster: Cluster, server: PrivateRedis
) -> None:
    """auto, the library loaded on each primary: each primary full, every read the same."""
    config = settings_for(own_cluster.url, "auto", redis_cluster=True, queue_url=server.url())
    async with ContextStore.from_settings(config, tenant="ops") as loader:
        await load_functions(loader._connection)
    async with ContextStore.from_settings(config, tenant="acme") as store:
        await _seed(store)
        await _every_read(store)
    async with ContextStore.from_settings(config, tenant="acme") as store:
        before = await _every_read(store)
    nodes = [Redis(port=port) for port in own_cluster.ports]
    try:
        async with full(*nodes), ContextStore.from_settings(config, tenant="acme") as store:
            assert await _every_read(store) == before
            assert await _every_read(store) == before
    finally:
        for node in nodes:
            await node.aclose()


async def test_a_summary_handed_off_after_the_close_opens_no_connection(
    private: PrivateRedis,
) -> None:
    """An append that made a summary due, its store closed before the hand-off: nothing reopens."""
    config = settings_for(private.url(), summary_trigger_tokens=50, summary_keep_tokens=10)
    store = ContextStore.from_settings(config, tenant="acme")
    hand_off = store._handoff.due

    async def close_first(tenant: str, session: str, generation: int) -> None:
        await store.aclose()  # the interleaving under test: the close comes right here
        await hand_off(tenant, session, generation)

    store._handoff.due = close_first  # type: ignore[method-assign]
    try:
        for i in range(10):
            if (await store.append("s", turn(i))).summary_due:
                break
        assert store._connection.closed()
        with pytest.raises(StoreClosedError):
            await store.append("s", turn(9))
        queue = store._handoff._queue
        assert queue is None or not open_in(queue.connection.client)
    finally:
        await store._handoff.aclose()


def connected(store: ContextStore) -> list[Any]:
    """The connections of ``store``'s pool that are open."""
    return open_in(store._connection.client)


def open_in(client: Redis) -> list[Any]:
    """The connections of ``client``'s pool that are open."""
    pool: Any = client.connection_pool
    return [c for c in (*pool._available_connections, *pool._in_use_connections) if c.is_connected]


def _calls(store: ContextStore) -> list[Any]:
    """One of each kind of call, on ``store``'s session ``s``, as coroutines.

    Not list_sessions: see test_a_pipeline_in_flight_at_the_close_leaves_no_connection_open.
    """

    async def export() -> list[str]:
        return [line async for line in store.export_session("s")]

    return [
        store.view("s", token_budget=300),
        store.view("s", token_budget=90, model="gpt-4o"),
        store.append("s", turn(99)),
        store.append_many("new", [turn(1), turn(2)]),
        store.search("s", "lazy dog"),
        store.get_messages("s"),
        store.info("s"),
        store.checkpoints("s"),
        export(),
    ]


def _hold_the_send(
    patch: pytest.MonkeyPatch, k: int, calls: set[asyncio.Task[Any]]
) -> tuple[asyncio.Event, asyncio.Event]:
    """The k-th send (0: the first) that ``calls`` make waits for ``go`` before it is sent.

    Answers ``(held, go)``: ``held`` is set once that send waits, its call in flight until
    ``go``. Sends of other tasks (an index touch a call left behind) go, uncounted.
    """
    send = Coalescer.send
    held, go = asyncio.Event(), asyncio.Event()
    sends = 0

    async def holding(self: Any, node: Any, key: str, commands: Any, lone: Any) -> list[Any]:
        nonlocal sends
        if asyncio.current_task() in calls:
            sends += 1
            if sends == k + 1:
                held.set()
                await go.wait()
        return await send(self, node, key, commands, lone)

    patch.setattr(Coalescer, "send", holding)
    return held, go


async def _closed_at_a_send(
    monkeypatch: pytest.MonkeyPatch,
    k: int | None,
    stores: tuple[ContextStore, ...],
    closing: ContextStore,
) -> tuple[bool, list[Any]]:
    """Each of ``stores``' ``_calls`` made at once, ``closing`` closed as their k-th send waits.

    Answers whether the close came, and each call's outcome. ``k`` None: the close comes
    before any call has run; else as the k-th send of the calls waits to go, if there is
    one (if every call ends first, there is no close). The send goes on once the close is
    done: its call, in flight at the close, fails as a closed store's.
    """
    with monkeypatch.context() as patch:
        ours: set[asyncio.Task[Any]] = set()
        held, go = _hold_the_send(patch, -1 if k is None else k, ours)
        tasks = [asyncio.ensure_future(c) for store in stores for c in _calls(store)]
        ours.update(tasks)  # before any of them runs
        ended = asyncio.gather(*tasks, return_exceptions=True)
        try:
            async with asyncio.timeout(60):  # a safety net: a call that never ends fails here
                if k is not None:
                    waiting = asyncio.ensure_future(held.wait())
                    await asyncio.wait([waiting, ended], return_when=asyncio.FIRST_COMPLETED)
                    waiting.cancel()
                    if not held.is_set():
                        return False, list(await ended)
                await closing.aclose()  # the interleaving under test: with that send waiting
                go.set()
                return True, list(await ended)
        finally:
            go.set()
            for task in tasks:
                task.cancel()


async def test_closing_a_tenants_store_ends_every_tenants_calls_in_flight(
    private: PrivateRedis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Closing a for_tenant store ends every tenant's calls, in flight or later.

    Aclose before two tenants' 18 calls run, then as each of their sends in turn waits to
    go: each call lands or fails with StoreClosedError, none hangs, no connection stays
    open; every tenant's later calls (a new tenant's too) fail at once; aclose again is a
    no-op.
    """
    config = settings_for(private.url(), retry_attempts=2, retry_base_delay=0.01)
    odd: list[Any] = []
    for k in [None, *range(200)]:
        root = ContextStore.from_settings(config, tenant="acme")
        beta = root.for_tenant("beta")
        try:
            for store in (root, beta):
                await store.append_many("s", [turn(i) for i in range(20)])
            came, ended = await _closed_at_a_send(monkeypatch, k, (root, beta), beta)
            failed = [repr(e) for e in ended if isinstance(e, BaseException)]
            if not came:  # every call ended before a k-th send: each as on an open store
                assert not failed, failed
                break
            closed = sum(e.startswith("StoreClosedError") for e in failed)
            odd += [(k, e) for e in failed if not e.startswith("StoreClosedError")]
            if k is None:
                assert closed == len(ended)  # closed before any call ran: each fails
            assert not connected(root), k
            for store in (root, beta, root.for_tenant("gamma"), beta.for_tenant("acme")):
                for call in _calls(store):
                    with pytest.raises(StoreClosedError):
                        await call
            await root.aclose()
            await beta.aclose()
            assert not connected(root)
        finally:  # a round that failed leaves no socket for a later test to meet
            await beta.aclose()
            await root.aclose()
    assert not odd
    assert k, "the close came at no send"


async def test_a_pipeline_in_flight_at_the_close_leaves_no_connection_open(
    private: PrivateRedis,
) -> None:
    """list_sessions checks its sessions by pipeline: closed while it runs, it leaves none open."""
    store = ContextStore.from_settings(settings_for(private.url()), tenant="acme")
    client = store._connection.client
    pipeline = client.pipeline

    def closing_pipeline(*args: Any, **kwargs: Any) -> Any:
        made = pipeline(*args, **kwargs)
        execute = made.execute

        async def close_then_execute(*a: Any, **k: Any) -> Any:
            await store.aclose()  # the interleaving under test: the close comes right here
            return await execute(*a, **k)

        made.execute = close_then_execute
        return made

    try:
        await store.append("s", turn(0))
        client.pipeline = closing_pipeline
        with suppress(StoreClosedError):
            await store.list_sessions()
        assert not connected(store)
    finally:
        await client.connection_pool.disconnect()


async def test_a_call_waiting_to_retry_fails_at_once_when_the_store_closes(
    private: PrivateRedis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """README: a call in flight at the close fails at once; here one waiting out its backoff.

    An hour of it: only the close can end the call before the test's safety net.
    """
    config = settings_for(private.url(), retry_base_delay=3600, retry_max_delay=3600)
    store = ContextStore.from_settings(config, tenant="acme")
    waiting = asyncio.Event()

    def longest(low: float, high: float) -> float:
        waiting.set()  # the call failed once, and waits out this backoff to try again
        return high

    monkeypatch.setattr(_connection.random, "uniform", longest)
    await store.append("s", turn(0))
    private.kill()
    call = asyncio.ensure_future(store.get_messages("s"))
    try:
        async with asyncio.timeout(60):  # a safety net: it waits within a few turns
            await waiting.wait()
        await store.aclose()
        with pytest.raises(StoreClosedError):
            async with asyncio.timeout(60):  # a safety net: the backoff has an hour left
                await call
    finally:
        call.cancel()
        await store.aclose()


async def test_the_embedded_redis_full_then_closed(data_dir: Path) -> None:
    """No URL: the embedded Redis serves reads full, and its store closes for good.

    Full, a cold store reads and views as before. Closed with calls in flight, every
    call then fails at once, twice closed is a no-op, and the server serves a new store.
    """
    settings = Settings(redis_url=None, data_dir=data_dir, summary_trigger_tokens=100_000)
    store = ContextStore.from_settings(settings, tenant="acme")
    await store.append_many("s", [turn(i) for i in range(30)])
    before = [await store.get_messages("s"), (await store.view("s", token_budget=200)).messages]
    admin = Redis.from_url(settings.store_url())
    try:
        async with full(admin):
            cold = ContextStore.from_settings(settings, tenant="acme")
            try:
                got = [
                    await cold.get_messages("s"),
                    (await cold.view("s", token_budget=200)).messages,
                ]
            finally:
                await cold.aclose()
        assert got == before
        calls = [asyncio.ensure_future(c) for c in _calls(store)]
        await store.aclose()
        await asyncio.gather(*calls, return_exceptions=True)
        assert not connected(store)
        for call in _calls(store):
            with pytest.raises(StoreClosedError):
                await call
        await store.aclose()
        assert not connected(store)
        async with ContextStore.from_settings(settings, tenant="acme") as again:
            assert len(await again.get_messages("s")) >= 30
    finally:
        await admin.aclose()


async def test_a_write_the_full_embedded_redis_refuses_is_a_store_full_error(
    data_dir: Path,
) -> None:
    """No URL, the embedded Redis full: an append is refused with StoreFullError."""
    settings = Settings(redis_url=None, data_dir=data_dir)
    admin = Redis.from_url(settings.store_url())
    try:
        async with ContextStore.from_settings(settings, tenant="acme") as store:
            await store.append("s", turn(0))
            async with full(admin):
                with pytest.raises(StoreFullError):
                    await store.append("s", turn(1))
    finally:
        await admin.aclose()


async def test_a_view_whose_anchor_must_move_answers_on_the_full_embedded_redis(
    data_dir: Path,
) -> None:
    """No URL, the embedded Redis full: a first view of a long session is planned and sent."""
    settings = Settings(redis_url=None, data_dir=data_dir, summary_trigger_tokens=100_000)
    admin = Redis.from_url(settings.store_url())
    try:
        async with ContextStore.from_settings(settings, tenant="acme") as store:
            await store.append_many("s", [turn(i) for i in range(40)])
            async with full(admin):
                view = await store.view("s", token_budget=450)
        assert view.stats.dropped > 0
    finally:
        await admin.aclose()


def cluster_open(store: ContextStore) -> list[Any]:
    """The connections of ``store``'s cluster client that are open (every node it knows)."""
    manager = store._connection.client.nodes_manager
    nodes = {id(n): n for n in (*manager.nodes_cache.values(), *manager.startup_nodes.values())}
    return [c for n in nodes.values() for c in n._connections if c.is_connected]


async def test_closing_a_cluster_store_ends_its_calls_in_flight(
    own_cluster: Cluster, server: PrivateRedis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On a cluster, aclose with calls in flight ends them and leaves no connection open.

    Aclose before two tenants' 18 calls run, then as each of their sends in turn waits to
    go: each call lands or fails as a closed store's, and none hangs.
    """
    config = settings_for(
        own_cluster.url,
        redis_cluster=True,
        queue_url=server.url(),
        retry_attempts=2,
        retry_base_delay=0.01,
    )
    odd: list[Any] = []
    for k in [None, *range(200)]:
        root = ContextStore.from_settings(config, tenant="acme")
        beta = root.for_tenant("beta")
        try:
            for store in (root, beta):
                await store.append_many("s", [turn(i) for i in range(20)])
            came, ended = await _closed_at_a_send(monkeypatch, k, (root, beta), root)
            failed = [repr(e) for e in ended if isinstance(e, BaseException)]
            if not came:  # every call ended before a k-th send: each as on an open store
                assert not failed, failed
                await root.aclose()
                assert not cluster_open(root)
                break
            closed = sum(e.startswith("StoreClosedError") for e in failed)
            odd += [(k, e) for e in failed if not e.startswith("StoreClosedError")]
            if k is None:
                assert closed == len(ended)  # closed before any call ran: each fails
            # A call in flight lands or fails as closed (`odd` below): on a cluster the waiting
            # send's own calls were once seen to land, under load, so no count is asked of them.
            assert not cluster_open(root), k
            with pytest.raises(StoreClosedError):
                await beta.get_messages("s")
            assert not cluster_open(root), k
        finally:  # a round that failed leaves no socket for a later test to meet
            await root.aclose()
    assert not odd
    assert k, "the close came at no send"


async def test_a_script_sent_again_after_the_close_opens_no_cluster_connection(
    own_cluster: Cluster, server: PrivateRedis
) -> None:
    """NOSCRIPT, then the close, then the same attempt's EVAL: it opens nothing on any node."""
    config = settings_for(own_cluster.url, redis_cluster=True, queue_url=server.url())
    store = ContextStore.from_settings(config, tenant="acme")
    connection = store._connection
    await store.append("s", turn(0))
    for port in own_cluster.ports:
        node = Redis(port=port)
        await node.script_flush()
        await node.aclose()
    send = connection._send

    async def close_on_noscript(key: str, commands: Any) -> list[Any]:
        replies = await send(key, commands)
        if any(isinstance(reply, rex.NoScriptError) for reply in replies):
            await store.aclose()  # the interleaving under test: the close comes right here
        return replies

    connection._send = close_on_noscript  # type: ignore[method-assign]
    try:
        with pytest.raises(StoreClosedError):
            await store.append("s", turn(1))
        assert store._connection.closed()
        assert not cluster_open(store)
    finally:
        await store.aclose()


async def test_a_script_sent_again_after_the_close_opens_no_connection(
    private: PrivateRedis,
) -> None:
    """NOSCRIPT, then the close, then the same attempt's EVAL: StoreClosedError, none open."""
    store = ContextStore.from_settings(settings_for(private.url()), tenant="acme")
    connection = store._connection
    await store.append("s", turn(0))
    admin = Redis.from_url(private.url())
    await admin.script_flush()
    await admin.aclose()
    send = connection._send

    async def close_on_noscript(key: str, commands: Any) -> list[Any]:
        replies = await send(key, commands)
        if any(isinstance(reply, rex.NoScriptError) for reply in replies):
            await store.aclose()  # the interleaving under test: the close comes right here
        return replies

    connection._send = close_on_noscript  # type: ignore[method-assign]
    with pytest.raises(StoreClosedError):
        await store.append("s", turn(1))
    assert not connected(store)


HOSTILE_IDS = ["1-0\r\nFLUSHALL", "(", "+", "-", "0-0", "", "1-", "abc", "1-0 2-0", "\x00"]
HOSTILE_IDS += ["99999999999999999999-0", "1-99999999999999999999", "-1-0"]


@pytest.mark.parametrize("mode", ["eval", "functions"])
async def test_hostile_ids_get_the_same_answers_on_a_full_redis(
    server: PrivateRedis, mode: str
) -> None:
    """Entry, cursor and branch ids that reach a read: the same answer, or error, once full."""
    await load_library(server.url())
    admin = Redis.from_url(server.url())

    async def answers(store: ContextStore, branch: str) -> list[str]:
        out = []
        for bad in HOSTILE_IDS:
            for read in (
                lambda: store.read("s", after=bad, limit=2),  # noqa: B023
                lambda: store.get_entry("s", bad),  # noqa: B023
                lambda: store.read_branch("s", branch, after=bad),  # noqa: B023
                lambda: store.read_branch("s", bad),  # noqa: B023
            ):
                try:
                    out.append(repr(await read()))
                except CtxstoreError as exc:  # the kind of error is the answer here
                    out.append(type(exc).__name__)
        return out

    try:
        async with ContextStore.from_settings(settings_for(server.url(), mode), tenant="acme") as s:
            written = await s.append_many("s", [turn(i) for i in range(5)])
            await s.rewind("s", written[1].entry_id)
            (branch,) = [b.branch_id for b in await s.branches("s")]
            before = await answers(s, branch)
            async with full(admin):
                assert await answers(s, branch) == before
    finally:
        await admin.aclose()


async def test_calls_waiting_for_a_connection_fail_at_once_when_the_store_closes(
    private: PrivateRedis,
) -> None:
    """Calls waiting for a pooled connection at the close end at once, as closed-store calls.

    One connection, held by a call on a stalled server; three calls wait for it, their
    deadline an hour away: only the close can end them before the test's safety net.
    """
    config = settings_for(
        private.url(), max_connections=1, coalesce_calls=0, operation_timeout=3600
    )
    store = ContextStore.from_settings(config, tenant="acme")
    pool: Any = store._connection.client.connection_pool
    await store.append("s", turn(0))
    private.pause()
    try:
        calls = [asyncio.ensure_future(store.get_messages("s")) for _ in range(4)]
        await loop_until(lambda: len(pool._condition._waiters) == 3)
        await store.aclose()
        async with asyncio.timeout(60):  # a safety net: their deadline is an hour away
            ended = await asyncio.gather(*calls, return_exceptions=True)
        assert all(isinstance(e, StoreClosedError) for e in ended), ended
    finally:
        for call in calls:
            call.cancel()
        private.resume()
        await asyncio.gather(*calls, return_exceptions=True)
        await pool.disconnect()
