"""An append without an idempotency key is stored once if acknowledged, at most once if not.

When the caller gives no idempotency key, the first attempt of ``Writer.append`` sends
the message count negated and ``append.lua`` skips both lookups per message; every later
attempt sends it as is. An append the SDK acknowledges is stored exactly once, and one
that raised at most once, whatever replies are lost and whatever other pods do
meanwhile. Each test records every append sent (its form and its ARGV[4]) and loses
chosen replies after Redis applied them.
"""

from __future__ import annotations

import asyncio
import itertools
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
from redis import exceptions as rex
from redis.asyncio import Redis
from support.append_forms import FULL, LEAN
from support.chaos import dropping
from support.config import BACKENDS, RUN_PREFIX
from support.faults import applied
from support.helpers import turn
from support.pods import fast_retry_pods
from support.servers import ServerPool

from ctxstore import (
    ContextStore,
    ReplicationError,
    SessionNotFoundError,
    Settings,
    StoreUnavailableError,
)
from ctxstore._redis.functions import load_functions
from ctxstore._redis.scripts import SCRIPTS

APPEND = {SCRIPTS.append.sha, SCRIPTS.append.function, SCRIPTS.append.source}

Action = Callable[[], Awaitable[Any]]


@dataclass
class Wire:
    """What a store sent of its appends, and what was done to them.

    Attributes:
        sends: (keys declared, ARGV[4]) of each append that reached Redis (a NOSCRIPT
            EVALSHA is not one: its EVAL is), in order.
        lost: Indexes (in ``sends``) of the sends whose reply was lost after Redis ran them.
        unsent: (keys, ARGV[4]) of each send failed before it reached Redis.
    """

    sends: list[tuple[int, int]] = field(default_factory=list)
    lost: list[int] = field(default_factory=list)
    unsent: list[tuple[int, int]] = field(default_factory=list)

    @property
    def counts(self) -> list[int]:
        """ARGV[4] of each send: negative when it skipped the lookups."""
        return [count for _, count in self.sends]


def wire(
    store: ContextStore,
    monkeypatch: pytest.MonkeyPatch,
    *,
    lose: int = 0,
    form: int | None = None,
    between: Action | None = None,
    fail: int = 0,
    after: Callable[[int], Awaitable[None]] | None = None,
) -> Wire:
    """Watch ``store``'s appends; lose the replies of the first ``lose`` that Redis applied.

    ``form``: only those declaring this many keys are lost. ``fail``: the first ``fail``
    sends fail with a connection error before reaching Redis. ``between``: run after each
    lost reply or failed send, before the error reaches the SDK. ``after``: run after each
    reply the SDK gets, given the index of its send.
    """
    real = store._connection.node_call
    seen = Wire()

    async def node_call(key: str, commands: Any, **kwargs: Any) -> Any:
        first = commands[0]
        if not (first[0] in ("EVALSHA", "EVAL", "FCALL") and first[1] in APPEND):
            return await real(key, commands, **kwargs)
        keys = int(first[2])
        count = int(first[3 + keys + 3])
        if len(seen.unsent) < fail:
            seen.unsent.append((keys, count))
            if between is not None:
                await between()
            raise rex.ConnectionError("the connection broke before the script was sent")
        replies = await real(key, commands, **kwargs)
        if isinstance(replies[0], rex.NoScriptError):
            return replies
        seen.sends.append((keys, count))
        if len(seen.lost) < lose and (form is None or keys == form) and applied(replies[0]):
            seen.lost.append(len(seen.sends) - 1)
            if between is not None:
                await between()
            raise rex.ConnectionError("the reply was lost after Redis applied the script")
        if after is not None:
            await after(len(seen.sends) - 1)
        return replies

    monkeypatch.setattr(store._connection, "node_call", node_call)
    return seen


async def history(store: ContextStore, session: str) -> list[dict[str, Any]]:
    """The session's stored messages ([] when it does not exist)."""
    try:
        return [m.message for m in (await store.read(session)).messages]
    except SessionNotFoundError:
        return []


def other(tag: str) -> dict[str, Any]:
    return {"role": "user", "content": f"another pod's {tag}"}


# -- a lost first reply, another pod acting before the retry ------------------------------


