"""Every life of a session keeps its meta in the hashtable layout, and nothing shows the field.

Each way a session's meta can be made, or made again, leaves it in the hashtable
encoding with the ``layout`` field; an older meta (a listpack, no layout) reads and
writes as before, on warm pods too, and moves at its next idempotency generation; the
field never reaches what callers see.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from redis.asyncio import Redis
from support.config import BACKENDS
from support.helpers import dumped, system, ttl_span, turn
from support.layout import LAYOUT, encoding
from support.pods import warm_and_cold_pods
from support.servers import PrivateRedis

from ctxstore import ContextStore, Settings

pytestmark = pytest.mark.parametrize("backend", BACKENDS, indirect=True)

LAYOUT_VALUE = (
    b"1 meta in the hashtable encoding: this value is longer than hash-max-listpack-value"
)


async def assert_laid_out(raw: Redis, store: ContextStore, session: str, what: str) -> None:
    """The session's meta is a hashtable holding the layout, and lasts as the session does."""
    meta = store.keys(session).meta
    assert await raw.hget(meta, "seq") is not None, what
    assert await raw.hget(meta, LAYOUT) == LAYOUT_VALUE, what
    assert await encoding(raw, meta) == "hashtable", what


async def make_old(raw: Redis, store: ContextStore, session: str) -> dict[bytes, bytes]:
    """Rewrite the session's meta as an older version left it: no layout, a listpack, TTL kept."""
    meta = store.keys(session).meta
    fields = await raw.hgetall(meta)
    fields.pop(LAYOUT, None)
    pttl = await raw.pttl(meta)
    await raw.delete(meta)
    await raw.hset(meta, mapping=fields)
    if pttl > 0:
        await raw.pexpire(meta, pttl)
    assert await encoding(raw, meta) == "listpack"
    return fields


async def end_generation(raw: Redis, store: ContextStore, session: str) -> None:
    """Move the idempotency generation's start back two periods: the next append starts one."""
    meta = store.keys(session).meta
    since = int(await raw.hget(meta, "idem_since") or 0)
    await raw.hset(meta, "idem_since", since - store.settings.idempotency_seconds * 2000)


def stable(lines: list[str]) -> list[dict[str, Any]]:
    """Exported lines without the time of the export."""
    rows = [json.loads(line) for line in lines]
    for row in rows:
        row.pop("exported_at_ms", None)
    return rows


def contents(messages: list[dict[str, Any]]) -> list[str]:
    return [m["content"] for m in messages]


# -- every way of making (or making again) a session ------------------------------------


async def test_lease_before_creation_then_replace_or_append(
    store: ContextStore, raw_redis: Redis
) -> None:
    """A meta that held only a lease's fence (expiring) becomes a laid-out, persistent one."""
    lease = await store.lease("by-replace")
    meta = store.keys("by-replace").meta
    assert await raw_redis.hget(meta, LAYOUT) is None
    assert await raw_redis.pttl(meta) > 0
    await store.replace("by-replace", [turn(0), turn(1)], lease=lease)
    await assert_laid_out(raw_redis, store, "by-replace", "replace under a prior lease")
    assert await raw_redis.pttl(meta) == -1

    async with await store.lease("by-append"):
        await store.append("by-append", turn(0))
    await assert_laid_out(raw_redis, store, "by-append", "append while a lease is held")
    assert await raw_redis.pttl(store.keys("by-append").meta) == -1

    lease = await store.lease("by-clear")
    await store.clear("by-clear", lease=lease)
    await assert_laid_out(raw_redis, store, "by-clear", "clear of a new session")


async def test_delete_then_each_way_of_making_it_again(
    store: ContextStore, raw_redis: Redis
) -> None:
    """A deleted session made again (append, replace, clear, fork, import) is laid out."""
    await store.append_many("src", [system(), *(turn(i) for i in range(4))])
    lines = [line async for line in store.export_session("src")]
    makers = {
        "append": lambda s: store.append(s, turn(9)),
        "replace": lambda s: store.replace(s, [turn(8)]),
        "clear": lambda s: store.clear(s),
        "fork": lambda s: store.fork("src", s),
        "import": lambda s: store.import_sessions(lines, session=s),
    }
    for name, make in makers.items():
        session = f"again-{name}"
        await store.append_many(session, [turn(0), turn(1)])
        assert await store.delete(session)
        assert await raw_redis.exists(store.keys(session).meta) == 0
        await make(session)
        await assert_laid_out(raw_redis, store, session, f"{name} after delete")
        info = await store.info(session)
        assert info.exists and info.epoch >= 1, name  # the tombstone's epoch went on


