"""Each call coalesced into a batch gets its own reply, exactly once, and never waits forever.

Cancellations, killed and restarted servers, new event loops and closing the store try
to make a call see another's replies, lose or double an acknowledged append, leave a
reply unread on a pooled connection, or wait forever; ``coalesce_calls=0`` (every call
alone) is the reference where it says what to expect. In particular: closing the store
ends the calls of a batch made but not yet running, and every call in flight, without
retrying them or leaving a connection open; a call cancelled while its batch waits for a
pooled connection is not written; a connection a finished event loop left fails no call
of a later batch.
"""

from __future__ import annotations

import asyncio
import collections
import gc
import json
import random
import subprocess
import sys
from typing import Any

import pytest
import redis
from redis import exceptions as rex
from redis.asyncio import Redis
from redis.asyncio.cluster import ClusterNode
from support.config import BACKENDS, REPO, cluster_or_skip
from support.helpers import loop_until, private_settings, user
from support.servers import PrivateRedis, redis7_binary

from ctxstore import (
    ContextStore,
    ReplicationError,
    Settings,
    StoreClosedError,
    StoreError,
)
from ctxstore._redis import connection as _connection
from ctxstore._redis.coalescer import Coalescer
from ctxstore.testing import WordCounter


def own_settings(url: str, **changes: Any) -> Settings:
    """Settings on a private Redis, under this file's own prefix."""
    return private_settings(url, "attack", **changes)


def appender(store: ContextStore, sessions: list[str]) -> Any:
    """Appends the n-th message (``session/n``) to its session; answers what it was told."""

    async def append(n: int) -> tuple[str, str, int]:
        s = sessions[n % len(sessions)]
        return s, f"{s}/{n}", (await store.append(s, user(f"{s}/{n}"))).seq

    return append


async def histories_of(store: ContextStore, sessions: list[str]) -> dict[str, list[str]]:
    return {s: [m["content"] for m in await store.get_messages(s)] for s in sessions}


def assert_own_appends(
    histories: dict[str, list[str]], acked: list[tuple[str, str, int]], sent: list[str]
) -> None:
    """Each acknowledged append is in its session once, at the seq it was told; nothing doubled."""
    for session, contents in histories.items():
        doubled = [c for c, n in collections.Counter(contents).items() if n > 1]
        assert not doubled, f"{session}: written twice: {doubled[:5]}"
        assert set(contents) <= set(sent)
    for session, content, seq in acked:
        assert histories[session][seq - 1] == content, (session, content, seq)


async def maybe_cancelled(rng: random.Random, call: Any, chance: float) -> Any:
    """``call``'s result, or None: cancelled (with ``chance``) after 0-10 turns of the loop."""
    task = asyncio.create_task(call)
    for _ in range(rng.randint(0, 10)):  # the interleaving under test
        await asyncio.sleep(0)
    if rng.random() < chance:
        task.cancel()
    try:
        return await task
    except asyncio.CancelledError:
        return None


def broken_sends(store: ContextStore) -> tuple[list[int], list[int]]:
    """The size of each send a lost connection broke, and of each written so far.

    A send's size is its commands' count: a lone call's, or a batch's once its connection
    is in hand (the commands of its calls still waiting then), right before it is written.
    """
    connection, broken, written = store._connection, [], []
    real_send = connection._send

    async def send(key: str, commands: Any) -> list[Any]:
        size: list[int] = []
        if callable(commands):  # a batch's: its calls still waiting once a connection is in hand
            waiting = commands

            def commands() -> list[Any]:
                taken = waiting()
                size.append(len(taken))
                written.append(len(taken))
                return taken

        else:
            size.append(len(commands))
            written.append(len(commands))
        try:
            return await real_send(key, commands)
        except rex.ConnectionError:
            broken.append(size[0] if size else 0)
            raise

    connection._send = send  # type: ignore[method-assign]
    return broken, written


