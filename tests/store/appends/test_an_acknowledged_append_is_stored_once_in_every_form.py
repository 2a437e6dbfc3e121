"""An acknowledged append is stored once in every form: lean or full, bare or not, old or new.

An idempotency generation is kept as a hashtable from its 17th key on (the append writes
``''`` -> ``LAYOUT`` into it); the bare form sends 3 arguments a message (data, tokens,
key) when none of the call's messages has a kind, ids or a preview, and the script
derives how many a message has from ``#ARGV``. An append the SDK acknowledges is stored
once whatever replies are lost, in either form (lean or full), bare or not, in Functions
mode and on a cluster; a refusal writes nothing; both argument forms store and charge
the same; an older pod's script (``OLD_COMMIT``) shares the hashes with new ones; the
other calls' records, rotations and deletes still answer; and the ``''`` field reaches
no caller.

Every send of an append is seen through ``tap``, which may also rewrite it: widened to
the 8-argument form (``widen``), or run by the older script (``old``), as an older pod
would send it.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from redis.asyncio import Redis
from support.append_forms import (
    FULL,
    LEAN,
    leanify,
    old_append,
    tap,
)
from support.config import BACKENDS
from support.faults import drop_reply
from support.helpers import key_states, oa_call, oa_result, turn
from support.layout import encoding
from support.pods import fast_retry_pods
from support.servers import ServerPool

from ctxstore import ContextStore, QuotaExceededError, Settings
from ctxstore._redis.functions import load_functions
from ctxstore._redis.scripts import SCRIPTS
from ctxstore.testing import ManualClock

TABLE_AT = 16
"""``IDEM_TABLE_AT`` in append.lua: the generation's 17th key brings the layout field."""

LAYOUT = b"1 meta in the hashtable encoding: this value is longer than hash-max-listpack-value"
"""``LAYOUT`` in _lib.lua."""


Action = Callable[[], Awaitable[Any]]


# -- the wire -------------------------------------------------------------------------------


async def end_generation(raw: Redis, store: ContextStore, session: str) -> None:
    """Move the idempotency generation's start back two periods: the next append starts one."""
    meta = store.keys(session).meta
    since = int(await raw.hget(meta, "idem_since") or 0)  # type: ignore[misc]
    back = since - int(store.settings.idempotency_seconds * 2000)
    await raw.hset(meta, "idem_since", str(back))  # type: ignore[misc]


async def contents(store: ContextStore, session: str) -> list[str]:
    return [m["content"] for m in await store.get_messages(session)]


def texts(*ns: int) -> list[str]:
    return [turn(n)["content"] for n in ns]


async def is_table(raw: Redis, key: str) -> bool:
    """The generation is a hashtable holding the layout field (else a listpack without it)."""
    kind = await encoding(raw, key)
    layout = await raw.hget(key, "")  # type: ignore[misc]
    assert (kind, layout) in (("hashtable", LAYOUT), ("listpack", None)), (kind, layout)
    return kind == "hashtable"


def tool_call(cid: str) -> dict[str, Any]:
    return oa_call(cid)


# -- lost replies across the lean -> full fallback, bare -----------------------------------


