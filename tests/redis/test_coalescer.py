"""Calls in flight together to one node go in one write, on one connection: each its own.

The first part drives :class:`Coalescer` with a sender the test holds open (so a
batch's moment of sending, cancelling and failing is the test's to choose); the
second runs the store on Redis (a private one where MONITOR or CLIENT KILL reads
or breaks what the store sent), on one server and on a cluster.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from redis import exceptions as rex
from redis.asyncio import Redis
from support.config import BACKENDS
from support.helpers import loop_until, private_settings
from support.servers import Monitor, PrivateRedis

from ctxstore import ConflictError, ContextStore, Settings, StoreError, StoreUnavailableError
from ctxstore._redis.coalescer import Coalescer, Commands

Command = tuple[Any, ...]


class Sender:
    """A node's connection as the test holds it: each send waits until the test opens it.

    Every send is recorded with its commands; its replies are each command's own
    name and first argument (so a call that got another's replies shows it).
    """

    def __init__(self) -> None:
        self.sent: list[list[Command]] = []
        self.open = asyncio.Event()
        self.failure: BaseException | None = None
        self.cancelled = 0

    async def __call__(self, key: str, commands: Commands) -> list[Any]:
        if callable(commands):  # a batch's: its calls still waiting, once a connection is in hand
            commands = commands()
        self.sent.append(commands)
        try:
            await self.open.wait()
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        if self.failure is not None:
            raise self.failure
        return [(c[0], c[1]) for c in commands]


def gets(
    coalescer: Coalescer, sender: Sender, names: list[str], node: str | None = ""
) -> list[asyncio.Task[list[Any]]]:
    """A call per name, each a ``GET`` of it to ``node``, started as tasks."""
    return [
        asyncio.create_task(coalescer.send(node, name, [("GET", name)], sender)) for name in names
    ]


async def behind_one(coalescer: Coalescer, sender: Sender) -> asyncio.Task[list[Any]]:
    """A lone call (a ``GET`` of ``a``), once it is on the wire: the next calls batch."""
    [first] = gets(coalescer, sender, ["a"])
    await loop_until(lambda: sender.sent)
    return first


def names(prefix: str, n: int) -> list[str]:
    """``prefix0`` .. ``prefix{n-1}``."""
    return [f"{prefix}{i}" for i in range(n)]


async def test_a_lone_call_goes_at_once_and_the_next_ones_in_one_batch() -> None:
    """The first call finds none in flight and goes alone; the 19 made meanwhile share one send."""
    coalescer, sender = Coalescer(64), Sender()
    calls = gets(coalescer, sender, names("k", 20))
    await loop_until(lambda: len(sender.sent) == 2)
    sender.open.set()
    replies = await asyncio.gather(*calls)
    assert [len(s) for s in sender.sent] == [1, 19]
    assert replies == [[("GET", f"k{i}")] for i in range(20)]


async def test_each_call_takes_its_own_replies_from_a_batch_of_several_commands_each() -> None:
    """Calls of 1, 2 and 3 commands: each gets exactly its own, in its order."""
    coalescer, sender = Coalescer(64), Sender()
    first = asyncio.create_task(coalescer.send("", "a", [("PING", "a")], sender))
    await loop_until(lambda: sender.sent)
    shapes = {f"c{i}": [("CMD", f"c{i}.{j}") for j in range(1 + i % 3)] for i in range(12)}
    calls = {k: asyncio.create_task(coalescer.send("", k, v, sender)) for k, v in shapes.items()}
    await loop_until(lambda: len(sender.sent) == 2)
    sender.open.set()
    await first
    for key, task in calls.items():
        assert await task == [("CMD", f"{key}.{j}") for j in range(len(shapes[key]))]


@pytest.mark.parametrize(
    ("most", "calls", "sends"), [(3, 11, [1, 3, 3, 3, 1]), (1, 4, [1, 1, 1, 1]), (0, 5, [1] * 5)]
)
async def test_a_batch_holds_at_most_coalesce_calls(
    most: int, calls: int, sends: list[int]
) -> None:
    """Behind a lone call, batches of ``coalesce_calls`` at most (0: every call alone)."""
    coalescer, sender = Coalescer(most), Sender()
    started = gets(coalescer, sender, names("k", calls))
    await loop_until(lambda: len(sender.sent) == len(sends))
    sender.open.set()
    assert await asyncio.gather(*started) == [[("GET", f"k{i}")] for i in range(calls)]
    assert [len(s) for s in sender.sent] == sends


async def test_nodes_batch_apart_and_an_unknown_node_goes_alone() -> None:
    """A call in flight to node A batches nothing for node B; a node not known yet never batches."""
    coalescer, sender = Coalescer(64), Sender()
    lone_a = asyncio.create_task(coalescer.send("a", "x", [("GET", "x")], sender))
    await loop_until(lambda: len(sender.sent) == 1)
    on_b = gets(coalescer, sender, names("b", 3), node="b")
    await loop_until(lambda: len(sender.sent) == 2)  # b's first is alone: nothing in flight to b
    unknown = gets(coalescer, sender, names("u", 2), node=None)
    on_a = gets(coalescer, sender, names("a", 4), node="a")
    await loop_until(lambda: len(sender.sent) == 6)
    sender.open.set()
    await asyncio.gather(lone_a, *on_b, *unknown, *on_a)
    sizes = sorted(len(s) for s in sender.sent)
    assert sizes == [1, 1, 1, 1, 2, 4]  # a alone, b alone, 2 unknown alone, b's 2, a's 4
    assert [("GET", f"a{i}") for i in range(4)] in [[(c[0], c[1]) for c in s] for s in sender.sent]


async def test_wait_for_replicas_goes_alone() -> None:
    """A write followed by WAIT holds its connection: it never joins a batch."""
    coalescer, sender = Coalescer(64), Sender()
    first = await behind_one(coalescer, sender)
    waits = [
        asyncio.create_task(coalescer.send("", f"w{i}", [("SET", f"w{i}"), ("WAIT", 1)], sender))
        for i in range(3)
    ]
    plain = gets(coalescer, sender, names("p", 3))
    await loop_until(lambda: len(sender.sent) == 5)
    sender.open.set()
    await asyncio.gather(first, *waits, *plain)
    assert sorted(len(s) for s in sender.sent) == [1, 2, 2, 2, 3]


async def test_a_cancelled_call_leaves_the_batch_to_the_others() -> None:
    """One call of a batch cancelled: the batch is still read whole, the others get theirs."""
    coalescer, sender = Coalescer(64), Sender()
    first = await behind_one(coalescer, sender)
    calls = gets(coalescer, sender, names("k", 6))
    await loop_until(lambda: len(sender.sent) == 2)
    calls[2].cancel()
    sender.open.set()
    results = await asyncio.gather(first, *calls, return_exceptions=True)
    assert isinstance(results[3], asyncio.CancelledError)
    assert [r for i, r in enumerate(results) if i != 3] == [[("GET", "a")]] + [
        [("GET", f"k{i}")] for i in range(6) if i != 2
    ]
    assert sender.cancelled == 0


async def test_a_batch_nobody_waits_for_is_dropped() -> None:
    """Every call of a sent batch cancelled (their deadlines): its send is cancelled too."""
    coalescer, sender = Coalescer(64), Sender()
    first = await behind_one(coalescer, sender)
    calls = gets(coalescer, sender, names("k", 4))
    await loop_until(lambda: len(sender.sent) == 2)
    for call in calls:
        call.cancel()
    await loop_until(lambda: sender.cancelled == 1)
    sender.open.set()
    assert await first == [("GET", "a")]
    assert all(c.cancelled() for c in calls)


async def test_calls_cancelled_before_their_batch_is_sent_are_not_sent() -> None:
    """A batch whose calls were all cancelled before the loop's next turn sends nothing."""
    coalescer, sender = Coalescer(64), Sender()
    first = await behind_one(coalescer, sender)
    calls = gets(coalescer, sender, names("k", 3))
    await loop_until(
        lambda: "" in coalescer._gathering and len(coalescer._gathering[""].calls) == 3
    )
    for call in calls:
        call.cancel()
    later = asyncio.create_task(coalescer.send("", "z", [("GET", "z")], sender))
    await loop_until(lambda: len(sender.sent) == 2)
    sender.open.set()
    assert await later == [("GET", "z")]
    await first
    assert [[c[1] for c in s] for s in sender.sent] == [["a"], ["z"]]


async def test_a_failed_send_fails_each_call_with_its_own_error() -> None:
    """A connection lost mid-batch: each call raises a copy of the error (to retry on its own)."""
    coalescer, sender = Coalescer(64), Sender()
    first = await behind_one(coalescer, sender)
    calls = gets(coalescer, sender, names("k", 3))
    await loop_until(lambda: len(sender.sent) == 2)
    sender.failure = rex.ConnectionError("the server closed the connection")
    sender.open.set()
    results = await asyncio.gather(first, *calls, return_exceptions=True)
    errors = [r for r in results if isinstance(r, rex.ConnectionError)]
    assert len(errors) == 4
    assert len({id(e) for e in errors[1:]}) == 3  # the batch's three: copies, not one shared
    assert {str(e) for e in errors} == {"the server closed the connection"}


async def test_closing_fails_the_calls_of_a_batch_in_flight() -> None:
    """Aclose cancels the batches on the wire; their calls fail as on a closed connection."""
    coalescer, sender = Coalescer(64), Sender()
    first = await behind_one(coalescer, sender)
    calls = gets(coalescer, sender, names("k", 3))
    await loop_until(lambda: len(sender.sent) == 2)
    await coalescer.aclose()
    results = await asyncio.gather(*calls, return_exceptions=True)
    assert all(isinstance(r, rex.ConnectionError) for r in results)
    sender.open.set()
    assert await first == [("GET", "a")]


# On Redis.


def own_settings(url: str, **changes: Any) -> Settings:
    """Settings on a private Redis, under this file's own prefix."""
    return private_settings(url, "coalesce", **changes)


def scripts_by_source(logged: list[Any]) -> dict[str, int]:
    """Per client address, how many scripts it sent."""
    counts: dict[str, int] = {}
    for entry in logged:
        if entry.source != "lua" and entry.args[0].lower() in (b"evalsha", b"eval"):
            counts[entry.source] = counts.get(entry.source, 0) + 1
    return counts


@pytest.mark.parametrize(("most", "connections"), [(64, 2), (8, 6), (0, 40)])
async def test_appends_in_flight_together_share_connections(
    private: PrivateRedis, most: int, connections: int
) -> None:
    """40 appends at once: one alone, then batches of ``coalesce_calls`` (0: 40 connections)."""
    settings = own_settings(private.url(), coalesce_calls=most)
    async with ContextStore.from_settings(settings, tenant="acme") as store:
        for i in range(40):  # made one by one: a steady append is one script
            await store.append(f"s{i}", {"role": "user", "content": "first"})
        async with Monitor(private.port) as monitor:
            await asyncio.gather(
                *(store.append(f"s{i}", {"role": "user", "content": f"m{i}"}) for i in range(40))
            )
            sent = scripts_by_source(await monitor.drain())
        assert sum(sent.values()) == 40
        assert len(sent) == connections
        for i in range(40):
            assert [m["content"] for m in await store.get_messages(f"s{i}")] == ["first", f"m{i}"]


@pytest.mark.parametrize("backend", BACKENDS, indirect=True)
async def test_concurrent_appends_and_views_each_get_their_own_answer(
    settings: Settings, tenant: str
) -> None:
    """300 calls at once over 10 sessions: each append's seq is its own, each read its session's."""
    async with ContextStore.from_settings(settings, tenant=tenant) as store:
        sessions = [f"s{i}" for i in range(10)]

        async def append(n: int) -> tuple[str, int, str]:
            session = sessions[n % 10]
            result = await store.append(session, {"role": "user", "content": f"{session}-m{n}"})
            return session, result.seq, f"{session}-m{n}"

        written = await asyncio.gather(*(append(n) for n in range(200)))
        reads = await asyncio.gather(
            *(store.get_messages(s) for s in sessions),
            *(store.view(s, token_budget=100_000) for s in sessions * 5),
            *(append(n) for n in range(200, 250)),
        )
        for session in sessions:
            history = await store.get_messages(session)
            mine = sorted((seq, text) for s, seq, text in written if s == session)
            assert [m["content"] for m in history[: len(mine)]] == [t for _, t in mine]
            assert len(history) == 25
        for session, history in zip(sessions, reads[:10], strict=True):
            assert all(m["content"].startswith(f"{session}-m") for m in history)
        for session, view in zip(sessions * 5, reads[10:60], strict=True):
            assert all(m["content"].startswith(f"{session}-m") for m in view.messages)


async def test_a_refusal_in_a_batch_is_its_own_call(settings: Settings, tenant: str) -> None:
    """A stale append-if and a key of the wrong type fail alone; the batch's other calls apply."""
    async with ContextStore.from_settings(settings, tenant=tenant) as store:
        for i in range(10):
            await store.append(f"s{i}", {"role": "user", "content": "first"})
        wrong = f"{settings.key_prefix}:wrongtype"
        raw = Redis.from_url(str(settings.redis_url))
        try:
            await raw.set(wrong, "a string")
            results = await asyncio.gather(
                *(store.append(f"s{i}", {"role": "user", "content": "second"}) for i in range(10)),
                store.append("s0", {"role": "user", "content": "stale"}, expected_seq=0),
                store._connection.batch([("XLEN", wrong)], key=wrong),
                *(store.get_messages(f"s{i}") for i in range(10)),
                return_exceptions=True,
            )
        finally:
            await raw.delete(wrong)
            await raw.aclose()
        assert isinstance(results[10], ConflictError)
        assert isinstance(results[11], StoreError) and "WRONGTYPE" in str(results[11])
        assert [r.seq for r in results[:10]] == [2] * 10
        assert all(isinstance(r, list) and r[0]["content"] == "first" for r in results[12:])
        for i in range(10):
            assert [m["content"] for m in await store.get_messages(f"s{i}")] == ["first", "second"]


async def test_connections_killed_mid_batch_lose_and_double_nothing(private: PrivateRedis) -> None:
    """Every connection killed while its batch waits on a paused Redis: each append once, no loss.

    Writes are paused (reads, as CLIENT LIST, still run): the appends wait, sent.
    """
    settings = own_settings(private.url(), retry_attempts=3, retry_base_delay=0.01)
    admin = Redis.from_url(private.url())
    try:
        async with ContextStore.from_settings(settings, tenant="acme") as store:
            await store.append("warm", {"role": "user", "content": "scripts loaded"})
            await admin.execute_command("CLIENT", "PAUSE", 60_000, "WRITE")
            appends = asyncio.gather(
                *(
                    store.append(f"s{i % 5}", {"role": "user", "content": f"m{i}"})
                    for i in range(30)
                )
            )
            mine = await admin.client_id()

            async def ours() -> list[int]:
                return [int(c["id"]) for c in await admin.client_list() if int(c["id"]) != mine]

            while len(await ours()) < 2:  # noqa: ASYNC110 - the lone call's and the batch's
                await asyncio.sleep(0.01)
            for client in await ours():
                await admin.client_kill_filter(_id=client)
            await admin.execute_command("CLIENT", "UNPAUSE")
            results = await appends
            assert len(results) == 30
            for s in range(5):
                contents = [m["content"] for m in await store.get_messages(f"s{s}")]
                assert sorted(contents) == sorted(f"m{i}" for i in range(30) if i % 5 == s)
    finally:
        await admin.execute_command("CLIENT", "UNPAUSE")
        await admin.aclose()


async def test_calls_past_their_deadline_leave_no_reply_for_the_next(private: PrivateRedis) -> None:
    """A batch whose calls all timed out on a paused Redis: the next calls read their own replies.

    Writes are paused (the appends wait, sent); UNPAUSE, a read, still runs.
    """
    settings = own_settings(private.url(), operation_timeout=1.0, retry_attempts=0)
    admin = Redis.from_url(private.url())
    try:
        async with ContextStore.from_settings(settings, tenant="acme") as store:
            for i in range(8):
                await store.append(f"s{i}", {"role": "user", "content": f"m{i}"})
            await admin.execute_command("CLIENT", "PAUSE", 60_000, "WRITE")
            late = await asyncio.gather(
                *(store.append(f"s{i}", {"role": "user", "content": f"late{i}"}) for i in range(8)),
                return_exceptions=True,
            )
            assert all(isinstance(r, StoreUnavailableError) for r in late)
            await admin.execute_command("CLIENT", "UNPAUSE")
            now = await asyncio.gather(*(store.get_messages(f"s{7 - i}") for i in range(8)))
            for i, history in enumerate(now):
                # A timed-out append may have landed, or not: never another session's reply.
                assert [m["content"] for m in history] in (
                    [f"m{7 - i}"],
                    [f"m{7 - i}", f"late{7 - i}"],
                )
    finally:
        await admin.execute_command("CLIENT", "UNPAUSE")
        await admin.aclose()
