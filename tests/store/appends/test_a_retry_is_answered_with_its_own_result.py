"""A retry of an applied write is answered with that write's result, whatever came between.

A write's reply is lost after Redis applied it, another pod writes, and the SDK retries
the same call: the retry gets the entry, epoch or generation the first send made, and
nothing is written twice. Through a proxy that loses a quarter of the replies, pods that
retry an unknown outcome under the same idempotency key lose and double nothing, and
each delete is counted once.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from redis.asyncio import Redis
from support.chaos import dropping
from support.faults import Action, drop_reply
from support.helpers import msg, turn
from support.tenant import listed

from ctxstore import ContextStore, LocalSummarizer, Settings, StoreUnavailableError
from ctxstore._layout.keys import session_keys
from ctxstore._redis.scripts import SCRIPTS
from ctxstore.testing import Ack, audit

OTHER_WRITES: dict[str, Callable[[ContextStore], Awaitable[Any]]] = {
    "append": lambda o: o.append("s", msg("other")),
    "append_many": lambda o: o.append_many("s", [msg("o1"), msg("o2")]),
    "replace": lambda o: o.replace("s", [msg("replacement")]),
    "clear": lambda o: o.clear("s"),
    "pin": lambda o: _pin_first(o),
    "set_ttl": lambda o: o.set_ttl("s", 3_600),
    "lease_and_release": lambda o: _lease_and_release(o),
    "list_sessions": lambda o: o.list_sessions(),
}


async def _pin_first(store: ContextStore) -> None:
    first = (await store.read("s", limit=1)).messages[0]
    assert await store.pin("s", first.entry_id)


async def _lease_and_release(store: ContextStore) -> None:
    async with await store.lease("s"):
        pass


@pytest.mark.parametrize("other_write", list(OTHER_WRITES))
async def test_an_append_retried_after_another_pods_write_is_answered_with_its_own_entry(
    pods: Callable[..., ContextStore],
    raw_redis: Redis,
    monkeypatch: pytest.MonkeyPatch,
    other_write: str,
) -> None:
    """An append applied, its reply lost, another pod writes, the retry: its own entry, once."""
    a, b = pods(), pods()
    await a.append("s", msg("first"))
    applied: dict[str, Any] = {}

    async def between() -> None:
        meta = await raw_redis.hgetall(a.keys("s").meta)
        applied.update(seq=int(meta[b"seq"]), id=meta[b"last_id"].decode())
        await OTHER_WRITES[other_write](b)

    dropped = drop_reply(a, monkeypatch, SCRIPTS.append, between)
    result = await a.append("s", msg("mine"))
    assert dropped == [True]
    assert (result.entry_id, result.seq) == (applied["id"], applied["seq"])
    contents = [m["content"] for m in await b.get_messages("s")]
    mine = msg("mine")["content"]
    if other_write in ("replace", "clear"):
        assert mine not in contents  # superseded: counted by the rewrite, not doubled
    else:
        assert contents.count(mine) == 1


async def test_an_append_many_if_retried_after_another_append_is_answered_not_refused(
    pods: Callable[..., ContextStore], monkeypatch: pytest.MonkeyPatch
) -> None:
    """append_many(expected_seq) applied, reply lost, another append: the retry gets its entries."""
    a, b = pods(), pods()
    first = await a.append("s", msg("0"))
    dropped = drop_reply(a, monkeypatch, SCRIPTS.append, lambda: b.append("s", msg("b")))
    results = await a.append_many("s", [msg("1"), msg("2")], expected_seq=first.seq)
    assert dropped == [True]
    assert [r.seq for r in results] == [first.seq + 1, first.seq + 2]
    assert [m["content"] for m in await a.get_messages("s")] == [
        msg(t)["content"] for t in ("0", "1", "2", "b")
    ]


@pytest.mark.parametrize("other_write", ["append", "pin", "set_ttl", "list_sessions"])
async def test_a_replace_retried_after_another_pods_non_rewriting_write_is_answered(
    pods: Callable[..., ContextStore], monkeypatch: pytest.MonkeyPatch, other_write: str
) -> None:
    """A replace applied, its reply lost, another pod's append/pin/set_ttl: the replace's result."""
    a, b = pods(), pods()
    await a.append_many("s", [msg("0"), msg("1")])
    dropped = drop_reply(a, monkeypatch, SCRIPTS.rewrite, lambda: OTHER_WRITES[other_write](b))
    result = await a.replace("s", [msg("r1"), msg("r2")])
    assert dropped == [True]
    assert (result.count, result.superseded, result.epoch) == (2, 2, 1)
    history = await a.read("s")
    assert result.entry_ids == tuple(m.entry_id for m in history.messages[:2])


@pytest.mark.parametrize("other_write", ["replace", "clear", "delete"])
async def test_a_replace_retried_after_another_pods_rewrite_or_delete_is_answered(
    pods: Callable[..., ContextStore], monkeypatch: pytest.MonkeyPatch, other_write: str
) -> None:
    """A replace applied, reply lost, another pod replaces/clears/deletes: the retry is answered."""
    a, b = pods(), pods()
    await a.append("s", msg("0"))
    other: dict[str, Action] = {
        "replace": lambda: b.replace("s", [msg("theirs")]),
        "clear": lambda: b.clear("s"),
        "delete": lambda: b.delete("s"),
    }
    dropped = drop_reply(a, monkeypatch, SCRIPTS.rewrite, other[other_write])
    result = await a.replace("s", [msg("mine")])
    assert dropped == [True]
    assert (result.epoch, result.count, result.superseded) == (1, 1, 1)


async def test_a_retried_delete_never_deletes_an_append_acknowledged_after_it(
    pods: Callable[..., ContextStore], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Delete applied, reply lost, another pod appends (acknowledged), the retry: append kept."""
    a, b = pods(), pods()
    await a.append("s", msg("old"))
    acks = []

    async def b_appends() -> None:
        acks.append(await b.append("s", msg("after the delete")))

    dropped = drop_reply(a, monkeypatch, SCRIPTS.delete, b_appends)
    assert await a.delete("s") is True
    assert dropped == [True]
    assert acks[0].epoch == 1  # b's append landed in the session's next life
    assert await b.get_messages("s") == [msg("after the delete")]