async def test_closing_before_a_made_batch_runs_ends_its_calls() -> None:
    """Aclose once a batch's task is made but has not run yet: its calls still end."""
    coalescer, gate = Coalescer(64), asyncio.Event()

    async def lone(key: str, commands: Any) -> list[Any]:
        await gate.wait()
        return [c[1] for c in (commands() if callable(commands) else commands)]

    first = asyncio.create_task(coalescer.send("", "a", [("GET", "a")], lone))
    await loop_until(lambda: coalescer._in_flight)
    calls = [
        asyncio.create_task(coalescer.send("", f"k{i}", [("GET", f"k{i}")], lone)) for i in range(3)
    ]
    await loop_until(lambda: coalescer._tasks)  # made by the loop's next turn, not stepped yet
    await coalescer.aclose()
    try:
        _, pending = await asyncio.wait(calls, timeout=30)  # a safety net: they end in turns
        assert not pending, f"{len(pending)} calls still wait on a batch that will never run"
    finally:
        for call in calls:
            call.cancel()
        gate.set()
        await first


async def test_closing_the_store_with_appends_in_flight_ends_every_one(
    private: PrivateRedis,
) -> None:
    """Aclose at each of the first turns of 30 appends: every append ends (lands or fails)."""
    settings = own_settings(
        private.url(), operation_timeout=1, retry_attempts=2, retry_base_delay=0.01
    )
    hung = []
    for turns in range(8):
        store = ContextStore.from_settings(settings, tenant="acme")
        await store.append("warm", user("scripts loaded"))
        appends = [asyncio.create_task(store.append(f"s{i}", user("m"))) for i in range(30)]
        for _ in range(turns):  # the interleaving under test: aclose at this turn
            await asyncio.sleep(0)
        await store.aclose()
        # No deadline is left once closed: an append that was to wait forever is still
        # waiting here (a safety net long past any that ends).
        _, pending = await asyncio.wait(appends, timeout=30)
        for append in pending:
            append.cancel()
        await asyncio.gather(*appends, return_exceptions=True)
        # Appends retried after aclose open connections again: closed here (see below).
        await store._connection.client.connection_pool.disconnect()
        if pending:
            hung.append((turns, len(pending)))
    assert not hung, f"(turn of aclose, appends never ended): {hung}"


@pytest.mark.parametrize("most", [0, 64])
async def test_closing_with_calls_in_flight_leaves_no_connection_open(
    private: PrivateRedis, most: int
) -> None:
    """Aclose with 30 appends in flight: they end untried again, and leave no connection open.

    Each either landed or failed as a closed store's call, as does a call made later.
    """
    settings = own_settings(
        private.url(), coalesce_calls=most, retry_attempts=2, retry_base_delay=0.01
    )
    admin = Redis.from_url(private.url())
    store = ContextStore.from_settings(settings, tenant="acme")
    try:
        await store.append("warm", user("scripts loaded"))
        appends = [asyncio.create_task(store.append(f"s{i}", user("m"))) for i in range(30)]
        pool = store._connection.client.connection_pool
        await loop_until(lambda: len(pool._in_use_connections) >= 2)  # a batch's task has run
        await store.aclose()
        ended = await asyncio.wait_for(asyncio.gather(*appends, return_exceptions=True), 10)
        assert len(await admin.client_list()) == 1  # the admin's own
        failed = [result for result in ended if isinstance(result, BaseException)]
        assert failed, "the close came while appends were in flight"
        for error in failed:
            assert isinstance(error, StoreClosedError), repr(error)
        with pytest.raises(StoreClosedError, match="the store is closed"):
            await store.append("warm", user("after the close"))
        assert len(await admin.client_list()) == 1
    finally:
        await store._connection.client.connection_pool.disconnect()
        await admin.aclose()