async def _rewind(b: ContextStore, to: str) -> None:
    await b.rewind("s", to)


BETWEEN: dict[str, tuple[Callable[[ContextStore, str], Awaitable[Any]], list[Any]]] = {
    # another pod's action (given the first entry's id), and the history after the retry
    "nothing": (lambda b, first: asyncio.sleep(0), [turn(0), turn(1)]),
    "append_many": (
        lambda b, first: b.append_many("s", [other("1"), other("2")]),
        [turn(0), turn(1), other("1"), other("2")],
    ),
    "set_ttl": (lambda b, first: b.set_ttl("s", 3_600), [turn(0), turn(1)]),
    "set_ttl_none": (lambda b, first: b.set_ttl("s", None), [turn(0), turn(1)]),
    "delete": (lambda b, first: b.delete("s"), []),
    "delete_and_recreate": (
        lambda b, first: _delete_and_recreate(b),
        [other("life 2")],
    ),
    "replace": (lambda b, first: b.replace("s", [other("r")]), [other("r")]),
    "clear": (lambda b, first: b.clear("s"), []),
    "pop": (lambda b, first: b.pop("s"), [turn(0)]),
    "rewind": (_rewind, [turn(0)]),
    "checkpoint_and_append": (
        lambda b, first: _checkpoint_and_append(b),
        [turn(0), turn(1), other("c")],
    ),
}


async def _delete_and_recreate(b: ContextStore) -> None:
    assert await b.delete("s")
    await b.append("s", other("life 2"))


async def _checkpoint_and_append(b: ContextStore) -> None:
    await b.checkpoint("s")
    await b.append("s", other("c"))


@pytest.mark.parametrize("backend", BACKENDS, indirect=True)
@pytest.mark.parametrize("full", [False, True], ids=["lean", "full"])
@pytest.mark.parametrize("action", list(BETWEEN))
async def test_a_lost_first_reply_is_answered_once_whatever_another_pod_does(
    settings: Settings,
    tenant: str,
    raw_redis: Redis,
    monkeypatch: pytest.MonkeyPatch,
    full: bool,
    action: str,
) -> None:
    """First attempt (no lookups) applied, reply lost, another pod acts: the retry, once."""
    act, expected = BETWEEN[action]
    async with fast_retry_pods(settings, tenant) as (a, b):
        first = await a.append("s", turn(0))
        applied: dict[str, Any] = {}

        async def between() -> None:
            meta = await raw_redis.hgetall(a.keys("s").meta)  # type: ignore[misc]
            applied.update(seq=int(meta[b"seq"]), id=meta[b"last_id"].decode())
            await act(b, first.entry_id)

        seen = wire(a, monkeypatch, lose=1, between=between)
        # pinned: the full form at once (its keep copy); else the lean form
        result = await a.append("s", turn(1), pinned=full)
        form = FULL[0] if full else LEAN[0]
        assert seen.lost == [0]
        assert seen.sends[0] == (form, -1)  # the first attempt skipped the lookups
        assert all(count == 1 for count in seen.counts[1:])  # every retry looked up
        assert (result.entry_id, result.seq, result.epoch) == (applied["id"], 2, 0)
        assert result.duplicate
        assert await history(b, "s") == expected


@pytest.mark.parametrize("full", [False, True], ids=["lean", "full"])
async def test_an_append_if_whose_first_reply_was_lost_is_answered_not_refused(
    settings: Settings, tenant: str, monkeypatch: pytest.MonkeyPatch, full: bool
) -> None:
    """append_many(expected_seq) applied without lookups, reply lost, another append: answered."""
    async with fast_retry_pods(settings, tenant) as (a, b):
        first = await a.append("s", turn(0))
        seen = wire(a, monkeypatch, lose=1, between=lambda: b.append("s", other("b")))
        results = await a.append_many("s", [turn(1), turn(2)], expected_seq=first.seq, pinned=full)
        assert seen.counts == [-2, 2]
        assert [(r.seq, r.duplicate) for r in results] == [(2, True), (3, True)]
        assert await history(a, "s") == [turn(0), turn(1), turn(2), other("b")]


# -- lost again and again; an attempt that never reached Redis -----------------------------