async def test_a_retried_delete_answers_true_after_a_recreate_and_delete_in_between(
    pods: Callable[..., ContextStore], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Delete applied, reply lost, another pod recreates then deletes: the retry says True."""
    a, b = pods(), pods()
    await a.append("s", msg("old"))

    async def recreate_and_delete() -> None:
        await b.append("s", msg("new"))
        await b.delete("s")

    drop_reply(a, monkeypatch, SCRIPTS.delete, recreate_and_delete)
    assert await a.delete("s") is True


async def test_a_retried_summary_request_answers_the_generation_it_raised(
    summary_settings: Settings, tenant: str, raw_redis: Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """request_summary applied, reply lost, a worker commits, the retry: the same generation."""
    async with (
        ContextStore.from_settings(summary_settings, tenant=tenant) as store,
        ContextStore.from_settings(summary_settings, tenant=tenant) as worker,
    ):
        for i in range(12):
            await store.append("s", turn(i))
        raised: list[int] = []

        async def worker_commits() -> None:
            raised.append(int(await raw_redis.hget(store.keys("s").meta, "sgen")))
            assert (await worker.summarize("s", LocalSummarizer())).status == "committed"

        dropped = drop_reply(store, monkeypatch, SCRIPTS.summary_request, worker_commits)
        generation = await store.request_summary("s", force=True)
        assert dropped == [True]
        assert generation == raised[0]


@pytest.mark.parametrize("written", [True, False])
async def test_a_lease_release_whose_reply_was_lost_says_it_released(
    pods: Callable[..., ContextStore],
    raw_redis: Redis,
    monkeypatch: pytest.MonkeyPatch,
    written: bool,
) -> None:
    """release() applied, reply lost, the SDK retries: True (it was ours), and nothing is left.

    On a session never written nothing may be left to remember the release by
    (its meta held only the fence): the retry answers False there, and says so
    in lease_release.lua; the lease is gone either way.
    """
    a = pods()
    if written:
        await a.append("s", msg("0"))
    lease = await a.lease("s")
    dropped = drop_reply(a, monkeypatch, SCRIPTS.lease_release)
    released = await lease.release()
    assert dropped == [True]
    assert not await raw_redis.exists(a.keys("s").lease)
    assert released is written
    if not written:
        assert not any([await raw_redis.exists(k) for k in a.keys("s").all()])


def _writer_key(message: dict[str, Any]) -> tuple[int, int] | None:
    if message["role"] != "user":
        return None
    body = json.loads(message["content"])
    return body["w"], body["i"]


async def _proxied_appends_and_replaces(
    settings: Settings, redis_url: str, tenant: str, *, writers: int, appends: int, replaces: int
) -> tuple[int, list[Any]]:
    """``writers`` pods append through a reply-dropping proxy while a direct pod replaces.

    Each pod retries an append that failed after the SDK's own retries with the
    same idempotency key (its outcome was unknown). Returns (dropped replies, audits).
    """
    proxied = dropping(
        settings,
        redis_url,
        drop_rate=0.25,
        seed=7,
        retry_attempts=3,
        retry_base_delay=0.001,
        retry_max_delay=0.005,
    )
    sessions = ["busy", "quiet"]
    acks: dict[str, list[Ack]] = {s: [] for s in sessions}
    rewrites: dict[str, list[Any]] = {s: [] for s in sessions}

    async def writer(w: int) -> None:
        async with ContextStore.from_settings(flaky, tenant=tenant) as pod:
            for i in range(appends):
                session = sessions[(w + i) % 2] if i % 3 == 0 else "busy"
                body = {"role": "user", "content": json.dumps({"w": w, "i": i})}
                key = f"w{w}-{i}"
                while True:
                    try:
                        result = await pod.append(session, body, idempotency_key=key)
                        break
                    except StoreUnavailableError:
                        continue  # unknown outcome: the same key again
                acks[session].append(Ack(w, i, result.entry_id, result.epoch))

    async def replacer() -> None:
        async with ContextStore.from_settings(settings, tenant=tenant) as pod:
            for r in range(replaces):
                await asyncio.sleep(0)
                result = await pod.replace("busy", [{"role": "assistant", "content": f"r{r}"}])
                rewrites["busy"].append(result)

    async with proxied as (flaky, proxy):
        await asyncio.gather(*(writer(w) for w in range(writers)), replacer())
    found = []
    async with ContextStore.from_settings(settings, tenant=tenant) as direct:
        for session in sessions:
            found.append(
                await audit(direct, session, acks[session], rewrites[session], key_of=_writer_key)
            )
        assert await listed(direct) == set(sessions)
    return proxy.dropped, found


async def test_appends_of_three_pods_through_a_dropping_proxy_are_never_lost_or_doubled(
    settings: Settings, redis_url: str, tenant: str
) -> None:
    """3 pods x 40 appends via a proxy losing 25% of replies, a pod replacing: 0 lost/doubled."""
    dropped, audits = await _proxied_appends_and_replaces(
        settings, redis_url, tenant, writers=3, appends=40, replaces=5
    )
    assert dropped > 10
    assert [(a.lost, a.duplicated, a.out_of_order) for a in audits] == [(0, 0, 0)] * 2
    assert sum(a.checked for a in audits) == 3 * 40


@pytest.mark.soak
async def test_appends_of_eight_pods_through_a_dropping_proxy_soak(
    settings: Settings, redis_url: str, tenant: str
) -> None:
    """8 pods x 500 appends through a proxy losing 25% of replies, 100 replaces: 0 lost/doubled."""
    dropped, audits = await _proxied_appends_and_replaces(
        settings, redis_url, tenant, writers=8, appends=500, replaces=100
    )
    assert dropped > 500
    assert [(a.lost, a.duplicated, a.out_of_order) for a in audits] == [(0, 0, 0)] * 2
    assert sum(a.checked for a in audits) == 8 * 500


@pytest.mark.soak
async def test_deletes_racing_appends_through_a_dropping_proxy_each_delete_once(
    settings: Settings, redis_url: str, tenant: str, raw_redis: Redis
) -> None:
    """3 pods append, 1 deletes, 25% of replies lost: deletions of each session == True deletes."""
    proxied = dropping(settings, redis_url, drop_rate=0.25, seed=3, retry_attempts=3)
    sessions = [f"s{i}" for i in range(4)]
    said_true = dict.fromkeys(sessions, 0)
    unknown = dict.fromkeys(sessions, 0)  # deletes that gave up: they may have deleted

    async def until_done(call: Action) -> Any:
        while True:
            with contextlib.suppress(StoreUnavailableError):
                return await call()

    async def appender(w: int) -> None:
        async with ContextStore.from_settings(flaky, tenant=tenant) as pod:
            for i in range(300):
                session, key = sessions[(w * 7 + i) % 4], f"{w}-{i}"
                await until_done(lambda s=session, k=key: pod.append(s, msg(k), idempotency_key=k))

    async def deleter() -> None:
        async with ContextStore.from_settings(flaky, tenant=tenant) as pod:
            for i in range(100):
                session = sessions[i % 4]
                try:
                    said_true[session] += await pod.delete(session)
                except StoreUnavailableError:
                    unknown[session] += 1
                await asyncio.sleep(0.002)  # let appends recreate it

    async with proxied as (flaky, proxy):
        await asyncio.gather(*(appender(w) for w in range(3)), deleter())
    assert proxy.dropped > 100
    deletions = {}
    for session in sessions:
        keys = session_keys(settings.key_prefix, tenant, session)
        epoch = await raw_redis.hget(keys.meta, "epoch")
        if epoch is None:  # deleted last: its tombstone holds the next epoch
            epoch = (await raw_redis.get(keys.gone) or b"0").split()[0]
        deletions[session] = int(epoch)  # each deletion moved the epoch by one (no rewrites)
    for session in sessions:
        assert said_true[session] <= deletions[session] <= said_true[session] + unknown[session]