@pytest.mark.parametrize("most", [0, 64])
async def test_an_append_cancelled_before_it_is_written_never_lands(
    private: PrivateRedis, most: int
) -> None:
    """An append-if cancelled while it waits for a connection is never written: the next applies."""
    settings = own_settings(private.url(), coalesce_calls=most, max_connections=1, retry_attempts=0)
    admin = Redis.from_url(private.url())
    try:
        async with ContextStore.from_settings(settings, tenant="acme") as store:
            await store.append("a", user("a0"))
            await store.append("b", user("b0"))
            pool = store._connection.client.connection_pool
            await admin.execute_command("CLIENT", "PAUSE", 60_000, "WRITE")
            holder = asyncio.create_task(store.append("a", user("a1")))  # holds the connection
            await loop_until(lambda: pool._in_use_connections)
            reader = asyncio.create_task(store.get_messages("b"))  # waits with it, in a batch
            cancelled = asyncio.create_task(store.append("b", user("ghost"), expected_seq=1))
            waiting = 2 if most == 0 else 1  # both alone, or their batch
            await loop_until(lambda: len(pool._condition._waiters) == waiting)
            cancelled.cancel()
            with pytest.raises(asyncio.CancelledError):
                await cancelled
            await admin.execute_command("CLIENT", "UNPAUSE")
            await holder
            assert [m["content"] for m in await reader] == ["b0"]
            await store.append("b", user("real"), expected_seq=1)
            assert [m["content"] for m in await store.get_messages("b")] == ["b0", "real"]
    finally:
        await admin.execute_command("CLIENT", "UNPAUSE")
        await admin.aclose()


@pytest.mark.parametrize("backend", BACKENDS, indirect=True)
async def test_random_cancellation_never_hands_a_call_another_ones_replies(
    settings: Settings,
) -> None:
    """1,200 calls of two tenants on one client, half cancelled at random turns: replies own."""
    tight = settings.model_copy(update={"max_connections": 3, "retry_base_delay": 0.001})
    rng = random.Random(7)
    async with ContextStore.from_settings(tight, tenant=f"ta{rng.getrandbits(40):x}") as a:
        b = a.for_tenant(f"tb{rng.getrandbits(40):x}")
        stores = {"a": a, "b": b}
        sessions = [(t, f"s{i}") for t in stores for i in range(6)]
        for t, s in sessions:
            await stores[t].append(s, user(f"{t}/{s}/0"))
        acked: list[tuple[str, str, int]] = []
        sent: list[str] = [f"{t}/{s}/0" for t, s in sessions]
        wrong: list[Any] = []

        async def one(n: int) -> None:
            t, s = rng.choice(sessions)
            store, mine = stores[t], f"{t}/{s}/"
            kind = rng.choice(["append", "get", "view", "tail"])
            sent.append(f"{mine}{n}")
            call = {
                "append": lambda: store.append(s, user(f"{mine}{n}")),
                "get": lambda: store.get_messages(s),
                "view": lambda: store.view(s, token_budget=100_000),
                "tail": lambda: store.tail(s, 5),
            }[kind]()
            got = await maybe_cancelled(rng, call, 0.5)
            if got is None:
                return
            if kind == "append":
                acked.append((f"{t}/{s}", f"{mine}{n}", got.seq))
                return
            messages = got.messages if kind == "view" else got
            messages = [m.message for m in messages] if kind == "tail" else messages
            assert messages
            wrong.extend(m["content"] for m in messages if not m["content"].startswith(mine))

        for round_ in range(12):
            await asyncio.gather(*(one(round_ * 1000 + i + 1) for i in range(100)))
        assert not wrong, f"replies of other calls: {wrong[:5]}"
        histories = {f"{t}/{s}": (await histories_of(stores[t], [s]))[s] for t, s in sessions}
        assert_own_appends(histories, acked, sent)
        assert all(h[0] == f"{k}/0" for k, h in histories.items())


@pytest.mark.parametrize(("most", "connections"), [(64, 1), (64, 2), (0, 1)])
async def test_an_exhausted_pool_under_cancellation_neither_deadlocks_nor_leaks(
    settings: Settings, tenant: str, most: int, connections: int
) -> None:
    """300 calls on 1-2 connections, a third cancelled: the rest succeed, no connection is lost."""
    tight = settings.model_copy(
        update={"coalesce_calls": most, "max_connections": connections, "operation_timeout": 5}
    )
    rng = random.Random(11)
    async with ContextStore.from_settings(tight, tenant=tenant) as store:
        for i in range(10):
            await store.append(f"s{i}", user(f"s{i}/0"))

        async def one(n: int) -> str:
            s = f"s{n % 10}"
            call: Any = store.append(s, user(f"{s}/{n}")) if n % 3 == 0 else store.get_messages(s)
            got = await maybe_cancelled(rng, call, 1 / 3)
            if got is None:
                return "cancelled"
            if isinstance(got, list):
                assert all(m["content"].startswith(f"{s}/") for m in got)
            return "ok"

        async with asyncio.timeout(30):  # a deadlock fails here
            outcomes = await asyncio.gather(*(one(n) for n in range(300)))
        assert set(outcomes) <= {"ok", "cancelled"} and "ok" in outcomes
        pool = store._connection.client.connection_pool
        assert not pool._in_use_connections
        assert len(pool._available_connections) <= connections
        async with asyncio.timeout(5):
            got = await asyncio.gather(*(store.get_messages(f"s{i}") for i in range(10)))
        assert all(h[0]["content"] == f"s{i}/0" for i, h in enumerate(got))