@pytest.mark.parametrize("full", [False, True], ids=["lean", "full"])
@pytest.mark.parametrize("lose", [2, 4])
async def test_replies_lost_on_every_attempt_but_the_last_store_the_call_once(
    settings: Settings, tenant: str, monkeypatch: pytest.MonkeyPatch, full: bool, lose: int
) -> None:
    """append_many of 3: the reply of each of the first ``lose`` attempts is lost: once."""
    async with fast_retry_pods(settings, tenant, retry_attempts=lose) as (a, b):
        await a.append("s", turn(0))
        flips = itertools.count()

        async def between() -> None:  # another pod appends, and sets or drops a TTL
            n = next(flips)
            await b.append("s", other(str(n)))
            await b.set_ttl("s", 3_600 if n % 2 == 0 else None)

        seen = wire(a, monkeypatch, lose=lose, between=between)
        results = await a.append_many("s", [turn(1), turn(2), turn(3)], pinned=full)
        assert len(seen.lost) == lose
        assert seen.counts[0] == -3 and all(c == 3 for c in seen.counts[1:])
        assert [(r.seq, r.duplicate) for r in results] == [(2, True), (3, True), (4, True)]
        assert await history(a, "s") == [
            turn(0),
            turn(1),
            turn(2),
            turn(3),
            *(other(str(n)) for n in range(lose)),
        ]