@pytest.mark.parametrize("backend", BACKENDS, indirect=True)
async def test_a_bare_batch_lost_after_the_lean_refusal_crosses_the_table_once(
    settings: Settings, tenant: str, raw_redis: Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Lean refused (another pod's TTL); the full bare send converts, its reply lost: once."""
    async with fast_retry_pods(settings, tenant) as (pod, other):
        for i in range(TABLE_AT - 2):
            await pod.append("s", turn(i))
        keys = pod.keys("s")
        assert not await is_table(raw_redis, keys.idem)
        await other.set_ttl("s", 600)
        for key in (keys.log, keys.meta):
            await raw_redis.pexpire(key, 5_000)

        sends = tap(
            pod,
            monkeypatch,
            lose=1,
            form=FULL[0],
            between=lambda: other.append("s", turn(99)),
        )
        results = await pod.append_many("s", [turn(14), turn(15), turn(16)])
        assert sends.shapes == [(LEAN[0], -3, 3), (FULL[0], 3, 3), (FULL[0], 3, 3)]
        assert [(r.seq, r.duplicate) for r in results] == [(15, True), (16, True), (17, True)]
        assert await contents(pod, "s") == texts(*range(17), 99)
        assert await is_table(raw_redis, keys.idem)
        assert await raw_redis.hlen(keys.idem) == 18 + 1  # type: ignore[misc]
        for key in (keys.log, keys.meta):
            assert await raw_redis.pttl(key) > 500_000, key
        # every message written has its key in the generation, the other pod's too
        fields = await raw_redis.hgetall(keys.idem)  # type: ignore[misc]
        assert fields.pop(b"") == LAYOUT
        assert sorted(int(value.split()[1]) for value in fields.values()) == list(range(1, 19))


async def test_a_lost_lean_bare_reply_retried_as_full_after_a_ttl_is_answered_once(
    settings: Settings, tenant: str, raw_redis: Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The lean bare send converts the generation, reply lost; a TTL elsewhere; retried full."""
    async with fast_retry_pods(settings, tenant) as (pod, other):
        await pod.append_many("s", [turn(i) for i in range(TABLE_AT)])
        keys = pod.keys("s")
        assert not await is_table(raw_redis, keys.idem)

        async def ttl_set_a_while_ago() -> None:
            await other.set_ttl("s", 600)
            await raw_redis.pexpire(keys.meta, 599_000)  # a second on: due to move

        sends = tap(pod, monkeypatch, lose=1, form=LEAN[0], between=ttl_set_a_while_ago)
        [result] = await pod.append_many("s", [turn(16)])
        assert sends.shapes == [(LEAN[0], -1, 3), (LEAN[0], 1, 3), (FULL[0], 1, 3)]
        assert (result.seq, result.duplicate) == (17, True)
        assert await is_table(raw_redis, keys.idem)
        assert await contents(pod, "s") == texts(*range(17))
        assert await raw_redis.pttl(keys.log) > 500_000


# -- batches mixing bare-eligible and other messages; retries in another shape ------------


async def test_a_key_answers_its_retry_whichever_form_either_send_took(
    store: ContextStore, raw_redis: Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Keys written bare are answered in 8-argument batches, and the other way round."""
    for i in range(TABLE_AT - 2):
        await store.append("s", turn(i), idempotency_key=f"p{i}")
    keys = store.keys("s")
    sends = tap(store, monkeypatch)
    mixed = [turn(14), tool_call("c1"), oa_result("c1"), turn(15)]
    first = await store.append_many("s", mixed, idempotency_keys=["m0", "m1", "m2", "m3"])
    assert await is_table(raw_redis, keys.idem)  # the 17th key came in the 8-argument form
    assert [r.seq for r in first] == [15, 16, 17, 18]

    [again] = await store.append_many("s", [turn(14)], idempotency_keys=["m0"])  # bare
    assert again.duplicate and again.entry_id == first[0].entry_id
    [call] = await store.append_many("s", [tool_call("c1")], idempotency_keys=["m1"])
    assert call.duplicate and call.entry_id == first[1].entry_id
    pair = await store.append_many("s", [turn(15), turn(16)], idempotency_keys=["m3", "n0"])
    assert [(r.seq, r.duplicate) for r in pair] == [(18, True), (19, False)]
    # a key written bare, in a batch with a tool call (8 arguments)
    crossed = await store.append_many("s", [turn(3), tool_call("c2")], idempotency_keys=["p3", "q"])
    assert [(r.seq, r.duplicate) for r in crossed] == [(4, True), (20, False)]
    # retried pinned (the full 8-argument form): answered, and no keep copy is made
    [pinned] = await store.append_many("s", [turn(16)], idempotency_keys=["n0"], pinned=True)
    assert (pinned.seq, pinned.duplicate) == (19, True)
    assert await raw_redis.exists(keys.keep) == 0
    assert sends.per == [8, 3, 8, 3, 8, 8]
    assert sends.shapes[-1][0] == FULL[0]
    stored = await store.get_messages("s")
    assert len(stored) == 20 and stored[15]["tool_calls"][0]["id"] == "c1"
    assert stored[16]["tool_call_id"] == "c1" and stored[19]["tool_calls"][0]["id"] == "c2"
    assert [m["content"] for m in stored[:15]] == texts(*range(15))


async def test_a_lone_call_or_small_result_never_goes_bare(
    store: ContextStore, raw_redis: Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ids alone (no kind, no preview) take the 8 arguments, and the entry keeps them."""
    await store.append("s", turn(0))
    sends = tap(store, monkeypatch)
    await store.append("s", tool_call("c1"))  # call ids only
    await store.append("s", oa_result("c1", "small"))  # result ids only, no preview
    reasoning = {"type": "reasoning", "id": "rs_1", "summary": []}
    after = {"role": "assistant", "content": "done"}
    await store.append_many("s", [reasoning, after])  # glued: ids the SDK made
    await store.append_many("s", [turn(i) for i in range(1, 1 + TABLE_AT)])
    assert sends.per == [8, 8, 8, 3]
    rows = [row[1] for row in await raw_redis.xrange(store.keys("s").log)]
    assert rows[1][b"c"] == b"c1" and b"r" not in rows[1]
    assert rows[2][b"r"] == b"c1" and b"v" not in rows[2]
    assert rows[3][b"c"].startswith(b"~reasoning:") and rows[4][b"r"] == rows[3][b"c"]
    assert all(sorted(row) == [b"k", b"m", b"n", b"t"] for row in rows[5:])
    assert await is_table(raw_redis, store.keys("s").idem)
    view = await store.view("s", token_budget=100_000)
    assert [m.get("tool_call_id") for m in view.messages[1:3]] == [None, "c1"]


async def test_a_preview_goes_with_8_arguments_a_large_plain_message_goes_bare(
    store: ContextStore, raw_redis: Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A tool result over the offload threshold has a preview; bytes count it, once."""
    await store.append("s", turn(0))
    sends = tap(store, monkeypatch)
    big_user = {"role": "user", "content": "word " * 3000}  # large, but no result ids
    await store.append("s", big_user)
    await store.append_many("s", [turn(1), tool_call("c1")])
    result = oa_result("c1", "word " * 3000)
    retried = [await store.append("s", result, idempotency_key="r") for _ in range(2)]
    assert [r.duplicate for r in retried] == [False, True]
    await store.append_many("s", [turn(i) for i in range(2, 2 + TABLE_AT)])
    assert sends.per == [3, 8, 8, 8, 3]
    rows = await raw_redis.xrange(store.keys("s").log)
    fields = [row[1] for row in rows]
    assert b"v" not in fields[1] and b"v" in fields[4] and b"r" in fields[4]
    charged = sum(len(f[b"m"]) + len(f.get(b"v", b"")) for f in fields)
    meta = await raw_redis.hgetall(store.keys("s").meta)  # type: ignore[misc]
    assert int(meta[b"bytes"]) == charged
    assert int(meta[b"tokens"]) == sum(int(f[b"t"]) for f in fields)
    assert await is_table(raw_redis, store.keys("s").idem)
    messages = await store.get_messages("s")
    assert messages[1] == big_user and messages[4]["content"] == result["content"]


# -- both argument forms store and charge the same; quotas refuse with nothing written -----


MIXED_TEXTS = [
    "plain",
    "ünïcødé ✓ 🙂 " * 20,
    'quotes " and \\ backslashes',
    "long " * 4000,
    "\x1f\x1e separators inside",
]


def plain(i: int) -> dict[str, Any]:
    text = MIXED_TEXTS[i % len(MIXED_TEXTS)]
    return {"role": "user" if i % 2 else "assistant", "content": f"{i}: {text}"}


async def test_bare_and_8_argument_forms_store_and_charge_the_same(
    settings: Settings, tenant: str, raw_redis: Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same messages, sent bare by one pod and in 8 arguments by another: equal sessions.

    The same entries, counters, summaries due, and generations.
    """
    small = {"summary_trigger_tokens": 3_000, "summary_keep_tokens": 500}
    async with fast_retry_pods(settings, tenant, **small) as (bare, wide):
        seen = tap(bare, monkeypatch)
        widened = tap(wide, monkeypatch, widen=True)
        due: dict[str, list[bool]] = {}
        for store, session in ((bare, "a"), (wide, "b")):
            results = [await store.append(session, plain(0))]
            results += await store.append_many(session, [plain(i) for i in range(1, 12)])
            for i in range(12, 20):
                results.append(await store.append(session, plain(i)))
            due[session] = [r.summary_due for r in results]
        assert set(seen.per) == {3} and set(widened.per) == {8}
        assert due["a"] == due["b"] and any(due["a"]) and not all(due["a"])
        rows_a = await raw_redis.xrange(bare.keys("a").log)
        rows_b = await raw_redis.xrange(wide.keys("b").log)
        assert [r[1] for r in rows_a] == [r[1] for r in rows_b]
        meta_a = await raw_redis.hgetall(bare.keys("a").meta)  # type: ignore[misc]
        meta_b = await raw_redis.hgetall(wide.keys("b").meta)  # type: ignore[misc]
        for name in (b"bytes", b"tokens", b"count", b"seq", b"idem_n", b"sq"):
            assert meta_a[name] == meta_b[name], name
        assert int(meta_a[b"bytes"]) == sum(len(r[1][b"m"]) for r in rows_a)
        for store, session in ((bare, "a"), (wide, "b")):
            assert await is_table(raw_redis, store.keys(session).idem)
            assert await raw_redis.hlen(store.keys(session).idem) == 21  # type: ignore[misc]
        assert await bare.get_messages("a") == await wide.get_messages("b")


def session_keys(store: ContextStore, session: str) -> list[str]:
    keys = store.keys(session)
    return [keys.log, keys.meta, keys.idem, keys.idem_old, keys.keep, keys.gone]


@pytest.mark.parametrize("quota", ["session_bytes", "session_tokens", "appends_per_second"])
async def test_a_quota_refuses_the_17th_key_alike_in_both_forms_with_nothing_written(
    settings: Settings,
    tenant: str,
    raw_redis: Redis,
    monkeypatch: pytest.MonkeyPatch,
    quota: str,
) -> None:
    """At the generation's 17th key: refused at the same line bare or not; no layout written."""
    messages = [plain(i) for i in range(TABLE_AT + 1)]
    async with fast_retry_pods(settings, tenant) as (probe, _):
        await probe.append_many("probe", messages[:TABLE_AT])
        meta = await raw_redis.hgetall(probe.keys("probe").meta)  # type: ignore[misc]
    choices: dict[str, dict[str, Any]] = {
        "session_bytes": {"session_bytes": int(meta[b"bytes"])},  # exactly the first 16
        "session_tokens": {"session_tokens": int(meta[b"tokens"])},
        "appends_per_second": {"appends_per_second": 0.001, "append_burst": TABLE_AT},
    }
    limits = choices[quota]
    refusals = []
    async with fast_retry_pods(settings, tenant, **limits) as (bare, wide):
        for store, session, widen in ((bare, "a", False), (wide, "b", True)):
            sends = tap(store, monkeypatch, widen=widen)
            await store.append_many(session, messages[:4])
            for message in messages[4:TABLE_AT]:
                await store.append(session, message)
            before = await key_states(raw_redis, session_keys(store, session))
            with pytest.raises(QuotaExceededError) as raised:
                await store.append(session, messages[TABLE_AT])
            assert await key_states(raw_redis, session_keys(store, session)) == before
            assert not await is_table(raw_redis, store.keys(session).idem)
            assert set(sends.per) == {8 if widen else 3}
            # A quota: the lean form carries it, once the session exists (its creation
            # is lean, refused for a reservation, then full).
            assert [keys for keys, _, _ in sends.shapes[:2]] == [LEAN[0], FULL[0]]
            assert {keys for keys, _, _ in sends.shapes[2:]} == {LEAN[0]}
            refusals.append((raised.value.quota, raised.value.limit))
            assert (await store.info(session)).count == TABLE_AT
    assert refusals[0] == refusals[1] and refusals[0][0] == quota


# -- Functions mode ------------------------------------------------------------------------


async def test_functions_mode_bare_forms_convert_rotate_and_answer_lost_replies(
    servers: ServerPool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """FCALL: bare lean and full sends, a lost reply at the 17th key, a TTL, a rotation."""
    server = servers.start()
    settings = Settings(
        redis_url=server.url(),
        script_mode="functions",
        key_prefix="fb",
        queue_name="fb:q",
        retry_base_delay=0.001,
        retry_max_delay=0.002,
    )
    raw = Redis.from_url(server.url())
    try:
        async with (
            ContextStore.from_settings(settings, tenant="acme") as pod,
            ContextStore.from_settings(settings, tenant="acme") as other,
        ):
            await load_functions(pod._connection)
            for i in range(TABLE_AT - 1):
                await pod.append("s", turn(i), idempotency_key=f"k{i}")
            await other.set_ttl("s", 600)
            await raw.pexpire(pod.keys("s").meta, 599_000)  # a second on: due to move
            sends = tap(pod, monkeypatch, lose=1, between=lambda: other.append("s", turn(99)))
            results = await pod.append_many(
                "s", [turn(15), turn(16)], idempotency_keys=["k15", "k16"]
            )
            assert [(r.seq, r.duplicate) for r in results] == [(16, True), (17, True)]
            assert sends.shapes == [(LEAN[0], 2, 3), (FULL[0], 2, 3), (FULL[0], 2, 3)]
            assert all(name == SCRIPTS.append.function for name in sends.names)
            keys = pod.keys("s")
            assert await is_table(raw, keys.idem)
            assert await raw.pttl(keys.log) > 500_000
            await other.set_ttl("s", None)
            await end_generation(raw, pod, "s")
            await pod.append("s", turn(17), idempotency_key="k17")
            assert await is_table(raw, keys.idem_old) and not await is_table(raw, keys.idem)
            for i in (0, 15, 16, 17):
                again = await pod.append("s", turn(i), idempotency_key=f"k{i}")
                assert again.duplicate and again.seq == (i + 1 if i < 17 else 19), i
            assert sends.shapes[-1] == (LEAN[0], 1, 3)
            assert await contents(pod, "s") == texts(*range(17), 99, 17)
    finally:
        await raw.aclose()


# -- an older pod and new pods on one session ---------------------------------------------


async def test_an_older_pod_and_a_new_one_answer_each_others_keys_through_the_table(
    settings: Settings, tenant: str, raw_redis: Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every key answers on either pod, in either encoding.

    The old script never writes the layout: a generation whose 17th key it took stays
    a listpack until its rotation (the new pod writes it only at exactly 16 keys).
    """
    script = old_append()
    async with fast_retry_pods(settings, tenant) as (new, old):
        old_sends = tap(old, monkeypatch, old=script)
        new_sends = tap(new, monkeypatch)
        keys = new.keys("s")
        written: dict[str, Any] = {}
        for i in range(10):
            written[f"n{i}"] = await new.append("s", turn(i), idempotency_key=f"n{i}")
        for i in range(10, TABLE_AT + 1):  # the old pod takes keys 11 to 17
            written[f"o{i}"] = await old.append("s", turn(i), idempotency_key=f"o{i}")
        assert not await is_table(raw_redis, keys.idem)  # the old script wrote no layout
        written["n17"] = await new.append("s", turn(17), idempotency_key="n17")
        assert not await is_table(raw_redis, keys.idem)  # idem_n went past 16: not this one
        assert {name for name in old_sends.names} <= {script.sha, "source"}
        assert set(old_sends.per) == {8} and set(new_sends.per) == {3}

        await end_generation(raw_redis, new, "s")
        batch = [turn(i) for i in range(18, 18 + TABLE_AT + 2)]
        names = [f"b{i}" for i in range(len(batch))]
        for name, result in zip(
            names, await new.append_many("s", batch, idempotency_keys=names), strict=True
        ):
            written[name] = result
        assert await is_table(raw_redis, keys.idem)  # the new pod's next generation converts
        assert not await is_table(raw_redis, keys.idem_old)
        written["o99"] = await old.append("s", turn(99), idempotency_key="o99")
        assert await raw_redis.hget(keys.idem, "") == LAYOUT  # type: ignore[misc]

        for name, first in written.items():
            for pod in (new, old):
                message = turn(99) if name == "o99" else turn(first.seq - 1)
                again = await pod.append("s", message, idempotency_key=name)
                assert again.duplicate, (name, pod is old)
                assert (again.entry_id, again.seq) == (first.entry_id, first.seq), name
        assert (await new.info("s")).count == len(written)

        # the old pod rotates the hashtable generation: it answers from idem_old on both
        await end_generation(raw_redis, new, "s")
        written["o100"] = await old.append("s", turn(100), idempotency_key="o100")
        assert await is_table(raw_redis, keys.idem_old)
        assert await raw_redis.hlen(keys.idem) == 1  # type: ignore[misc]
        for name in (*names, "o99", "o100"):
            first = written[name]
            message = turn({"o99": 99, "o100": 100}.get(name, first.seq - 1))
            for pod in (old, new):
                again = await pod.append("s", message, idempotency_key=name)
                assert again.duplicate and again.entry_id == first.entry_id, name
        assert (await new.info("s")).count == len(written)


async def test_an_older_pods_lost_reply_on_a_hashtable_generation_is_answered_once(
    settings: Settings, tenant: str, raw_redis: Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The new pod converted the generation; the old pod's bare-eligible append, reply lost."""
    script = old_append()
    async with fast_retry_pods(settings, tenant) as (new, old):
        await new.append_many("s", [turn(i) for i in range(TABLE_AT + 1)])
        assert await is_table(raw_redis, new.keys("s").idem)
        sends = tap(old, monkeypatch, old=script, lose=1, between=lambda: new.append("s", turn(50)))
        results = await old.append_many("s", [turn(17), turn(18)])
        assert sends.shapes == [(LEAN[0], -2, 8), (LEAN[0], 2, 8)]
        assert [(r.seq, r.duplicate) for r in results] == [(18, True), (19, True)]
        assert await contents(new, "s") == texts(*range(19), 50)
        assert await raw_redis.hget(new.keys("s").idem, "") == LAYOUT  # type: ignore[misc]


# -- rotations of a hashtable generation ---------------------------------------------------


async def test_bare_batches_rotating_through_hashtable_generations_answer_every_key(
    settings: Settings, tenant: str, raw_redis: Redis
) -> None:
    """Window 20: a bare batch of 30 converts, and keeps every key; then rotations by time.

    A call rotates the generations at most once, and a new session's first call starts its
    first generation, so the 30 stay together.
    """
    async with fast_retry_pods(settings, tenant, idempotency_window=20) as (pod, _):
        keys = pod.keys("s")
        names = [f"w{i}" for i in range(30)]
        first = await pod.append_many("s", [turn(i) for i in range(30)], idempotency_keys=names)
        # The session's first generation began with the call: past the window, none rotates.
        assert not await raw_redis.exists(keys.idem_old)
        assert await is_table(raw_redis, keys.idem)  # 30 keys and the layout
        assert await raw_redis.hlen(keys.idem) == 31  # type: ignore[misc]
        again = await pod.append_many("s", [turn(i) for i in range(30)], idempotency_keys=names)
        assert all(r.duplicate for r in again)
        assert [r.entry_id for r in again] == [r.entry_id for r in first]

        await end_generation(raw_redis, pod, "s")  # by time, a batch crossing 16 at once
        more = [f"t{i}" for i in range(TABLE_AT + 1)]
        await pod.append_many("s", [turn(i) for i in range(30, 47)], idempotency_keys=more)
        assert await is_table(raw_redis, keys.idem)
        assert await is_table(raw_redis, keys.idem_old)  # the 30: a hashtable, renamed
        assert await raw_redis.hlen(keys.idem_old) == 31  # type: ignore[misc]
        pair = await pod.append_many("s", [turn(25), turn(46)], idempotency_keys=["w25", "t16"])
        assert [(r.seq, r.duplicate) for r in pair] == [(26, True), (47, True)]
        assert (await pod.info("s")).count == 47

        # a generation of exactly 16 keys rotates as a listpack: the layout is the 17th's
        await end_generation(raw_redis, pod, "s")
        sixteen = [f"x{i}" for i in range(TABLE_AT)]
        await pod.append_many("s", [turn(i) for i in range(47, 63)], idempotency_keys=sixteen)
        assert await raw_redis.hlen(keys.idem) == TABLE_AT  # type: ignore[misc]
        await end_generation(raw_redis, pod, "s")
        await pod.append("s", turn(63), idempotency_key="y")
        assert not await is_table(raw_redis, keys.idem_old)
        assert await raw_redis.hlen(keys.idem_old) == TABLE_AT  # type: ignore[misc]
        assert not await is_table(raw_redis, keys.idem)
        [x0] = await pod.append_many("s", [turn(47)], idempotency_keys=["x0"])
        assert (x0.seq, x0.duplicate) == (48, True)


# -- delete and re-create; the other calls' records ----------------------------------------


@pytest.mark.parametrize("backend", BACKENDS, indirect=True)
async def test_records_of_both_lives_answer_through_a_delete_and_re_creation(
    settings: Settings, tenant: str, raw_redis: Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A hashtable generation outlives a delete (its reply lost); a retry re-creates nothing."""
    async with fast_retry_pods(settings, tenant) as (pod, other):
        names = [f"k{i}" for i in range(TABLE_AT + 4)]
        first = await pod.append_many(
            "s", [turn(i) for i in range(len(names))], idempotency_keys=names
        )
        idem = pod.keys("s").idem
        assert await is_table(raw_redis, idem)
        dropped = drop_reply(pod, monkeypatch, SCRIPTS.delete)
        assert await pod.delete("s") is True
        assert dropped == [True]
        monkeypatch.undo()
        [late] = await other.append_many("s", [turn(5)], idempotency_keys=["k5"])
        assert late.duplicate and late.entry_id == first[5].entry_id
        assert not (await pod.info("s")).exists  # answered: the session was not made again

        again = [f"n{i}" for i in range(TABLE_AT + 4)]
        second = []
        for i, name in enumerate(again):
            second.append(await other.append("s", turn(100 + i), idempotency_key=name))
        assert (second[0].epoch, second[0].seq) == (1, len(names) + 2)  # the tombstone: past 21
        assert await raw_redis.hget(idem, "") == LAYOUT  # type: ignore[misc]
        for i in (0, 15, 16, 19):
            old_life = await pod.append("s", turn(i), idempotency_key=f"k{i}")
            new_life = await pod.append("s", turn(100 + i), idempotency_key=f"n{i}")
            assert old_life.duplicate and old_life.entry_id == first[i].entry_id
            assert new_life.duplicate and new_life.entry_id == second[i].entry_id
        assert await contents(pod, "s") == texts(*range(100, 120))
        assert (await pod.info("s")).count == 20


async def test_other_calls_lost_replies_are_answered_from_a_hashtable_generation(
    store: ContextStore, raw_redis: Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """checkpoint, rewind, pop, fork, import: each recorded beside the layout, applied once."""
    ids = [
        r.entry_id
        for r in await store.append_many(
            "s",
            [turn(i) for i in range(TABLE_AT + 4)],
            idempotency_keys=[f"k{i}" for i in range(20)],
        )
    ]
    idem = store.keys("s").idem
    assert await is_table(raw_redis, idem)
    held = await raw_redis.hlen(idem)  # type: ignore[misc]

    async def lost(script: Any, call: Action) -> Any:
        dropped = drop_reply(store, monkeypatch, script)
        result = await call()
        assert dropped == [True], script.name
        monkeypatch.undo()
        return result

    await lost(SCRIPTS.checkpoint, lambda: store.checkpoint("s", "cp"))
    assert len(await store.checkpoints("s")) == 1
    rewound = await lost(SCRIPTS.rewind, lambda: store.rewind("s", ids[17]))
    assert (rewound.count, rewound.abandoned) == (18, 2) and len(await store.branches("s")) == 1
    popped = await lost(SCRIPTS.pop, lambda: store.pop("s"))
    assert popped is not None and popped.entry_id == ids[17]
    assert (await store.info("s")).count == 17
    assert await raw_redis.hlen(idem) == held + 3  # type: ignore[misc]
    assert await raw_redis.hget(idem, "") == LAYOUT  # type: ignore[misc]

    forked = await lost(SCRIPTS.fork, lambda: store.fork("s", "f"))
    assert forked.count == 17
    lines = [line async for line in store.export_session("s")]
    [imported] = await lost(
        SCRIPTS.import_commit, lambda: store.import_sessions(lines, session="i")
    )
    assert imported.status == "imported"
    for session in ("f", "i"):
        assert await contents(store, session) == texts(*range(17))
        for i in range(TABLE_AT + 2):
            await store.append(session, turn(50 + i), idempotency_key=f"k{i}")
        assert await is_table(raw_redis, store.keys(session).idem), session
        assert (await store.info(session)).count == 17 + TABLE_AT + 2
    # the source's keys still answer: k3 (kept) and k18 (rewound away: its record stays)
    kept = await store.append("s", turn(3), idempotency_key="k3")
    gone = await store.append("s", turn(18), idempotency_key="k18")
    assert kept.duplicate and kept.entry_id == ids[3]
    assert gone.duplicate and gone.entry_id == ids[18]
    assert (await store.info("s")).count == 17


# -- nothing shows the field ---------------------------------------------------------------


@pytest.mark.parametrize("backend", BACKENDS, indirect=True)
async def test_info_reads_exports_and_imports_never_show_the_layout(
    store: ContextStore, raw_redis: Redis
) -> None:
    """A hashtable generation changes no counter, read, export or import."""
    messages = [turn(i) for i in range(TABLE_AT + 4)]
    for message in messages:
        await store.append("s", message)
    assert await is_table(raw_redis, store.keys("s").idem)
    info = await store.info("s")
    assert (info.count, info.seq) == (20, 20)
    assert info.tokens == sum(m.tokens for m in (await store.read("s")).messages)
    lines = [line async for line in store.export_session("s")]
    assert not any("hash-max-listpack-value" in line for line in lines)
    rows = [json.loads(line) for line in lines]
    assert [row["ctxstore"] for row in rows] == ["session", *["message"] * 20, "end"]
    assert (rows[0]["count"], rows[0]["tokens"], rows[-1]["count"]) == (20, info.tokens, 20)
    assert await store.get_messages("s") == messages
    [imported] = await store.import_sessions(lines, session="copy")
    assert imported.status == "imported"
    assert await store.get_messages("copy") == messages
    assert (await store.info("copy")).tokens == info.tokens
    assert sorted(s.session for s in await store.list_sessions()) == ["copy", "s"]


# -- unusual idempotency keys --------------------------------------------------------------


ODD_KEYS = [
    "#",
    "#x",
    "##",
    "#" + "a" * 12,  # shaped as a call's record
    " ",
    "\x1f",
    "\x1e",
    "\x00",
    "é",
    "🙂" * 200,  # 200 characters, 800 bytes
    "k" * 200,
    LAYOUT.decode(),  # the layout's value, as a field
    "0",
    "-",
    "ключ",
    "1-0 1 0",  # shaped as a record's value
    "key with spaces",
    "last",
]


@pytest.mark.parametrize("backend", BACKENDS, indirect=True)
async def test_odd_keys_cross_the_table_bare_and_each_answers(
    store: ContextStore, raw_redis: Redis
) -> None:
    """Keys like records, separators, the layout value, unicode: each its own field."""
    assert len(ODD_KEYS) > TABLE_AT
    first = await store.append_many(
        "s", [turn(i) for i in range(10)], idempotency_keys=ODD_KEYS[:10]
    )
    for i, key in enumerate(ODD_KEYS[10:], start=10):
        first.append(await store.append("s", turn(i), idempotency_key=key))
    idem = store.keys("s").idem
    assert await is_table(raw_redis, idem)
    assert await raw_redis.hlen(idem) == len(ODD_KEYS) + 1  # type: ignore[misc]
    for i, key in enumerate(ODD_KEYS):
        value = await raw_redis.hget(idem, key)  # type: ignore[misc]
        assert value == f"{first[i].entry_id} {first[i].seq} 0".encode(), key
        again = await store.append("s", turn(i), idempotency_key=key)
        assert again.duplicate and again.entry_id == first[i].entry_id, key
    both = await store.append_many("s", [turn(0), turn(1)], idempotency_keys=ODD_KEYS[-2:])
    assert all(r.duplicate for r in both)
    assert await contents(store, "s") == texts(*range(len(ODD_KEYS)))


# -- the test suite's own lean harness -----------------------------------------------------


async def test_leanify_sends_a_bare_batch_lean_as_the_client_would(
    settings: Settings, tenant: str
) -> None:
    """BUG (test harness, test_append_forms.leanify): a bare batch of 2+ is never sent lean.

    leanify finds each message's kind at ``messages[3::8]``; a bare batch has 3 arguments
    a message, so it reads the second message's data there and sends the full form
    instead (never a wrong lean send: only coverage is lost). Latent today: the three-pod
    machine appends one plain message, or an exchange (8 arguments), at a time.
    """
    sent: list[bytes] = []
    async with ContextStore.from_settings(settings, tenant=tenant, clock=ManualClock()) as pod:
        await pod.append("s", turn(0))  # creates it: a reservation, the full form
        leanify(pod, sent)
        await pod.append("s", turn(1))  # one bare message: lean
        assert sent == [b"ok"]
        await pod.append_many("s", [turn(2), turn(3)])  # two bare messages: lean too
        assert sent == [b"ok", b"ok"], "leanify sent the bare batch of two in the full form"