async def test_forks_of_forks_rewinds_pops_and_checkpoints(
    store: ContextStore, raw_redis: Redis
) -> None:
    """Forks of forks (segments on a cluster), rewinds, pops to empty and checkpoints."""
    await store.append_many("a", [system(), *(turn(i) for i in range(6))])
    point = await store.checkpoint("a", "mid")
    await store.append_many("a", [turn(i) for i in range(6, 9)])
    await store.fork("a", "b")
    await store.append("b", turn(20))
    await store.fork("b", "c")
    await store.fork("c", "d", at=(await store.read("c", limit=3)).messages[-1].entry_id)
    await store.fork("a", "from-point", at=point)
    for session in ("a", "b", "c", "d", "from-point"):
        await assert_laid_out(raw_redis, store, session, f"fork {session}")

    await store.rewind("a", point)
    await assert_laid_out(raw_redis, store, "a", "rewind")
    first = (await store.read("b", limit=1)).messages[0].entry_id
    await store.rewind("b", first)
    await assert_laid_out(raw_redis, store, "b", "rewind to the first entry")

    await store.append_many("p", [turn(0), turn(1)])
    while await store.pop("p") is not None:
        pass
    await assert_laid_out(raw_redis, store, "p", "popped to empty")
    await store.append("p", turn(5))
    await assert_laid_out(raw_redis, store, "p", "appended after popping to empty")
    assert contents(await store.get_messages("p")) == [turn(5)["content"]]


async def test_a_session_that_expired_is_made_again_laid_out(
    store: ContextStore, raw_redis: Redis
) -> None:
    """A session whose TTL ran out is written again: a new meta, laid out."""
    await store.append_many("ttl", [turn(0), turn(1)])
    await store.set_ttl("ttl", 3_600)  # long enough to outlast any pause before the check
    await assert_laid_out(raw_redis, store, "ttl", "set_ttl")
    # As if the hour had passed: every key the TTL moved expires in a millisecond, and
    # Redis drops an expired key when it is next read (polled, never slept on).
    keys = store.keys("ttl")
    timed = [key for key in keys.all() if await raw_redis.pttl(key) > 0]
    assert keys.meta in timed and keys.log in timed
    for key in timed:
        await raw_redis.pexpire(key, 1)
    for _ in range(100_000):
        if await raw_redis.exists(*timed) == 0:
            break
    assert await raw_redis.exists(*timed) == 0
    await store.append("ttl", turn(2))
    await assert_laid_out(raw_redis, store, "ttl", "made again after expiring")
    assert contents(await store.get_messages("ttl")) == [turn(2)["content"]]


# -- nothing leaks the field ---------------------------------------------------------------


async def test_the_field_reaches_no_caller_and_no_counter(
    store: ContextStore, raw_redis: Redis
) -> None:
    """info, bytes, exports and forks are the same with or without the layout."""
    await store.append_many("s", [system(), *(turn(i) for i in range(5))])
    await store.checkpoint("s", "cp")
    laid = await store.info("s")
    laid_lines = [line async for line in store.export_session("s")]
    assert not any("layout" in line for line in laid_lines)
    assert not any("hashtable" in line for line in laid_lines)
    fields = await raw_redis.hgetall(store.keys("s").meta)
    size = sum(len(turn(i)["content"]) for i in range(5)) + 2 * len(system()["content"])
    assert int(fields[b"bytes"]) < size + 2_000  # a checkpoint's record, never the layout's 83

    await make_old(raw_redis, store, "s")
    assert await store.info("s") == laid
    assert stable([line async for line in store.export_session("s")]) == stable(laid_lines)

    # A fork of an old session is laid out; its own counters are its source's.
    await store.fork("s", "f")
    await assert_laid_out(raw_redis, store, "f", "fork of an old session")
    forked = await store.info("f")
    assert (forked.count, forked.tokens) == (laid.count, laid.tokens)
    assert not any(["layout" in line async for line in store.export_session("f")])


# -- an older meta, on warm pods -----------------------------------------------------------