async def test_replies_lost_past_every_retry_raise_and_store_the_call_once(
    settings: Settings, tenant: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every reply lost: the call raises, the messages are stored once (at most once)."""
    async with fast_retry_pods(settings, tenant, retry_attempts=2) as (a, _):
        await a.append("s", turn(0))
        seen = wire(a, monkeypatch, lose=10)
        with pytest.raises(StoreUnavailableError):
            await a.append_many("s", [turn(1), turn(2)])
        assert seen.counts == [-2, 2, 2]
        assert await history(a, "s") == [turn(0), turn(1), turn(2)]


@pytest.mark.parametrize("full", [False, True], ids=["lean", "full"])
async def test_a_first_attempt_that_never_reached_redis_is_written_by_the_retry_once(
    settings: Settings, tenant: str, monkeypatch: pytest.MonkeyPatch, full: bool
) -> None:
    """The first (lookup-free) attempt fails before Redis, a retry's reply is lost: once."""
    async with fast_retry_pods(settings, tenant) as (a, _):
        await a.append("s", turn(0))
        seen = wire(a, monkeypatch, fail=1, lose=1)
        result = await a.append("s", turn(1), pinned=full)
        form = FULL[0] if full else LEAN[0]
        assert seen.unsent == [(form, -1)]
        assert seen.sends == [(form, 1), (form, 1)]
        assert (result.seq, result.duplicate) == (2, True)
        assert await history(a, "s") == [turn(0), turn(1)]


async def test_a_lean_refusal_then_a_lost_full_reply_then_another_pods_delete(
    settings: Settings, tenant: str, monkeypatch: pytest.MonkeyPatch, raw_redis: Redis
) -> None:
    """Lean refused (a TTL due to move), full applied, reply lost, delete: once."""
    async with fast_retry_pods(settings, tenant) as (a, b):
        await a.append("s", turn(0))
        await b.set_ttl("s", 3_600)
        await raw_redis.pexpire(a.keys("s").meta, 3_599_000)  # a second on: due to move
        seen = wire(a, monkeypatch, lose=1, between=lambda: b.delete("s"))
        result = await a.append("s", turn(1))
        assert seen.sends == [(LEAN[0], -1), (FULL[0], 1), (FULL[0], 1)]
        assert (result.seq, result.duplicate) == (2, True)
        assert await history(a, "s") == []
        await a.append("s", turn(2))  # the next life: no ghost of turn 1
        assert await history(a, "s") == [turn(2)]


# -- a new session: refused for a reservation, then run under one ---------------------------


CREATION_BETWEEN: dict[str, tuple[Callable[[ContextStore], Awaitable[Any]], list[Any]]] = {
    "nothing": (lambda b: asyncio.sleep(0), [turn(0), turn(1)]),
    "append": (lambda b: b.append("n", other("b")), [turn(0), turn(1), other("b")]),
    "delete": (lambda b: b.delete("n"), []),
    "replace": (lambda b: b.replace("n", [other("r")]), [other("r")]),
    "pop": (lambda b: b.pop("n"), [turn(0)]),
}


@pytest.mark.parametrize("backend", BACKENDS, indirect=True)
@pytest.mark.parametrize("full", [False, True], ids=["lean", "full"])
@pytest.mark.parametrize("action", list(CREATION_BETWEEN))
async def test_a_creating_append_whose_reply_is_lost_twice_is_stored_once(
    settings: Settings,
    tenant: str,
    monkeypatch: pytest.MonkeyPatch,
    full: bool,
    action: str,
) -> None:
    """A new session: refused (reserve), run under a reservation, two replies lost: once."""
    act, expected = CREATION_BETWEEN[action]
    async with fast_retry_pods(settings, tenant) as (a, b):
        losses = itertools.count()

        async def between() -> None:
            if next(losses) == 0:
                await act(b)

        seen = wire(a, monkeypatch, lose=2, between=between)
        results = await a.append_many("n", [turn(0), turn(1)], pinned=full)
        first = FULL[0] if full else LEAN[0]
        assert seen.sends == [(first, -2), (FULL[0], 2), (FULL[0], 2), (FULL[0], 2)]
        assert seen.lost == [1, 2]
        assert [(r.seq, r.duplicate) for r in results] == [(1, True), (2, True)]
        assert await history(b, "n") == expected
        listed = {row.session for row in await b.list_sessions()}
        assert listed == ({"n"} if expected else set())


# -- Functions, and the EVAL sent after a NOSCRIPT ------------------------------------------


@pytest.mark.parametrize("mode", ["functions", "eval_after_noscript"])
async def test_lost_replies_in_functions_mode_and_after_noscript(
    servers: ServerPool, monkeypatch: pytest.MonkeyPatch, mode: str
) -> None:
    """FCALL, or EVAL after a flushed script cache: lean, full and creating, each once."""
    server = servers.start()
    settings = Settings(
        redis_url=server.url(),
        key_prefix="mk",
        queue_name="mk:q",
        script_mode="functions" if mode == "functions" else "eval",
        retry_base_delay=0.001,
        retry_max_delay=0.002,
    )
    admin = Redis.from_url(server.url())
    try:
        async with (
            ContextStore.from_settings(settings, tenant="acme") as a,
            ContextStore.from_settings(settings, tenant="acme") as b,
        ):
            if mode == "functions":
                await load_functions(a._connection)
            await a.append("s", turn(0))

            async def flush(_: int = 0) -> None:  # every send meets NOSCRIPT, then EVAL
                if mode != "functions":
                    await admin.script_flush()

            await flush()

            async def other_appends() -> None:
                await b.append("s", other("x"))

            for pinned, n in ((False, 1), (True, 2)):  # lean, then full
                seen = wire(a, monkeypatch, lose=1, between=other_appends, after=flush)
                result = await a.append("s", turn(n), pinned=pinned)
                assert seen.counts == [-1, 1]
                assert (result.seq, result.duplicate) == (2 * n, True)
                monkeypatch.undo()
            seen = wire(a, monkeypatch, lose=2, after=flush)
            created = await a.append("n", turn(9))
            assert seen.counts == [-1, 1, 1, 1]
            assert (created.seq, created.duplicate) == (1, True)
            assert await history(a, "s") == [turn(0), turn(1), other("x"), turn(2), other("x")]
            assert await history(a, "n") == [turn(9)]
    finally:
        await admin.aclose()


# -- writers whose made keys collide (a forked process, or a prefix drawn twice) -----------


async def test_two_writers_with_one_key_prefix_both_store_their_messages(
    settings: Settings, tenant: str
) -> None:
    """Same prefix, same counter: the second's first attempt, skipping lookups, still stores.

    (Before 8975578 the second call found the first's key and was answered with the
    first's entry: acknowledged, never stored.)
    """
    async with fast_retry_pods(settings, tenant) as (a, b):
        await a.append("s", turn(0))
        b._writer._key_prefix = a._writer._key_prefix
        b._writer._key_counter = itertools.count(1)  # a's next key is b's too
        mine = await a.append("s", turn(1))
        theirs = await b.append("s", other("b"))
        assert [(r.seq, r.duplicate) for r in (mine, theirs)] == [(2, False), (3, False)]
        assert await history(a, "s") == [turn(0), turn(1), other("b")]


async def test_a_lost_reply_retried_after_a_colliding_writer_stores_each_message_once(
    settings: Settings, tenant: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A's reply lost, B appends under A's very key, A's retry: each message once.

    A's retry is answered with B's entry (the key now names it): the AppendResult of A
    points at B's message (seq 3, not 2). Stored exactly once all the same.
    """
    async with fast_retry_pods(settings, tenant) as (a, b):
        await a.append("s", turn(0))
        b._writer._key_prefix = a._writer._key_prefix
        b._writer._key_counter = itertools.count(1)
        acks = []

        async def b_appends() -> None:
            acks.append(await b.append("s", other("b")))

        seen = wire(a, monkeypatch, lose=1, between=b_appends)
        result = await a.append("s", turn(1))
        assert seen.counts == [-1, 1]
        assert [(r.seq, r.duplicate) for r in acks] == [(3, False)]
        assert (result.seq, result.duplicate) == (3, True)  # misattributed, not doubled
        assert await history(a, "s") == [turn(0), turn(1), other("b")]


# -- replicas that do not acknowledge -------------------------------------------------------


async def test_a_write_no_replica_acknowledged_raises_and_is_stored_once(
    servers: ServerPool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """replica_acks=1 with no replica: ReplicationError, lost replies or not: stored once."""
    server = servers.start()
    settings = Settings(
        redis_url=server.url(),
        key_prefix="ra",
        queue_name="ra:q",
        replica_acks=1,
        replica_ack_timeout_ms=1,
        retry_base_delay=0.001,
        retry_max_delay=0.002,
    )
    async with ContextStore.from_settings(settings, tenant="acme") as a:
        with pytest.raises(ReplicationError):
            await a.append("s", turn(0))  # created, all the same
        seen = wire(a, monkeypatch)
        with pytest.raises(ReplicationError):
            await a.append("s", turn(1))
        assert seen.counts == [-1]
        monkeypatch.undo()
        seen = wire(a, monkeypatch, lose=1)
        with pytest.raises(ReplicationError):
            await a.append_many("s", [turn(2), turn(3)])
        assert seen.counts == [-2, 2]
        assert await history(a, "s") == [turn(n) for n in range(4)]


# -- connections cut between a request and its reply ----------------------------------------


def _who(message: dict[str, Any]) -> tuple[int, int, int]:
    body = json.loads(message["content"])
    return body["w"], body["i"], body["j"]


async def test_pods_appending_through_a_reply_dropping_proxy_store_acknowledged_calls_once(
    settings: Settings, redis_url: str, tenant: str
) -> None:
    """3 pods, made keys only, append/append_many through a proxy losing 30% of replies.

    An acknowledged call: each of its messages once, at the seq it was told. A call
    that raised: each message at most once, all or none.
    """
    proxied = dropping(
        settings,
        redis_url,
        drop_rate=0.3,
        seed=11,
        retry_attempts=4,
        retry_base_delay=0.001,
        retry_max_delay=0.002,
    )
    acked: dict[tuple[int, int, int], str] = {}
    raised: set[tuple[int, int]] = set()

    async def writer(w: int) -> None:
        async with ContextStore.from_settings(flaky, tenant=tenant) as pod:
            for i in range(30):
                size = 1 + i % 3
                batch = [
                    {"role": "user", "content": json.dumps({"w": w, "i": i, "j": j})}
                    for j in range(size)
                ]
                try:
                    results = await pod.append_many("p", batch, pinned=i % 5 == 0)
                except StoreUnavailableError:
                    raised.add((w, i))
                    continue
                assert len(results) == size
                for j, r in enumerate(results):
                    acked[(w, i, j)] = r.entry_id

    async with proxied as (flaky, proxy):
        await asyncio.gather(*(writer(w) for w in range(3)))
    async with ContextStore.from_settings(settings, tenant=tenant) as direct:
        stored = [(_who(m.message), m.entry_id) async for m in direct.iter_history("p")]
    assert proxy.dropped > 10
    counts: dict[tuple[int, int, int], int] = {}
    for who, _ in stored:
        counts[who] = counts.get(who, 0) + 1
    assert {who: n for who, n in counts.items() if n > 1} == {}  # never twice
    assert {who: id_ for who, id_ in stored if who in acked} == acked  # acked: as told
    for w, i in raised:  # raised: all or none
        assert len({j for (ww, ii, j) in counts if (ww, ii) == (w, i)}) in (0, 1 + i % 3)
    assert {(w, i) for (w, i, _) in counts} - {(w, i) for (w, i, _) in acked} <= raised


# -- the caller's list, read again on a later attempt ---------------------------------------


async def test_a_list_shortened_during_a_retry_is_still_stored_whole(
    settings: Settings, tenant: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first attempt never reached Redis; the caller's list shrinks before the retry."""
    async with fast_retry_pods(settings, tenant) as (a, _):
        await a.append("s", turn(0))
        batch = [turn(1), turn(2)]

        async def caller_mutates() -> None:  # during the retry's back-off: the caller's task
            batch.pop()

        seen = wire(a, monkeypatch, fail=1, between=caller_mutates)
        results = await a.append_many("s", batch)
        assert seen.unsent == [(LEAN[0], -2)] and seen.sends == [(LEAN[0], 2)]
        assert await history(a, "s") == [turn(0), turn(1), turn(2)]
        assert [r.seq for r in results] == [2, 3]


async def test_a_list_shortened_while_a_new_session_is_reserved_is_still_stored_whole(
    settings: Settings, tenant: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No fault at all: lean refused (reserve), reserve, the full run sees the list shorter."""
    async with fast_retry_pods(settings, tenant) as (a, _):
        batch = [turn(0), turn(1)]

        async def caller_mutates(sent: int) -> None:
            if sent == 0:  # refused for a reservation: while it is taken, the caller's task
                batch.pop()

        seen = wire(a, monkeypatch, after=caller_mutates)
        results = await a.append_many("n", batch)
        assert seen.sends == [(LEAN[0], -2), (FULL[0], 2)]
        assert await history(a, "n") == [turn(0), turn(1)]
        assert len(results) == 2


async def test_a_list_grown_before_the_retry_of_an_applied_attempt_is_answered_once(
    settings: Settings, tenant: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Applied, reply lost, the caller's list grows: the retry sends what was serialized."""
    async with fast_retry_pods(settings, tenant) as (a, _):
        await a.append("s", turn(0))
        batch = [turn(1)]

        async def grow() -> None:
            batch.append(turn(2))

        seen = wire(a, monkeypatch, lose=1, between=grow)
        [result] = await a.append_many("s", batch)
        assert seen.counts == [-1, 1]  # the retry: the count of the call's own arguments
        assert (result.seq, result.duplicate) == (2, True)
        assert await history(a, "s") == [turn(0), turn(1)]


# -- idempotency generations ---------------------------------------------------------------


async def test_a_key_rotated_to_the_old_generation_is_still_found_by_the_retry(
    settings: Settings, tenant: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Window 2: another pod's appends rotate A's just-written key into idem_old: once."""
    async with fast_retry_pods(settings, tenant, idempotency_window=2) as (a, b):
        await a.append("s", turn(0))
        seen = wire(
            a, monkeypatch, lose=1, between=lambda: b.append_many("s", [other("1"), other("2")])
        )
        result = await a.append("s", turn(1))
        assert seen.counts == [-1, 1]
        assert (result.seq, result.duplicate) == (2, True)
        assert await history(a, "s") == [turn(0), turn(1), other("1"), other("2")]


# -- a reply that comes too late; concurrent calls of one writer; the caller's own keys -----


async def test_a_first_attempt_past_its_deadline_is_retried_with_lookups_once(
    settings: Settings, tenant: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Applied, then the reply stalls past operation_timeout (another pod appends): once.

    The stall is certain (the reply is held back); the deadline is long enough that only
    the stall meets it.
    """
    async with fast_retry_pods(settings, tenant, operation_timeout=1.0) as (a, b):
        await a.append("s", turn(0))
        never = asyncio.Event()
        stalls = itertools.count()
        seen = wire(a, monkeypatch)
        real = a._connection.node_call

        async def node_call(key: str, commands: Any, **kwargs: Any) -> Any:
            replies = await real(key, commands, **kwargs)
            if commands[0][1] in APPEND and next(stalls) == 0:
                await b.append("s", other("b"))
                await never.wait()  # the reply never comes: the call's deadline cancels it
            return replies

        monkeypatch.setattr(a._connection, "node_call", node_call)
        result = await a.append("s", turn(1))
        assert seen.counts == [-1, 1]
        assert (result.seq, result.duplicate) == (2, True)
        assert await history(a, "s") == [turn(0), turn(1), other("b")]


async def test_concurrent_calls_of_one_writer_with_lost_replies_each_store_once(
    settings: Settings, tenant: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Twelve calls of one pod at once, the first six applied replies lost: each once."""
    async with fast_retry_pods(settings, tenant) as (a, b):
        await a.append("s", turn(0))
        seen = wire(a, monkeypatch, lose=6, between=lambda: b.append("s", other("b")))
        batches = [[turn(100 + 10 * n + j) for j in range(1 + n % 2)] for n in range(12)]
        results = await asyncio.gather(*(a.append_many("s", batch) for batch in batches))
        assert len(seen.lost) == 6
        assert sum(1 for c in seen.counts if c < 0) == 12  # each call's first attempt
        stored = await history(a, "s")
        assert len(stored) == 1 + sum(len(b) for b in batches) + 6
        for batch, batch_results in zip(batches, results, strict=True):
            assert [stored.count(m) for m in batch] == [1] * len(batch)
            seqs = [r.seq for r in batch_results]
            assert seqs == list(range(seqs[0], seqs[0] + len(batch)))
            assert all(stored[s - 1] == m for s, m in zip(seqs, batch, strict=True))
        answered = [rs[0].duplicate for rs in results if len({r.duplicate for r in rs}) == 1]
        assert len(answered) == 12  # a call is answered whole, or written whole
        assert 1 <= sum(answered) <= 6


async def test_a_callers_key_is_looked_up_on_the_first_attempt_and_recovers_a_raised_call(
    settings: Settings, tenant: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Keys the caller gives are never sent as made; after a raised call, the same key: once."""
    async with fast_retry_pods(settings, tenant, retry_attempts=1) as (a, _):
        await a.append("s", turn(0))
        made = f"{a._writer._key_prefix}1"  # what the writer would make next, given by hand
        seen = wire(a, monkeypatch, lose=2)
        with pytest.raises(StoreUnavailableError):
            await a.append("s", turn(1), idempotency_key=made)
        result = await a.append("s", turn(1), idempotency_key=made)
        assert seen.counts == [1, 1, 1]
        assert (result.seq, result.duplicate) == (2, True)
        mine = await a.append("s", turn(2))  # the writer's own next key is that very one
        assert seen.counts[-1] == -1 and (mine.seq, mine.duplicate) == (3, False)
        assert await history(a, "s") == [turn(0), turn(1), turn(2)]


async def test_lost_replies_on_a_cluster_waiting_for_a_replica_store_once(
    cluster: Any, redis_url: str, tenant: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Cluster, replica_acks=1: a lost lean reply and a lost creating reply, each once."""
    settings = Settings(
        redis_url=cluster.url,
        redis_cluster=True,
        queue_url=redis_url,
        key_prefix=f"{RUN_PREFIX}-ra",
        queue_name=f"{RUN_PREFIX}-ra:q",
        replica_acks=1,
        replica_ack_timeout_ms=2_000,
        retry_base_delay=0.001,
        retry_max_delay=0.002,
    )
    async with fast_retry_pods(settings, tenant) as (a, b):
        await a.append("s", turn(0))
        seen = wire(a, monkeypatch, lose=1, between=lambda: b.append("s", other("b")))
        result = await a.append("s", turn(1))
        assert seen.counts == [-1, 1]
        assert (result.seq, result.duplicate) == (2, True)
        monkeypatch.undo()
        seen = wire(a, monkeypatch, lose=1)
        created = await a.append("n", turn(5))
        assert seen.counts == [-1, 1, 1] and (created.seq, created.duplicate) == (1, True)
        assert await history(b, "s") == [turn(0), turn(1), other("b")]
        assert await history(b, "n") == [turn(5)]
