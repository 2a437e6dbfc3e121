"""One store, called from any event loop of any thread: each loop gets connections of its own.

A store made on one loop serves ``asyncio.run`` in another thread while that loop lives,
threads each running a loop at once, and loops one after the other; every write lands
once and none is reported failed. Closing it from one loop closes every loop's
connections, ended, idle or running in another thread, and leaves no socket to warn of.
A client the caller built, that cannot be copied, serves one loop at a time.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import subprocess
import sys
from typing import Any

import pytest
from redis.asyncio import Redis
from redis.asyncio.connection import ConnectionPool
from support.config import BACKENDS, REPO
from support.helpers import numbered
from support.servers import PrivateRedis

from ctxstore import ConfigurationError, ContextStore, Settings
from ctxstore._redis import connection as _connection


def in_a_thread_of_its_own(run: Any) -> Any:
    """``run()`` (an ``asyncio.run`` of something) in a new thread; what it returned."""
    with concurrent.futures.ThreadPoolExecutor(1) as thread:
        return thread.submit(run).result()


@pytest.mark.parametrize("backend", BACKENDS, indirect=True)
async def test_a_thread_running_its_own_loop_meanwhile_is_served_and_its_write_lands_once(
    store: ContextStore,
) -> None:
    """asyncio.run in another thread, while the store's first loop lives: no call fails."""
    await store.append("s", numbered(0))

    async def elsewhere() -> list[Any]:
        written = await store.append("s", numbered(1))
        return [written.seq, len(await store.get_messages("s"))]

    assert await asyncio.to_thread(asyncio.run, elsewhere()) == [2, 2]
    await store.append("s", numbered(2))
    assert await store.get_messages("s") == [numbered(i) for i in range(3)]


@pytest.mark.parametrize("backend", BACKENDS, indirect=True)
async def test_threads_each_on_a_loop_of_their_own_at_once_land_every_write_once(
    store: ContextStore,
) -> None:
    """Eight threads' loops, five appends at once each: every one returns and lands once."""

    def writer(thread: int) -> list[int]:
        async def appends() -> list[int]:
            sent = [store.append("s", numbered(10 * thread + i)) for i in range(5)]
            return [result.seq for result in await asyncio.gather(*sent)]

        return asyncio.run(appends())

    with concurrent.futures.ThreadPoolExecutor(8) as threads:
        seqs = [seq for done in threads.map(writer, range(8)) for seq in done]
    stored = await store.get_messages("s")
    assert sorted(seqs) == list(range(1, 41))  # each reported written, at its own place
    expected = [numbered(10 * thread + i) for thread in range(8) for i in range(5)]
    assert sorted(m["content"] for m in stored) == sorted(m["content"] for m in expected)


async def test_loops_one_after_another_each_connect_anew(settings: Settings, tenant: str) -> None:
    """Three asyncio.run in turn, each in a thread of its own: the history grows in order."""
    store = ContextStore.from_settings(settings, tenant=tenant)
    try:
        for i in range(3):
            in_a_thread_of_its_own(lambda i=i: asyncio.run(store.append("s", numbered(i))))
        assert await store.get_messages("s") == [numbered(i) for i in range(3)]
    finally:
        await store.aclose()


async def test_a_write_that_fails_once_sent_is_retried_and_reported_as_written(
    store: ContextStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An error past the send that is no Redis error: retried as a lost connection, kept once."""
    real = _connection.read_replies
    failures = []

    async def fails_once(conn: Any, n: int) -> list[Any]:
        if not failures:
            failures.append(await real(conn, n))  # the script ran: its reply is lost
            raise RuntimeError("not the server's answer")
        return await real(conn, n)

    monkeypatch.setattr(_connection, "read_replies", fails_once)
    written = await store.append("s", numbered(0), idempotency_key="once")
    monkeypatch.undo()
    assert failures and written.seq == 1
    assert await store.get_messages("s") == [numbered(0)]


async def test_a_callers_client_that_cannot_be_copied_serves_one_loop_at_a_time(
    settings: Settings, tenant: str
) -> None:
    """A client on a pool the store cannot copy: loops in turn work; two at once are refused."""

    class OwnPool(ConnectionPool):
        pass

    assert settings.redis_url is not None
    client = Redis(connection_pool=OwnPool.from_url(settings.redis_url))
    store = ContextStore(client, tenant=tenant, settings=settings)
    try:
        in_a_thread_of_its_own(lambda: asyncio.run(store.append("s", numbered(0))))
        await store.append("s", numbered(1))  # the thread's loop has ended: this one takes over

        async def meanwhile() -> Any:
            return await store.append("s", numbered(2))

        with pytest.raises(ConfigurationError, match="one event loop at a time"):
            await asyncio.to_thread(asyncio.run, meanwhile())
        assert await store.get_messages("s") == [numbered(0), numbered(1)]
    finally:
        await store.aclose()
        await client.connection_pool.disconnect()  # the caller's pool: the caller closes it


_EVERY_LOOP = r"""
import asyncio, gc, json, sys, threading
from ctxstore import ContextStore, Settings, StoreClosedError
settings = Settings(redis_url=sys.argv[1], key_prefix="loops", queue_name="loops:summaries",
    script_mode="eval", retry_attempts=1, operation_timeout=5)
store = ContextStore.from_settings(settings, tenant="acme")
append = lambda i: store.append("s", {"role": "user", "content": str(i)})

asyncio.run(append(0))  # a loop that has ended
idle = asyncio.new_event_loop()  # one that lives, and does not run
idle.run_until_complete(append(1))
running, ready = asyncio.new_event_loop(), threading.Event()  # one running in a thread
thread = threading.Thread(target=running.run_forever)
thread.start()
asyncio.run_coroutine_threadsafe(append(2), running).result()

def connections():
    return [
        conn
        for local in store._connection._shared.loops._locals.values()
        for conn in [*local.client.connection_pool._available_connections,
                     *local.client.connection_pool._in_use_connections]
    ]

async def close():
    await append(3)
    opened = sum(conn.is_connected for conn in connections())
    known = connections()
    await store.aclose()
    refused = []
    for call in (append(4),):
        try:
            await call
        except StoreClosedError:
            refused.append("closed")
    return opened, sum(conn.is_connected for conn in known), refused

opened, left, refused = asyncio.run(close())
async def later():
    try:
        await append(5)
    except StoreClosedError:
        return "closed"
there = asyncio.run_coroutine_threadsafe(later(), running).result()
running.call_soon_threadsafe(running.stop)
thread.join()
running.close()
idle.close()
gc.collect()
print(json.dumps([opened, left, refused, there]))
"""


def test_closing_from_one_loop_closes_every_loops_connections(private: PrivateRedis) -> None:
    """Ended, idle and running loops' connections: all closed by one aclose, none left to warn.

    Each loop's later calls fail as closed. In a process of its own, where every
    ResourceWarning is shown.
    """
    done = subprocess.run(
        [sys.executable, "-W", "always::ResourceWarning", "-c", _EVERY_LOOP, private.url()],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
        check=True,
    )
    opened, left, refused, there = json.loads(done.stdout.strip().splitlines()[-1])
    assert opened == 3  # idle, running, closing (the ended loop's went when the next came)
    assert left == 0
    assert refused == ["closed"] and there == "closed"
    assert "ResourceWarning" not in done.stderr, done.stderr[-2000:]