async def test_an_old_meta_on_warm_pods_reads_writes_and_moves(
    settings: Settings, tenant: str, raw_redis: Redis
) -> None:
    """Warm pods and a cold one agree on a listpack meta, through its move to the hashtable."""
    async with warm_and_cold_pods(settings, tenant) as (a, b, cold):
        await a.append_many("s", [system(), *(turn(i) for i in range(6))])
        for pod in (a, b, cold):
            await pod.view("s", token_budget=600)  # warm
        await make_old(raw_redis, a, "s")
        meta = a.keys("s").meta

        want = [system()["content"], *(turn(i)["content"] for i in range(6))]
        for i in range(6, 10):
            await (a if i % 2 else b).append("s", turn(i))
            want.append(turn(i)["content"])
            assert await encoding(raw_redis, meta) == "listpack"
            for pod in (a, b):
                for budget in (600, 100_000):
                    view = await pod.view("s", token_budget=budget)
                    assert dumped(view) == dumped(await cold.view("s", token_budget=budget))
        assert contents(await b.get_messages("s")) == want

        await end_generation(raw_redis, a, "s")
        await b.append("s", turn(10))
        want.append(turn(10)["content"])
        await assert_laid_out(raw_redis, a, "s", "an old meta at its next generation")
        for pod in (a, b):
            view = await pod.view("s", token_budget=100_000)
            assert dumped(view) == dumped(await cold.view("s", token_budget=100_000))
            assert contents(view.messages) == want
        info = await a.info("s")
        assert info.count == len(want) and info.seq == len(want)


async def test_an_old_meta_with_its_own_ttl_moves_on_the_full_form(
    store: ContextStore, raw_redis: Redis
) -> None:
    """A session with a TTL of its own appends in the full form: it moves there too, TTL kept."""
    await store.append_many("s", [turn(0), turn(1)])
    await store.set_ttl("s", 3_600)
    await make_old(raw_redis, store, "s")
    await store.append("s", turn(2))
    assert await encoding(raw_redis, store.keys("s").meta) == "listpack"
    await end_generation(raw_redis, store, "s")
    await store.append("s", turn(3))
    await assert_laid_out(raw_redis, store, "s", "full form")
    assert 0 < await raw_redis.pttl(store.keys("s").meta) <= ttl_span(3_600_000)
    assert contents(await store.get_messages("s")) == [turn(i)["content"] for i in range(4)]


async def test_an_old_meta_survives_a_duplicate_only_append(
    store: ContextStore, raw_redis: Redis
) -> None:
    """A retried append (nothing new) writes nothing: an old meta's fields stay as they were."""
    await store.append_many("s", [turn(0)], idempotency_keys=["k0"])
    await make_old(raw_redis, store, "s")
    await end_generation(raw_redis, store, "s")
    before = await raw_redis.hgetall(store.keys("s").meta)
    [again] = await store.append_many("s", [turn(0)], idempotency_keys=["k0"])
    assert again.duplicate
    assert await raw_redis.hgetall(store.keys("s").meta) == before


# -- the threshold the README gives --------------------------------------------------------


@pytest.mark.parametrize(("limit", "kept_as"), [(82, "hashtable"), (83, "listpack")])
async def test_the_readme_threshold_for_listpack_metas(
    backend: str, tenant: str, limit: int, kept_as: str
) -> None:
    """README: "on a server whose hash-max-listpack-value is 83 or more, metas are listpacks".

    Redis converts a hash only when a value is *longer* than hash-max-listpack-value;
    the layout is 83 bytes. Either way the field is written.
    """
    if backend != "single":
        pytest.skip("a private server of one's own")
    from support.servers import redis7_binary

    binary = redis7_binary()
    if binary is None:
        pytest.skip("needs Redis 7")
    with PrivateRedis(binary) as server:
        raw = Redis.from_url(server.url())
        try:
            await raw.config_set("hash-max-listpack-value", limit)
            settings = Settings(redis_url=server.url(), key_prefix="attack")
            async with ContextStore.from_settings(settings, tenant=tenant) as store:
                await store.append("s", turn(0))
                assert await raw.hget(store.keys("s").meta, LAYOUT) == LAYOUT_VALUE
                assert await encoding(raw, store.keys("s").meta) == kept_as, limit
        finally:
            await raw.aclose()