@pytest.mark.parametrize("most", [64, 0])
async def test_connections_killed_at_random_turns_lose_and_double_no_append(
    private: PrivateRedis, most: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ten waves of 100 appends, every store connection killed at a chosen send: acks hold, once.

    In each wave the kill comes once the chosen send's replies are all read (every command
    of it ran) and before its caller gets them: they are lost, and each of its appends is
    retried after it landed (a batch's, with 64). The kill takes the store's other
    connections with it, wherever their sends are then.
    """
    settings = own_settings(
        private.url(),
        coalesce_calls=most,
        retry_attempts=20,
        retry_base_delay=0.001,
        retry_max_delay=0.01,
    )
    admin = Redis.from_url(private.url())
    rng = random.Random(5)
    read_replies = _connection.read_replies
    # Which send of the wave is broken: of its batches (at least two: 99 calls, 64 at
    # most in one, beside the first call alone) with 64, of its 100 lone calls with 0.
    least = 2 if most else 1
    chosen = [rng.randint(0, 1) if most else rng.randint(0, 99) for _ in range(10)]
    wave, seen, killed = 0, 0, []

    async def killing(conn: Any, n: int) -> list[Any]:
        nonlocal seen
        replies = await read_replies(conn, n)
        if n < least or len(killed) > wave:
            return replies
        seen += 1
        if seen <= chosen[wave]:
            return replies
        killed.append(n)  # this wave's kill: here, its replies read, their caller not told
        await admin.execute_command("CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes")
        raise rex.ConnectionError("the server closed the connection")

    try:
        async with ContextStore.from_settings(settings, tenant="acme") as store:
            sessions = [f"s{i}" for i in range(6)]
            for s in sessions:
                await store.append(s, user(f"{s}/first"))
            (broken, _), append, results = broken_sends(store), appender(store, sessions), []
            monkeypatch.setattr(_connection, "read_replies", killing)
            for wave in range(10):
                seen = 0
                results += await asyncio.gather(
                    *(append(wave * 100 + n) for n in range(100)), return_exceptions=True
                )
                assert len(killed) == wave + 1, f"wave {wave}: its chosen send never came"
            monkeypatch.setattr(_connection, "read_replies", read_replies)
            assert len(broken) >= 10, broken  # the kills' sends, and any others they broke
            if most:
                assert min(killed) > 1, killed  # each kill broke a batch
            acked = [r for r in results if isinstance(r, tuple)]
            assert len(acked) == 1000, [r for r in results if not isinstance(r, tuple)][:3]
            histories = await histories_of(store, sessions)
            sent = [f"s{n % 6}/{n}" for n in range(1000)] + [f"{s}/first" for s in sessions]
            assert_own_appends(histories, acked, sent)
            assert sum(map(len, histories.values())) == 1006
    finally:
        await admin.aclose()


async def test_a_redis_restarted_mid_batch_keeps_every_acknowledged_append_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A durable Redis killed and restarted under 200 appends: each acked one is there, once.

    The kill comes once the first batch's replies are read (each of its appends ran, and is
    in the append-only file) and before its calls get them; the restart, before any call
    runs again.
    """
    binary = redis7_binary()
    if binary is None:
        pytest.skip("needs Redis 7")
    server = PrivateRedis(binary, durable=True).start()
    try:
        settings = own_settings(
            server.url(), retry_attempts=30, retry_base_delay=0.01, retry_max_delay=0.05
        )
        async with ContextStore.from_settings(settings, tenant="acme") as store:
            sessions = [f"s{i}" for i in range(5)]
            for s in sessions:
                await store.append(s, user(f"{s}/first"))
            (broken, _), append = broken_sends(store), appender(store, sessions)
            read_replies, killed = _connection.read_replies, []

            async def dying(conn: Any, n: int) -> list[Any]:
                replies = await read_replies(conn, n)
                if n > 1 and not killed:  # the first batch's
                    killed.append(n)
                    server.kill()
                    server.start()  # on its append-only file: what it acknowledged
                    raise rex.ConnectionError("the server closed the connection")
                return replies

            monkeypatch.setattr(_connection, "read_replies", dying)
            results = await asyncio.gather(*(append(n) for n in range(200)), return_exceptions=True)
            monkeypatch.setattr(_connection, "read_replies", read_replies)
            assert killed, "no batch was sent"
            assert max(broken) > 1, broken  # a batch was on the wire when it died
            acked = [r for r in results if isinstance(r, tuple)]
            assert len(acked) == 200, [r for r in results if not isinstance(r, tuple)][:3]
            histories = await histories_of(store, sessions)
            sent = [f"s{n % 5}/{n}" for n in range(200)] + [f"{s}/first" for s in sessions]
            assert_own_appends(histories, acked, sent)
            assert sum(map(len, histories.values())) == 205
    finally:
        server.stop()


async def test_transactions_refused_at_queue_or_exec_time_stay_their_own(
    private: PrivateRedis,
) -> None:
    """EXECABORT, WRONGTYPE in EXEC, EXEC without MULTI, beside scripts and reads: each its own."""
    settings = own_settings(private.url())
    raw = Redis.from_url(private.url())
    try:
        async with ContextStore.from_settings(settings, tenant="acme") as store:
            for i in range(6):
                await store.append(f"s{i}", user(f"s{i}/0"))
            wrong = "attack:string"
            await raw.set(wrong, "a string")
            connection = store._connection
            odd = [
                connection.transaction([("GET", wrong), ("NOSUCHCOMMAND",)], key=wrong),
                connection.transaction([("GET", wrong), ("XLEN", wrong)], key=wrong),
                connection.transaction([("EXEC",), ("GET", wrong)], key=wrong),
                connection.batch([("GET", wrong), ("NOSUCHCOMMAND",)], key=wrong),
            ]
            async with asyncio.timeout(10):
                results = await asyncio.gather(
                    store.get_messages("s0"),  # alone: the rest find it in flight
                    *odd,
                    *(store.append(f"s{i}", user(f"s{i}/1")) for i in range(6)),
                    *(store.get_messages(f"s{i}") for i in range(6)),
                    connection.transaction([("GET", wrong)], key=wrong),
                    return_exceptions=True,
                )
            assert all(isinstance(r, StoreError) for r in results[1:5]), results[1:5]
            assert "EXECABORT" in str(results[1]) or "unknown command" in str(results[1])
            assert "WRONGTYPE" in str(results[2])
            assert [r.seq for r in results[5:11]] == [2] * 6
            for i, history in enumerate(results[11:17]):
                assert history[0]["content"] == f"s{i}/0"
            assert results[17] == [b"a string"]
            for i in range(6):  # no MULTI left open on a pooled connection
                got = await store.get_messages(f"s{i}")
                assert [m["content"] for m in got] == [f"s{i}/0", f"s{i}/1"]
    finally:
        await raw.aclose()


async def test_messages_near_the_largest_share_batches_with_small_calls(
    settings: Settings, tenant: str
) -> None:
    """Six appends and views of ~1 MiB messages among 120 small calls: each gets its own, whole."""
    async with ContextStore.from_settings(settings, tenant=tenant, counter=WordCounter()) as store:
        size = settings.max_message_bytes - 200
        big = {f"big{i}": chr(ord("a") + i) * size for i in range(6)}
        for i in range(20):
            await store.append(f"s{i}", user(f"s{i}/0"))
        async with asyncio.timeout(30):
            results = await asyncio.gather(
                *(store.append(s, user(text)) for s, text in big.items()),
                *(store.append(f"s{i % 20}", user(f"s{i % 20}/{i}")) for i in range(60)),
                *(store.get_messages(f"s{i % 20}") for i in range(60)),
            )
            views = await asyncio.gather(
                *(store.view(s, token_budget=100_000) for s in big),
                *(store.get_messages(f"s{i}") for i in range(20)),
            )
        assert [r.seq for r in results[:6]] == [1] * 6
        for history in results[66:]:
            session = history[0]["content"].split("/")[0]
            assert all(m["content"].startswith(f"{session}/") for m in history)
        for (session, text), view in zip(big.items(), views[:6], strict=True):
            assert [m["content"] for m in view.messages] == [text], session
        for i, history in enumerate(views[6:]):
            contents = [m["content"] for m in history]
            assert sorted(contents) == sorted(
                [f"s{i}/0", *(f"s{i}/{n}" for n in range(60) if n % 20 == i)]
            )


async def test_writes_waiting_for_replicas_each_hold_a_connection_of_their_own(
    private: PrivateRedis,
) -> None:
    """Twenty appends that WAIT for a replica, with reads: each WAIT alone, the reads not held.

    Each WAIT waits a minute (no replica will answer): until the test ends it (CLIENT
    UNBLOCK, as its timeout would), so none ends before the others and the reads are there.
    """
    settings = own_settings(
        private.url(),
        replica_acks=1,
        replica_ack_timeout_ms=60_000,
        operation_timeout=120,
        retry_attempts=0,
    )
    admin = Redis.from_url(private.url())

    async def in_wait() -> list[int]:
        clients = await admin.client_list()
        return [int(c["id"]) for c in clients if c["cmd"] == "wait" and "b" in c["flags"]]

    try:
        async with ContextStore.from_settings(settings, tenant="acme") as store:
            for i in range(20):
                await store.get_messages(f"s{i}")  # scripts and tenant state warm, no write
            appends = asyncio.gather(
                *(store.append(f"s{i}", user(f"s{i}/0")) for i in range(20)),
                return_exceptions=True,
            )

            while len(await in_wait()) < 20:
                assert not appends.done()  # until each WAITs on a connection of its own
            reads = await asyncio.gather(*(store.get_messages(f"s{i}") for i in range(20)))
            assert not appends.done()  # the reads were not held behind any WAIT
            assert all(len(r) <= 1 for r in reads)
            async with asyncio.timeout(60):  # a safety net
                while not appends.done():  # each WAIT ended now, as at its timeout
                    for client in await in_wait():
                        await admin.execute_command("CLIENT", "UNBLOCK", client)
            results = await appends
            assert all(isinstance(r, ReplicationError) for r in results)  # there is no replica
    finally:
        await admin.aclose()


_TWO_LOOPS = r"""
import asyncio, json, sys
from ctxstore import ContextStore, Settings
settings = Settings(redis_url=sys.argv[1], key_prefix="attack", queue_name="attack:summaries",
    script_mode="eval", coalesce_calls=int(sys.argv[2]), retry_attempts=2, operation_timeout=2)
rounds = []
for turns in [*range(12), None]:
    store = ContextStore.from_settings(settings, tenant="acme")
    async def first():
        await store.append("warm", {"role": "user", "content": "x"})
        for i in range(20):
            asyncio.ensure_future(store.append(f"s{i}", {"role": "user", "content": "m"}))
        for _ in range(turns or 0):
            await asyncio.sleep(0)
        # None: every append, and what it left to run (an index touch), ends first: their
        # connections stay in the pool, connected, for the next loop to meet.
        while turns is None and (rest := asyncio.all_tasks() - {asyncio.current_task()}):
            await asyncio.gather(*rest, return_exceptions=True)
    asyncio.run(first())  # ends with the appends in flight (asyncio.run cancels them)
    pool = store._connection.client.connection_pool
    stale = sum(c.is_connected for c in [*pool._available_connections, *pool._in_use_connections])
    async def second():
        got = await asyncio.gather(*(store.get_messages(f"s{i}") for i in range(20)),
                                   return_exceptions=True)
        failed = [repr(r) for r in got if isinstance(r, BaseException)]
        try:
            await store.aclose()
        except Exception as exc:
            failed.append("aclose: " + repr(exc))
        return failed
    rounds.append([turns, stale, asyncio.run(second())])
print(json.dumps(rounds))
"""


@pytest.mark.parametrize("most", [0, 64])
def test_a_new_event_loop_fails_no_call_on_connections_left_behind(
    private: PrivateRedis, most: int
) -> None:
    """asyncio.run again after one ended with appends in flight: no call or close fails.

    Ended at each of the first turns of 20 appends, then once they all ended (the first
    loop's connections left in the pool, connected, by construction). The sockets the
    first loop left are closed, not left to warn when collected. In a process of its own,
    where every ResourceWarning is shown.
    """
    done = subprocess.run(
        [
            sys.executable,
            "-W",
            "always::ResourceWarning",
            "-c",
            _TWO_LOOPS,
            private.url(),
            str(most),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
        check=True,
    )
    rounds = json.loads(done.stdout.strip().splitlines()[-1])
    assert rounds[-1][1] > 0, "the round whose appends ended left no connection behind"
    failed = [(turns, stale, failed) for turns, stale, failed in rounds if failed]
    assert not failed, f"(turns, connections left, failures): {failed[:3]}"
    assert "ResourceWarning" not in done.stderr, done.stderr[-2000:]


def move_slot(cluster: Any, key: str) -> None:
    """Move ``key``'s slot, and its keys, to another primary (MIGRATE, then SETSLOT NODE)."""
    source = cluster.primary_of(key)
    target = next(port for port in cluster.primaries() if port != source)
    nodes = {port: redis.Redis(port=port) for port in cluster.primaries()}
    try:
        slot = int(nodes[source].execute_command("CLUSTER", "KEYSLOT", key))
        ids = {
            port: node.execute_command("CLUSTER", "MYID").decode() for port, node in nodes.items()
        }
        nodes[target].execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", ids[source])
        nodes[source].execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", ids[target])
        while keys := nodes[source].execute_command("CLUSTER", "GETKEYSINSLOT", slot, 100):
            nodes[source].execute_command(
                "MIGRATE", "127.0.0.1", target, "", 0, 5000, "KEYS", *keys
            )
        for node in nodes.values():
            node.execute_command("CLUSTER", "SETSLOT", slot, "NODE", ids[target])
    finally:
        for node in nodes.values():
            node.close()
    assert cluster.primary_of(key) == target


async def test_a_session_whose_slot_moved_fails_none_of_its_batch_mates() -> None:
    """A cluster of three: one session's slot moved; 240 calls on every node each succeed, own."""
    with cluster_or_skip(primaries=3, replicas=0) as cluster:
        settings = own_settings(
            cluster.url, redis_cluster=True, retry_attempts=3, retry_base_delay=0.01
        )
        async with ContextStore.from_settings(settings, tenant="acme") as store:
            sessions = [f"s{i}" for i in range(12)]
            for s in sessions:
                await store.append(s, user(f"{s}/0"))
            nodes = {store._connection._node_of(store.keys(s).log) for s in sessions}
            assert len(nodes) == 3  # sessions on every node
            move_slot(cluster, store.keys("s0").log)
            connection, refreshed = store._connection, []
            refresh = connection._refresh_topology

            async def counted() -> None:
                refreshed.append(1)
                await refresh()

            connection._refresh_topology = counted  # type: ignore[method-assign]
            append = appender(store, sessions)
            async with asyncio.timeout(30):
                results = await asyncio.gather(
                    *(append(n) for n in range(1, 121)),
                    *(store.get_messages(sessions[n % 12]) for n in range(120)),
                )
            for n, history in enumerate(results[120:]):
                assert all(m["content"].startswith(f"{sessions[n % 12]}/") for m in history)
            histories = await histories_of(store, sessions)
            sent = [f"{s}/0" for s in sessions] + [f"{sessions[n % 12]}/{n}" for n in range(1, 121)]
            assert_own_appends(histories, list(results[:120]), sent)
            assert all(len(h) == 11 for h in histories.values())
            assert refreshed  # s0's calls were told MOVED, and read the topology again
            # No node the topology read replaced holds a connection still open (its sockets
            # would be held by nothing, and warn when collected).
            manager = store._connection.client.nodes_manager
            current = {
                id(n) for n in [*manager.nodes_cache.values(), *manager.startup_nodes.values()]
            }
            replaced = [
                n for n in gc.get_objects() if isinstance(n, ClusterNode) and id(n) not in current
            ]
            assert not [c for n in replaced for c in n._connections if c.is_connected]
