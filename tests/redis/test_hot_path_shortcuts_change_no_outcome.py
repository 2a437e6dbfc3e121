"""The hot path's shortcuts change no call's outcome: deadlines, the pool's fast return, copies.

One timer for every call's deadline (``deadlines.Deadlines``): each stalled call still
gets its full deadline, a cancellation stays one, and a deadline in the middle of a big
reply never hands it to the next call. The pool's fast return (``pool.Pool.give_back``):
exhaustion under random cancels never deadlocks, idle connections the server killed are
replaced, and a waiter woken and cancelled in the same turn of the loop leaves the free
connection to the next waiter (asyncio.Condition on Python 3.11 took the wake-up with
it). A view's copy made ahead (``_make_ready``): callers that vandalize every view never
change a later one. Concurrent first summaries open one queue.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import random
import uuid
from typing import Any

import pytest
from redis.asyncio import Redis
from support.helpers import (
    SYSTEM,
    an_call,
    an_result,
    assistant,
    loop_until,
    oa_call,
    oa_result,
    turn,
    user,
)
from support.servers import PrivateRedis

from ctxstore import ContextStore, RequestView, Settings
from ctxstore._redis import connection as _connection
from ctxstore._redis.client import make_client
from ctxstore.errors import StoreClosedError, StoreUnavailableError


def connection_to(
    url: str, timeout: float, attempts: int = 0, **more: Any
) -> _connection.Connection:
    settings = Settings(
        redis_url=url,
        operation_timeout=timeout,
        retry_attempts=attempts,
        retry_max_delay=0.01,
        **more,
    )
    return _connection.Connection(make_client(url, settings), settings)


async def ping(connection: _connection.Connection) -> Any:
    return await connection.call(lambda: connection.node_call("k", [("PING",)]))


def idle(connection: _connection.Connection) -> bool:
    deadlines = connection._deadlines
    return deadlines._calls == {} and deadlines._expired == set()


def late_deadlines(connection: _connection.Connection) -> list[Any]:
    """What the one deadline timer of ``connection`` does late, checked each time it fires.

    Each firing must end every call past its deadline, and leave the timer armed no later
    than the oldest deadline left: then each call ends at the first firing at or after its
    deadline, however late a loaded machine runs that firing. The list stays empty.
    """
    deadlines, late = connection._deadlines, []
    expire = deadlines._expire

    def checked(loop: asyncio.AbstractEventLoop) -> None:
        now = loop.time()  # the firing's own time is this or later
        expire(loop)
        left = [when for _, when in deadlines._calls.values()]
        if left and min(left) <= now:
            late.append(("a call left past its deadline", now, min(left)))
        if left and (deadlines._timer is None or deadlines._timer.when() > min(left)):
            late.append(("the timer armed past the oldest deadline", min(left)))

    deadlines._expire = checked  # type: ignore[method-assign]
    return late


async def no_summary(tenant: str, session: str, generation: int) -> None:
    """An on_summary_due that queues nothing (keeps the summary queue out of these tests)."""


# --- deadlines ------------------------------------------------------------------------------------


async def test_staggered_stalls_each_get_their_full_deadline(private: PrivateRedis) -> None:
    """300 calls at random times, a third never answered: each ends at its start + timeout.

    Not before it (the loop's clock), and at the timer's first firing after it (not a
    wall-clock bound a loaded machine misses). The others take half their deadline at most.
    """
    timeout = 1.0
    connection = connection_to(private.url(), timeout)
    late = late_deadlines(connection)
    loop = asyncio.get_running_loop()
    rng = random.Random(1)
    results: list[tuple[bool, bool, float]] = []

    async def one(stall: bool, delay: float) -> None:
        await asyncio.sleep(delay)
        started = loop.time()

        async def op() -> Any:
            if stall:
                await asyncio.Event().wait()
            await asyncio.sleep(rng.random() * timeout * 0.5)
            return await connection.node_call("k", [("PING",)])

        try:
            await connection.call(op)
            results.append((stall, True, loop.time() - started))
        except StoreUnavailableError:
            results.append((stall, False, loop.time() - started))

    try:
        await asyncio.gather(*(one(rng.random() < 0.3, rng.random()) for _ in range(300)))
    finally:
        await connection.aclose()
    for stall, ok, took in results:
        assert ok is not stall
        if stall:
            assert took >= timeout - 0.005, took
    assert not late, late[:3]
    assert idle(connection)


@pytest.mark.parametrize("first", ["cancel", "deadline"])
async def test_an_outside_cancel_at_the_deadline_stays_a_cancellation(
    private: PrivateRedis, first: str
) -> None:
    """The caller cancels in the same turn of the loop as the deadline: no retry, nothing left."""
    connection = connection_to(private.url(), 1.0, attempts=3)
    loop = asyncio.get_running_loop()
    tries = []

    async def op() -> Any:
        tries.append(1)
        await asyncio.Event().wait()

    task = asyncio.create_task(connection.call(op))
    await asyncio.sleep(0)
    ((_, (_, when)),) = connection._deadlines._calls.items()
    loop.call_at(when - 1e-9 if first == "cancel" else when + 1e-9, task.cancel)
    with pytest.raises(asyncio.CancelledError):
        await task
    assert len(tries) == 1 and idle(connection)
    assert await ping(connection) == [b"PONG"]
    await connection.aclose()


async def test_a_call_made_while_its_task_is_being_cancelled_still_times_out(
    private: PrivateRedis,
) -> None:
    """Cleanup in ``except CancelledError`` calls Redis: that call ends at its deadline."""
    connection = connection_to(private.url(), 1.0)
    assert await ping(connection) == [b"PONG"]
    private.pause()
    seen: list[Exception] = []
    waiting = asyncio.Event()

    async def worker() -> None:
        try:
            waiting.set()
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            try:
                await ping(connection)
            except StoreUnavailableError as exc:
                seen.append(exc)
            raise

    try:
        task = asyncio.create_task(worker())
        await waiting.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            async with asyncio.timeout(30):  # no deadline: fails here, not hangs
                await task
        assert len(seen) == 1
        assert isinstance(seen[0].__cause__, TimeoutError)  # its deadline ended it
    finally:
        private.resume()
    await connection.aclose()


@pytest.mark.parametrize("offset", [-0.002, 0.0, 0.002])
async def test_a_callers_own_timeout_about_at_the_deadline(
    private: PrivateRedis, offset: float
) -> None:
    """asyncio.timeout around a call, expiring about when its deadline does: a clean timeout.

    No try of the call begins once the caller's timeout has come (a retry after it).
    """
    connection = connection_to(private.url(), 1.0, attempts=2)
    assert await ping(connection) == [b"PONG"]
    real, after = connection.node_call, []
    private.pause()
    try:
        outer = asyncio.timeout(1.0 + offset)

        async def node_call(*args: Any, **kwargs: Any) -> Any:
            after.append(outer.expired())
            return await real(*args, **kwargs)

        connection.node_call = node_call  # type: ignore[method-assign]
        with pytest.raises((TimeoutError, StoreUnavailableError)):
            async with outer:
                await ping(connection)
        connection.node_call = real  # type: ignore[method-assign]
        assert not any(after), after
        task = asyncio.current_task()
        assert task is not None and task.cancelling() == 0
    finally:
        private.resume()
    assert await ping(connection) == [b"PONG"]
    assert idle(connection)
    await connection.aclose()


async def test_a_stalled_server_with_retries_fails_every_call_in_bounded_time(
    private: PrivateRedis,
) -> None:
    """20 calls, 3 retries each, no reply: all fail after their 4 tries, each ended by its deadline.

    So in attempts x timeout + backoff: nothing waits longer.
    """
    connection = connection_to(private.url(), 0.5, attempts=3)
    late = late_deadlines(connection)
    assert await ping(connection) == [b"PONG"]
    private.pause()
    try:
        calls = [asyncio.create_task(ping(connection)) for _ in range(20)]
        for call in calls:
            with pytest.raises(StoreUnavailableError, match="after 4 attempts") as caught:
                async with asyncio.timeout(30):  # a safety net: a call that hangs fails here
                    await call
            assert isinstance(caught.value.__cause__, TimeoutError)
        assert not late, late[:3]
    finally:
        private.resume()
    assert await ping(connection) == [b"PONG"]
    await connection.aclose()


async def test_a_connection_used_after_aclose_refuses_at_once(private: PrivateRedis) -> None:
    """Closed for good: a call made after aclose fails at once, untried, opening no connection."""
    connection = connection_to(private.url(), 0.2, attempts=3)
    assert await ping(connection) == [b"PONG"]
    await connection.aclose()
    pool = connection._pool
    assert pool is not None
    with pytest.raises(StoreClosedError, match="the store is closed"):
        await ping(connection)
    held = [*pool._available_connections, *pool._in_use_connections]
    assert not any(held_one.is_connected for held_one in held)
    assert idle(connection)  # no deadline was started for it


async def test_aclose_with_a_stalled_call_in_flight_ends_that_call(private: PrivateRedis) -> None:
    """Aclose stops the timer; the stalled call still ends (its socket is closed under it)."""
    connection = connection_to(private.url(), 1.0)
    assert await ping(connection) == [b"PONG"]
    private.pause()
    try:
        stalled = asyncio.create_task(ping(connection))
        pool = connection._pool
        assert pool is not None
        while not pool._in_use_connections:  # noqa: ASYNC110 - until the call holds one
            await asyncio.sleep(0)
        await connection.aclose()
        with pytest.raises(StoreUnavailableError):
            async with asyncio.timeout(30):  # a safety net: no deadline is left to end it
                await stalled
    finally:
        private.resume()


@pytest.mark.parametrize("backend", ["single", "cluster"], indirect=True)
async def test_stalled_calls_among_many_on_both_backends(
    settings: Settings, tenant: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A tenth of 300 store calls never answered: exactly those fail, each at its deadline.

    Not before it (the loop's clock), and at the timer's first firing after it.
    """
    timeout = 1.0
    quick = settings.model_copy(update={"operation_timeout": timeout, "retry_attempts": 0})
    async with ContextStore.from_settings(quick, tenant=tenant) as store:
        for i in range(20):
            await store.append(f"s{i}", {"role": "user", "content": f"m{i}"})
        connection = store._connection
        late = late_deadlines(connection)
        real = connection.node_call
        rng = random.Random(3)
        stalls = 0

        async def node_call(key: str, commands: Any, **kwargs: Any) -> Any:
            nonlocal stalls
            if rng.random() < 0.1:
                stalls += 1
                await asyncio.Event().wait()
            return await real(key, commands, **kwargs)

        monkeypatch.setattr(connection, "node_call", node_call)
        loop = asyncio.get_running_loop()

        async def one(i: int) -> tuple[bool, float]:
            await asyncio.sleep(rng.random() * 0.5)
            started = loop.time()
            try:
                got = await store.get_messages(f"s{i % 20}")
                assert got == [{"role": "user", "content": f"m{i % 20}"}]
                return True, loop.time() - started
            except StoreUnavailableError:
                return False, loop.time() - started

        async with asyncio.timeout(60):  # a safety net: a call that hangs fails here
            out = await asyncio.gather(*(one(i) for i in range(300)))
        failed = [took for ok, took in out if not ok]
        assert stalls and len(failed) == stalls
        assert all(took >= timeout - 0.005 for took in failed), sorted(failed)[:3]
        assert not late, late[:3]
        monkeypatch.setattr(connection, "node_call", real)
        assert await store.get_messages("s1") == [{"role": "user", "content": "m1"}]
        assert idle(connection)


@pytest.mark.skipif(
    importlib.util.find_spec("hiredis") is None,
    reason="the store reads replies itself only with hiredis; without it redis-py's parser does",
)
async def test_a_deadline_mid_big_reply_never_hands_it_to_the_next(private: PrivateRedis) -> None:
    """One connection, a 24 MB reply that cannot be read in time: the next call reads its own.

    The reply's first read is read; the connection's next read waits past the deadline:
    the deadline comes mid-reply, each time.
    """
    connection = connection_to(private.url(), 0.5, max_connections=1)
    big = b"x" * (24 << 20)
    setup = connection_to(private.url(), 10)
    await setup.call(lambda: setup.node_call("big", [("SET", "big", big), ("SET", "small", "s")]))
    await setup.aclose()
    try:
        pool = connection._pool
        assert pool is not None
        for _ in range(5):
            assert await ping(connection) == [b"PONG"]  # the one connection, idle in the pool
            (held,) = pool._available_connections
            stream, reads = held._reader, 0
            read = stream.read

            async def first_read_only(n: int = -1, read: Any = read) -> bytes:
                nonlocal reads
                reads += 1
                if reads > 1:
                    await asyncio.Event().wait()  # the rest of the reply, not in time
                return await read(n)

            stream.read = first_read_only  # type: ignore[method-assign]
            with pytest.raises(StoreUnavailableError):
                await connection.call(lambda: connection.node_call("big", [("GET", "big")]))
            assert reads == 2  # the deadline came with the reply half read
            reply = await connection.call(
                lambda: connection.node_call("small", [("GET", "small"), ("PING",)])
            )
            assert reply == [b"s", b"PONG"]
    finally:
        await connection.aclose()  # a failed round leaves no socket to a later test


# --- the pool's fast return -----------------------------------------------------------------------


async def test_pool_exhaustion_with_random_cancels_never_deadlocks(private: PrivateRedis) -> None:
    """2 connections, 400 callers, a third cancelled at random: all others served, none lost."""
    connection = connection_to(private.url(), 30.0, max_connections=2)  # no call ends at it
    rng = random.Random(7)

    async def one() -> None:
        await asyncio.sleep(rng.random() * 0.05)
        echo = "x" * rng.randrange(1, 5000)
        assert await connection.call(
            lambda: connection.node_call("k", [("PING",), ("ECHO", echo)])
        ) == [b"PONG", echo.encode()]

    tasks = [asyncio.create_task(one()) for _ in range(400)]
    for task in tasks:
        if rng.random() < 0.33:
            asyncio.get_running_loop().call_later(rng.random() * 0.1, task.cancel)
    async with asyncio.timeout(60):  # a deadlock fails here
        results = await asyncio.gather(*tasks, return_exceptions=True)
    failed = [
        r
        for r in results
        if isinstance(r, BaseException) and not isinstance(r, asyncio.CancelledError)
    ]
    assert not failed, failed[:3]
    pool = connection._pool
    assert pool is not None
    assert not pool._in_use_connections and len(pool._available_connections) <= 2
    assert await ping(connection) == [b"PONG"]
    await connection.aclose()


async def test_idle_connections_killed_by_the_server_are_replaced(private: PrivateRedis) -> None:
    connection = connection_to(private.url(), 1.0, attempts=1, max_connections=4)
    await asyncio.gather(*(ping(connection) for _ in range(8)))
    admin = Redis.from_url(private.url())
    try:
        for _ in range(3):
            await admin.execute_command("CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes")
            # Whether or not the event loop saw each end of stream yet: checked, or retried.
            assert await asyncio.gather(*(ping(connection) for _ in range(8))) == [[b"PONG"]] * 8
    finally:
        await admin.aclose()
        await connection.aclose()


async def test_a_waiter_woken_then_cancelled_leaves_the_free_connection_to_the_next(
    private: PrivateRedis,
) -> None:
    """A wake-up given to a waiter cancelled before it ran is passed on to the next.

    One connection, two callers waiting for it. It is given back (redis-py's
    release notifies the first) and the first is cancelled in the same turn
    of the loop (its caller went away). On Python 3.11 asyncio.Condition
    drops that notification: without the wake-up passed on, the second
    caller waited out its whole deadline while the connection sat idle.
    """
    connection = connection_to(private.url(), 30.0, max_connections=1)
    pool = connection._pool
    assert pool is not None
    held = await pool.get_connection()
    first = asyncio.create_task(ping(connection))
    while len(pool._condition._waiters) < 1:  # noqa: ASYNC110 - waits on a condition
        await asyncio.sleep(0)
    second = asyncio.create_task(ping(connection))
    while len(pool._condition._waiters) < 2:  # noqa: ASYNC110 - waits on a condition
        await asyncio.sleep(0)
    await pool.release(held)  # wakes the first waiter...
    first.cancel()  # ...whose caller gives up before it runs
    with pytest.raises(asyncio.CancelledError):
        await first
    try:
        # A free connection is taken at once: in turns of the loop, not at a deadline.
        await loop_until(lambda: not pool._condition._waiters and pool._in_use_connections)
        assert await second == [b"PONG"]
    finally:
        await connection.aclose()


# --- the copy made ahead --------------------------------------------------------------------------


def dumped(view: RequestView) -> list[str]:
    return [json.dumps(m, sort_keys=True) for m in view.messages]


def vandalize(value: Any) -> None:
    """What a careless caller does: every string replaced, every dict and list added to."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            stack.extend(list(item.values()))
            for key in list(item):
                if isinstance(item[key], str):
                    item[key] = "VANDAL"
            item["vandal"] = {"x": [1]}
        elif isinstance(item, list):
            stack.extend(list(item))
            item.append({"vandal": True})


def messages(rng: random.Random, n: int) -> list[dict[str, Any]]:
    """A few messages, most nesting lists and dicts (tool calls, blocks, metadata)."""
    kind = rng.randrange(6)
    if kind == 0:
        return [user(f"u{n} " + "w " * rng.randrange(40))]
    if kind == 1:
        return [oa_call(f"c{n}a", f"c{n}b"), oa_result(f"c{n}a"), oa_result(f"c{n}b"), assistant()]
    if kind == 2:
        return [an_call(f"t{n}", text="thinking"), an_result(f"t{n}", text="more")]
    if kind == 3:
        blocks = [
            {"type": "text", "text": f"q{n}"},
            {"type": "image", "source": {"type": "base64", "data": "AAAA"}},
        ]
        return [{"role": "user", "content": blocks}]
    if kind == 4:
        return [{"role": "assistant", "content": f"a{n}", "metadata": {"tags": ["x", {"y": []}]}}]
    return [turn(n)]


@pytest.mark.parametrize("backend", ["single", "cluster"], indirect=True)
@pytest.mark.parametrize("seed", range(6))
async def test_vandalized_views_never_change_a_later_view(
    settings: Settings, tenant: str, seed: int
) -> None:
    """Every view (alone, three at once, two budgets at once) vandalized: later ones are cold's."""
    rng = random.Random(seed)
    session = f"v{uuid.uuid4().hex[:8]}"
    warm = settings.model_copy(update={"view_cache_bytes": 4_000}) if seed % 3 == 1 else settings
    cold = settings.model_copy(update={"view_cache_bytes": 0})
    async with (
        ContextStore.from_settings(warm, tenant=tenant, on_summary_due=no_summary) as a,
        ContextStore.from_settings(settings, tenant=tenant, on_summary_due=no_summary) as b,
        ContextStore.from_settings(cold, tenant=tenant, on_summary_due=no_summary) as c,
    ):
        await b.append_many(session, [SYSTEM, *(turn(i) for i in range(20))])
        budgets = [700, 2_000]
        for n in range(60):
            op = rng.randrange(10)
            if op < 5:
                await b.append_many(session, messages(rng, n))
            elif op == 5:
                await a.pop(session)
            elif op == 6 and n % 7 == 0:
                await b.replace(session, [SYSTEM, *messages(rng, n), *messages(rng, n + 1000)])
            budget = rng.choice(budgets)
            how = rng.randrange(3)
            if how == 0:
                views = [await a.view(session, token_budget=budget)]
            elif how == 1:
                views = list(
                    await asyncio.gather(*(a.view(session, token_budget=budget) for _ in "abc"))
                )
            else:
                views = list(
                    await asyncio.gather(*(a.view(session, token_budget=x) for x in budgets * 2))
                )
            for view in views:
                again = await c.view(session, token_budget=view.stats.budget)
                assert dumped(view) == dumped(again), (seed, n)
                vandalize(view.messages)
            if rng.random() < 0.5:
                await asyncio.sleep(0)  # the copy ahead is made now, or not before the next view
        for budget in budgets:
            assert dumped(await a.view(session, token_budget=budget)) == dumped(
                await c.view(session, token_budget=budget)
            )


@pytest.mark.parametrize("cache", [6_000, 40_000, 64 << 20])
async def test_many_sessions_of_two_tenants_viewed_at_once_and_vandalized(
    settings: Settings, tenant: str, cache: int
) -> None:
    """Two tenants on one connection and one warm cache, 48 views at once, plans evicted."""
    rng = random.Random(cache)
    other = tenant + "x"
    warm = settings.model_copy(update={"view_cache_bytes": cache})
    cold = settings.model_copy(update={"view_cache_bytes": 0})
    async with (
        ContextStore.from_settings(warm, tenant=tenant, on_summary_due=no_summary) as a1,
        ContextStore.from_settings(cold, tenant=tenant, on_summary_due=no_summary) as c1,
        ContextStore.from_settings(cold, tenant=other, on_summary_due=no_summary) as c2,
    ):
        a2 = a1.for_tenant(other)
        sessions = [f"m{i}" for i in range(12)]
        for session in sessions:
            await a1.append_many(session, [SYSTEM, *(turn(i) for i in range(10))])
            await a2.append_many(session, [SYSTEM, user("other tenant"), *messages(rng, 1)])
        for n in range(25):
            for session in rng.sample(sessions, 5):
                await (a1 if rng.random() < 0.5 else a2).append_many(session, messages(rng, n))
            jobs = [(st, s, b) for st in (a1, a2) for s in sessions for b in (600, 3_000)]
            rng.shuffle(jobs)
            views = await asyncio.gather(*(st.view(s, token_budget=b) for st, s, b in jobs))
            for (st, session, budget), view in zip(jobs, views, strict=True):
                again = await (c1 if st is a1 else c2).view(session, token_budget=budget)
                assert dumped(view) == dumped(again), (n, st.tenant, session, budget)
                vandalize(view.messages)
            if n % 2:
                await asyncio.sleep(0)


# --- the summary queue ----------------------------------------------------------------------------


async def test_concurrent_first_summaries_open_one_queue(
    summary_settings: Settings, tenant: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Concurrent first summaries open one queue (each opened its own; only one was closed).

    Eight appends at once, each making a summary due on a fresh store: each
    finds no queue yet and opens its own (a client and a pool); the last one
    assigned is kept and closed by aclose, the other seven leak their
    connections (ResourceWarning: unclosed Connection at exit).
    """
    from ctxstore import summary_queue

    opened: list[Any] = []
    real = summary_queue.SummaryQueue.connect.__func__  # type: ignore[attr-defined]

    async def connect(cls: Any, settings: Settings) -> Any:
        queue = await real(cls, settings)
        opened.append(queue)
        return queue

    monkeypatch.setattr(summary_queue.SummaryQueue, "connect", classmethod(connect))
    async with ContextStore.from_settings(summary_settings, tenant=tenant) as store:
        await asyncio.gather(
            *(store.append_many(f"q{i}", [turn(j) for j in range(20)]) for i in range(8))
        )
    leaked = 0
    for queue in opened:
        pool = queue.connection.client.connection_pool
        connections = [*pool._available_connections, *pool._in_use_connections]
        leaked += sum(1 for c in connections if c.is_connected)
        await queue.aclose()  # this test's own clean-up
    assert len(opened) == 1 and leaked == 0, (len(opened), leaked)
