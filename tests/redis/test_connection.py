"""The store's edge: connections handed out without redis-py's readiness check only when clean.

redis-py tries a non-blocking read on a pooled connection before it hands it
out, in case its last user left a reply unread. The store's pool skips that
check, once, for a connection the store itself gave back with every reply
read; everything else (redis-py's own commands, a connection that failed, a
call cancelled mid-read) still goes through it, so no caller ever reads
another call's reply.
"""

from __future__ import annotations

import asyncio
from types import ModuleType
from typing import Any

import pytest
from redis import exceptions as rex
from redis.asyncio import Redis
from redis.asyncio import connection as rconn
from support.servers import PrivateRedis

from ctxstore import ContextStore, Settings
from ctxstore._redis import connection as _connection
from ctxstore._redis import wire
from ctxstore._redis.client import make_client
from ctxstore._redis.pool import Pool
from ctxstore._redis.scripts import SCRIPTS
from ctxstore.errors import ConfigurationError, StoreUnavailableError


@pytest.fixture
def checks(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """The connections redis-py's own readiness check ran on, in order."""
    seen: list[Any] = []
    original = rconn.ConnectionPool.ensure_connection

    async def spy(self: Any, connection: Any) -> None:
        seen.append(connection)
        await original(self, connection)

    monkeypatch.setattr(rconn.ConnectionPool, "ensure_connection", spy)
    return seen


async def test_the_store_skips_the_check_only_for_connections_it_gave_back_clean(
    settings: Settings, tenant: str, checks: list[Any]
) -> None:
    """Store calls skip the check on what they gave back; what redis-py gives back is checked."""
    async with ContextStore.from_settings(settings, tenant=tenant) as store:
        pool = store._connection.client.connection_pool
        assert isinstance(pool, Pool)
        await store.append("s", {"role": "user", "content": "one"})
        first = len(checks)
        for i in range(20):
            await store.append("s", {"role": "user", "content": f"m{i}"})
            await store.view("s", token_budget=500)
        assert len(checks) == first  # every connection came back clean
        await store._connection.client.ping()  # redis-py's own command, on a clean connection
        await store.view("s", token_budget=500)  # ping() gave it back: checked
        assert len(checks) == first + 1
        await store.view("s", token_budget=500)
        assert len(checks) == first + 1


async def closed_by_the_server(pool: Any, url: str) -> list[Any]:
    """Close every pooled connection from the server's side; return once the loop saw each end."""
    idle = list(pool._available_connections)
    admin = Redis.from_url(url)
    try:
        mine = await admin.client_id()
        for client in await admin.client_list():  # a private server: every other client is ours
            if int(client["id"]) != mine:
                await admin.client_kill_filter(_id=int(client["id"]))
    finally:
        await admin.aclose()
    for connection in idle:
        while not connection._reader.at_eof():  # noqa: ASYNC110 - waits on a condition
            await asyncio.sleep(0.001)
    return idle


async def test_connections_the_server_closed_while_idle_cost_no_attempt(
    private: PrivateRedis, tenant: str
) -> None:
    """CLIENT KILL, an idle timeout or a proxy's reset: with no retries at all, calls succeed."""
    # Each call alone, on a connection of its own: six connections for the server to close.
    settings = Settings(redis_url=private.url(), retry_attempts=0, coalesce_calls=0)
    async with ContextStore.from_settings(settings, tenant=tenant) as store:
        await asyncio.gather(
            *(store.append(f"s{i}", {"role": "user", "content": "first"}) for i in range(6))
        )
        pool = store._connection.client.connection_pool
        assert len(await closed_by_the_server(pool, private.url())) == 6
        # More callers than before, each on a connection the server closed, none retried.
        read = await asyncio.gather(*(store.get_messages(f"s{i % 6}") for i in range(12)))
        assert read == [[{"role": "user", "content": "first"}]] * 12
        await closed_by_the_server(pool, private.url())
        await asyncio.gather(
            *(store.append(f"s{i}", {"role": "user", "content": "second"}) for i in range(6))
        )
        for i in range(6):
            assert len(await store.get_messages(f"s{i}")) == 2


async def test_a_restart_costs_a_retry_not_an_error_nor_a_lost_or_doubled_append(
    private: PrivateRedis, tenant: str
) -> None:
    """Connections a restart closed while idle fail once each and are retried; none twice."""
    settings = Settings(
        redis_url=private.url(), retry_attempts=1, retry_base_delay=0.01, connect_timeout=1.0
    )
    async with ContextStore.from_settings(settings, tenant=tenant) as store:
        # Eight connections in the pool, each given back clean by a store call.
        await asyncio.gather(
            *(store.append(f"s{i}", {"role": "user", "content": "first"}) for i in range(8))
        )
        private.kill()
        private.start()  # not durable: the sessions are gone, the connections are closed
        results = await asyncio.gather(
            *(store.append(f"s{i}", {"role": "user", "content": "second"}) for i in range(8)),
            *(store.view(f"s{i}", token_budget=500) for i in range(8)),
        )
        assert len(results) == 16
        for i in range(8):
            history = await store.get_messages(f"s{i}")
            assert history == [{"role": "user", "content": "second"}]


async def test_a_call_cancelled_mid_reply_never_hands_its_reply_to_the_next(
    private: PrivateRedis, tenant: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A cancelled call's connection is closed, not marked clean: the next call reads its own."""
    settings = Settings(redis_url=private.url(), retry_attempts=0)
    waiting = asyncio.Event()
    original = rconn.Connection.send_packed_command

    async def send_packed_command(self: Any, *args: Any, **kwargs: Any) -> Any:
        await original(self, *args, **kwargs)
        waiting.set()  # the command is sent; its reply is awaited

    async with ContextStore.from_settings(settings, tenant=tenant) as store:
        await store.append("a", {"role": "user", "content": "in a"})
        await store.append("b", {"role": "user", "content": "in b"})
        monkeypatch.setattr(rconn.Connection, "send_packed_command", send_packed_command)
        private.pause()  # the next call's command is sent, its reply never comes
        try:
            pending = asyncio.create_task(store.get_messages("a"))
            await waiting.wait()
            pending.cancel()
            with pytest.raises(asyncio.CancelledError):
                await pending
        finally:
            private.resume()
        for _ in range(5):
            assert await store.get_messages("b") == [{"role": "user", "content": "in b"}]


async def test_a_waiting_caller_gets_a_freed_connection_before_the_fast_hand_out(
    private: PrivateRedis,
) -> None:
    """The hand-out without redis-py's lock is taken only while nobody waits for a connection."""
    pool = Pool.from_url(private.url(), max_connections=1, timeout=5)
    try:
        held = await pool.get_connection()
        assert pool.take_idle() is None  # none idle
        waiter = asyncio.create_task(pool.get_connection())
        while not pool._condition._waiters:  # noqa: ASYNC110 - waits on a condition
            await asyncio.sleep(0)
        pool.mark_clean(held)
        await pool.release(held)  # wakes the waiter, which has not run yet
        assert pool.take_idle() is None  # the waiter goes first
        assert await waiter is held
        pool.mark_clean(held)
        await pool.release(held)
        assert pool.take_idle() is held  # nobody waits: taken at once
        assert held in pool._in_use_connections and not pool._available_connections
        assert pool.take_idle() is None
        await pool.release(held)  # given back by redis-py's way: not marked clean
        assert pool.take_idle() is None
        assert await pool.get_connection() is held  # checked, then handed out
    finally:
        await pool.disconnect()


async def test_without_the_internals_it_relies_on_the_pool_hands_out_the_usual_way(
    private: PrivateRedis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A redis-py or asyncio whose pool or condition is built otherwise: no fast hand-out."""

    class Condition(asyncio.Condition):
        """A condition keeping its waiters in some other way."""

        def __init__(self) -> None:
            super().__init__()
            self._waiters = list(self._waiters)  # type: ignore[assignment]

    monkeypatch.setattr(rconn.asyncio, "Condition", Condition)
    pool = Pool.from_url(private.url(), max_connections=2, timeout=5)
    try:
        connection = await pool.get_connection()
        pool.mark_clean(connection)
        await pool.release(connection)
        assert pool.take_idle() is None
        assert await pool.get_connection() is connection  # the usual way still works
        await pool.release(connection)
    finally:
        await pool.disconnect()


async def test_replies_come_whole_and_in_order_with_error_replies_as_objects(
    private: PrivateRedis, tenant: str
) -> None:
    """Replies read past redis-py's read_response: one over many socket reads, errors in place."""
    settings = Settings(redis_url=private.url(), retry_attempts=0)
    big = b"x" * 300_000  # several reads of the socket
    async with ContextStore.from_settings(settings, tenant=tenant) as store:
        replies = await store._connection.node_call(
            "k", [("SET", "k", big), ("GET", "k"), ("INCR", "k"), ("PING",), ("STRLEN", "k")]
        )
        assert replies[:2] == [b"OK", big]
        assert isinstance(replies[2], rex.ResponseError) and "not an integer" in str(replies[2])
        assert replies[3:] == [b"PONG", len(big)]
        assert await store._connection.node_call("k", [("STRLEN", "k")]) == [len(big)]


async def test_a_reply_redis_py_raises_as_a_connection_error_is_raised(
    private: PrivateRedis, tenant: str
) -> None:
    """A server loading its data answers -LOADING: raised as redis-py raises it, to be retried."""
    if not isinstance(getattr(wire, "hiredis", None), ModuleType):
        pytest.skip("the replies are read by redis-py itself without hiredis")
    settings = Settings(redis_url=private.url(), retry_attempts=0)
    async with ContextStore.from_settings(settings, tenant=tenant) as store:
        await store.append("s", {"role": "user", "content": "one"})
        pool = store._connection.client.connection_pool
        (idle,) = pool._available_connections
        idle._parser._reader.feed(b"-LOADING Redis is loading the dataset in memory\r\n")
        with pytest.raises(rex.BusyLoadingError):
            await wire.read_replies(idle, 1)
        idle._parser._reader.feed(b"*2\r\n-LOADING Redis is loading\r\n+OK\r\n")
        with pytest.raises(rex.BusyLoadingError):
            await wire.read_replies(idle, 1)


@pytest.mark.parametrize("protocol", [2, 3])
async def test_replies_past_redis_py_only_on_resp2(private: PrivateRedis, protocol: int) -> None:
    """RESP3 may push a frame between replies, which only redis-py's own reading skips."""
    if not isinstance(getattr(wire, "hiredis", None), ModuleType):
        pytest.skip("the replies are read by redis-py itself without hiredis")
    # No socket timeout (redis-py 8 sets one by default), as the store's own clients.
    client = Redis.from_url(private.url(), protocol=protocol, socket_timeout=None)
    try:
        conn = await client.connection_pool.get_connection()
        asked: list[int] = []
        original = conn.read_response

        async def read_response(*args: Any, **kwargs: Any) -> Any:
            asked.append(1)
            return await original(*args, **kwargs)

        conn.read_response = read_response
        await conn.send_packed_command(wire.pack(conn, [("PING",), ("ECHO", "x")]))
        assert await wire.read_replies(conn, 2) == [b"PONG", b"x"]
        assert len(asked) == (2 if protocol == 3 else 0)
        await client.connection_pool.release(conn)
    finally:
        await client.aclose()


def test_a_redis_url_asking_for_resp3_is_refused() -> None:
    """redis-py lets a URL's protocol= override the store's RESP2 client: refused up front."""
    with pytest.raises(ConfigurationError, match="RESP2"):
        Settings(redis_url="redis://127.0.0.1:6379/0?protocol=3")
    assert Settings(redis_url="redis://127.0.0.1:6379/0?protocol=2").redis_url


async def test_commands_after_a_script_share_its_round_trip_and_never_fail_it(
    private: PrivateRedis, tenant: str, caplog: pytest.LogCaptureFixture
) -> None:
    """One trip; a refused command after the script is logged, and on NOSCRIPT is not re-sent.

    By EVALSHA (test_script_mode.py has the same for an FCALL refused for want of a library).
    """
    settings = Settings(redis_url=private.url(), retry_attempts=0, script_mode="eval")
    async with ContextStore.from_settings(settings, tenant=tenant) as store:
        connection = store._connection
        trips: list[list[tuple[Any, ...]]] = []
        real = connection.node_call

        async def node_call(key: str, commands: Any, **kwargs: Any) -> Any:
            trips.append(list(commands))
            return await real(key, commands, **kwargs)

        connection.node_call = node_call  # type: ignore[method-assign]
        await connection.node_call("text", [("SET", "text", "v")])
        script = SCRIPTS.set_ttl
        await store._connection.client.script_flush()  # the first run meets NOSCRIPT
        trips.clear()
        with caplog.at_level("WARNING", logger="ctxstore"):
            reply = await connection.script(
                script,
                ("k:log", "k:meta"),
                ("1000",),
                after=[("INCR", "count"), ("ZADD", "text", "XX", 1, "m")],
            )
        assert reply == [0]  # no such session: the script ran
        assert [trip[0][0] for trip in trips] == ["EVALSHA", "EVAL"]
        assert [command[0] for command in trips[0][1:]] == ["INCR", "ZADD"]
        assert trips[1][1:] == []  # what came after the script ran once, in the first trip
        assert int(await connection.client.get("count")) == 1
        assert "ZADD after set_ttl refused" in caplog.text and "WRONGTYPE" in caplog.text


async def test_commands_after_a_script_are_refused_on_a_cluster(cluster: Any, tenant: str) -> None:
    """A cluster node may not own what comes after a script: a programming error, said at once."""
    settings = Settings(redis_url=cluster.url, redis_cluster=True)
    async with ContextStore.from_settings(settings, tenant=tenant) as store:
        with pytest.raises(ValueError, match="standalone only"):
            await store._connection.script(
                SCRIPTS.set_ttl, ("k:log", "k:meta"), ("1000",), after=[("PING",)]
            )


async def test_a_stalled_server_fails_a_call_at_its_deadline_and_the_next_call_works(
    private: PrivateRedis, tenant: str
) -> None:
    """No reply: each try ends at operation_timeout, then a typed error; nothing hangs."""
    settings = Settings(
        redis_url=private.url(), operation_timeout=1.0, retry_attempts=1, retry_max_delay=0.01
    )
    async with ContextStore.from_settings(settings, tenant=tenant) as store:
        await store.append("s", {"role": "user", "content": "before"})
        private.pause()
        try:
            with pytest.raises(StoreUnavailableError, match="2 attempts") as caught:
                async with asyncio.timeout(30):  # a missed deadline fails here, not hangs
                    await store.view("s", token_budget=500)
            # Each try ended at its deadline, not at another error.
            assert isinstance(caught.value.__cause__, TimeoutError)
            assert "operation_timeout" in str(caught.value.__cause__)
        finally:
            private.resume()
        assert await store.get_messages("s") == [{"role": "user", "content": "before"}]


async def test_a_deadline_ends_only_its_own_call(
    settings: Settings, tenant: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One timer keeps every call's deadline: the stalled call ends, the others finish theirs.

    The others, made one after another while the stalled call waits, each well within
    their deadline: none ends at it.
    """
    quick = settings.model_copy(update={"operation_timeout": 1.0, "retry_attempts": 0})
    async with ContextStore.from_settings(quick, tenant=tenant) as store:
        await store.append("s", {"role": "user", "content": "x"})
        connection = store._connection
        real = connection.node_call
        never = asyncio.Event()
        stalled = asyncio.Event()

        async def node_call(key: str, commands: Any, **kwargs: Any) -> Any:
            if any(c[0] == "XREVRANGE" for c in commands) and not stalled.is_set():
                stalled.set()
                await never.wait()  # this call's reply never comes
            return await real(key, commands, **kwargs)

        monkeypatch.setattr(connection, "node_call", node_call)
        stuck = asyncio.create_task(store.view("s", token_budget=500))
        await stalled.wait()
        finished = 0
        async with asyncio.timeout(30):  # a missed deadline fails here, not hangs
            while not stuck.done():  # others start and end meanwhile
                assert await store.get_messages("s") == [{"role": "user", "content": "x"}]
                finished += 1
            with pytest.raises(StoreUnavailableError) as caught:
                await stuck
        assert isinstance(caught.value.__cause__, TimeoutError)  # its deadline ended it
        assert finished  # the first was made while the stalled call waited
        assert await store.view("s", token_budget=500)  # a later call has its own deadline


async def test_a_cancel_from_outside_is_a_cancellation_not_a_timeout(
    settings: Settings, tenant: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A task cancelled by its caller while its call waits gets CancelledError, and no retry."""
    async with ContextStore.from_settings(settings, tenant=tenant) as store:
        await store.append("s", {"role": "user", "content": "x"})
        connection = store._connection
        real = connection.node_call
        waiting = asyncio.Event()
        calls = []

        async def node_call(key: str, commands: Any, **kwargs: Any) -> Any:
            calls.append(commands[0][0])
            waiting.set()
            await asyncio.Event().wait()
            return await real(key, commands, **kwargs)

        monkeypatch.setattr(connection, "node_call", node_call)
        task = asyncio.create_task(store.get_messages("s"))
        await waiting.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert len(calls) == 1
        assert connection._deadlines._calls == {}  # nothing left to expire


async def test_a_clean_connection_goes_back_at_once_unless_someone_waits(
    private: PrivateRedis,
) -> None:
    """give_back skips redis-py's return only while nobody waits; a waiter is woken."""
    pool = Pool.from_url(private.url(), max_connections=1, timeout=5)
    try:
        held = await pool.get_connection()
        pool.mark_clean(held)
        await pool.give_back(held)
        assert pool._available_connections == [held] and not pool._in_use_connections
        assert pool.take_idle() is held
        waiter = asyncio.create_task(pool.get_connection())
        while not pool._condition._waiters:  # noqa: ASYNC110 - waits on a condition
            await asyncio.sleep(0)
        pool.mark_clean(held)
        await pool.give_back(held)  # redis-py's way: the waiter is woken
        assert await waiter is held
        await pool.give_back(held)  # not marked clean: redis-py's way too
        assert pool._available_connections == [held]
    finally:
        await pool.disconnect()


def test_a_connection_used_again_on_a_new_event_loop_keeps_its_deadlines(
    private: PrivateRedis,
) -> None:
    """asyncio.run twice on one store's connection: the second loop's calls still time out."""
    settings = Settings(
        redis_url=private.url(), operation_timeout=1.0, retry_attempts=0, retry_max_delay=0.01
    )
    connection = _connection.Connection(make_client(private.url(), settings), settings)

    async def ping() -> Any:
        return await connection.call(lambda: connection.node_call("k", [("PING",)]))

    async def first() -> None:
        assert await ping() == [b"PONG"]
        await connection.client.connection_pool.disconnect()  # its sockets are this loop's

    async def stalled() -> None:
        with pytest.raises(StoreUnavailableError):
            async with asyncio.timeout(10):  # a missed deadline fails here, not hangs
                await ping()
        await connection.aclose()

    asyncio.run(first())
    private.pause()
    try:
        asyncio.run(stalled())
    finally:
        private.resume()
