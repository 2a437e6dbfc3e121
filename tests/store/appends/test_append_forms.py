"""append.lua's two forms: the lean one (4 keys, 5 arguments) and the full one.

A pod sends the lean form when it knows of no TTL, quota, clock, reservation or
protected message; the script refuses it with ``{'keys'}`` (nothing written) when the
session has a TTL of its own, and the pod re-sends the full form. These tests drive
the cases the pod cannot know of (another pod's writes), lost replies on either send,
the Functions mode, and check that the lean form touches only the keys it declares.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
from redis.asyncio import Redis
from support.append_forms import FULL, LEAN, LEAN_LIMITED, leanify, sent
from support.config import BACKENDS, examples
from support.expiry import shorten
from support.faults import drop_reply
from support.helpers import system, turn
from support.scripts import script_calls, undeclared
from support.servers import Monitor, ServerPool

from ctxstore import ConflictError, ContextStore, QuotaExceededError, Settings, TenantLimits
from ctxstore._redis.functions import load_functions
from ctxstore._redis.scripts import SCRIPTS


@asynccontextmanager
async def two_pods(settings: Settings, tenant: str) -> AsyncIterator[tuple[ContextStore, ...]]:
    """Two pods of one tenant: the one whose appends are watched, and another."""
    async with (
        ContextStore.from_settings(settings, tenant=tenant) as pod,
        ContextStore.from_settings(settings, tenant=tenant) as other,
    ):
        yield pod, other


async def every_key_expires(raw: Redis, store: ContextStore, session: str, above: int) -> None:
    """Each of the session's keys that exists expires, in more than ``above`` ms."""
    keys = store.keys(session)
    for key in (
        keys.log,
        keys.meta,
        keys.keep,
        keys.view,
        keys.anchor,
        keys.index,
        keys.checkpoints,
        keys.checkpoint_summaries,
        keys.branches,
    ):
        if await raw.exists(key):
            assert await raw.pttl(key) > above, key


# -- the form each append takes ------------------------------------------------------------


async def test_a_steady_append_declares_only_the_keys_it_touches(
    store: ContextStore, settings: Settings, raw_redis: Redis
) -> None:
    """The lean form: 4 keys and 5 arguments before the message's 8; the full one otherwise."""
    await store.append("s", turn(0))  # creates s: the full form, under a reservation
    runs = sent(store)
    await store.append("s", turn(1))
    await store.append_many("s", [turn(2), turn(3)])
    assert runs == [LEAN, LEAN]
    runs.clear()
    await store.append("s", {"role": "system", "content": "be brief"})  # its keep copy
    assert runs == [FULL]
    assert len(await raw_redis.hgetall(store.keys("s").keep)) == 1  # its copy, views read
    assert [m.message for m in (await store.read("s")).messages][:4] == [turn(n) for n in range(4)]


async def test_messages_with_no_kind_ids_or_preview_go_bare(
    store: ContextStore, raw_redis: Redis
) -> None:
    """Three arguments a message when none of the call's has a kind, ids or a preview.

    Eight each otherwise. Both forms store the same entries.
    """
    await store.append("s", turn(0))
    shapes: list[int] = []
    runs = sent(store, shapes)
    await store.append("s", turn(1))
    await store.append_many("s", [turn(2), turn(3)])
    call = {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
        ],
    }
    result = {"role": "tool", "tool_call_id": "c1", "content": "word " * 3000}  # a preview
    await store.append_many("s", [turn(4), call])
    await store.append("s", result)
    await store.append("s", turn(5), pinned=True)
    assert runs == [LEAN, LEAN, LEAN, LEAN, FULL]
    assert shapes == [3, 3, 8, 8, 8]
    log = store.keys("s").log
    rows = await raw_redis.xrange(log)
    fields = [sorted(k.decode() for k in row[1]) for row in rows]
    assert fields[1] == fields[3] == ["k", "m", "n", "t"]  # bare: the same four as before
    assert "c" in fields[5] and "r" in fields[6] and "v" in fields[6]
    messages = [m.message for m in (await store.read("s")).messages]
    assert messages[:6] == [turn(0), turn(1), turn(2), turn(3), turn(4), call]
    assert messages[6]["tool_call_id"] == "c1" and messages[7] == turn(5)
    assert await raw_redis.hlen(store.keys("s").keep) == 1  # the pinned copy


async def test_a_ttl_set_by_another_pod_moves_every_key_s_expiry_on_the_next_append(
    settings: Settings, tenant: str, raw_redis: Redis
) -> None:
    """The lean form is refused with nothing written; the full form then writes once.

    Until the session's expiry is due to move again, its appends are lean and move
    nothing; with no TTL left they stay lean.
    """
    async with two_pods(settings, tenant) as (pod, other):
        await pod.append("s", turn(0))
        await pod.checkpoint("s")  # a key only the full form declares
        await pod.append("s", turn(1))
        await other.set_ttl("s", 600)
        keys = pod.keys("s")
        for key in (keys.checkpoints, keys.log, keys.meta):
            await raw_redis.pexpire(key, 1_000)  # as if time had passed since the TTL was set
        runs = sent(pod)
        [result] = await pod.append_many("s", [turn(2)])
        assert runs == [LEAN, FULL]
        assert result.seq == 3 and not result.duplicate
        expiry = {key: await raw_redis.pexpiretime(key) for key in (keys.log, keys.meta)}
        for key in (keys.checkpoints, keys.log, keys.meta):
            # The TTL and a tenth of it, at most a minute (append.lua's TTL_SLACK_MOST).
            assert 600_000 < await raw_redis.pttl(key) <= 660_000, key
        runs.clear()
        await pod.append("s", turn(3))  # not due: lean, and nothing moves
        assert runs == [LEAN]
        assert {key: await raw_redis.pexpiretime(key) for key in expiry} == expiry
        await other.set_ttl("s", None)
        runs.clear()
        await pod.append("s", turn(4))
        await pod.append("s", turn(5))
        assert runs == [LEAN, LEAN]
        assert await raw_redis.pttl(keys.log) == -1
        assert [m.message for m in (await pod.read("s")).messages] == [turn(n) for n in range(6)]


async def test_the_lean_form_writes_nothing_when_it_needs_the_full_one(
    store: ContextStore, raw_redis: Redis
) -> None:
    """Sent by hand: a system message, and a session with a TTL, are refused with {'keys'}."""
    await store.append("s", turn(0))
    keys = store.keys("s")
    sha = await raw_redis.script_load(SCRIPTS.append.source)
    lean_keys = (keys.log, keys.meta, keys.idem, keys.idem_old)
    head = ("", 100, 0, 1, 60_000)  # expected seq, window, threshold, n, period

    async def lean(kind: str) -> Any:
        message = ('{"role":"system","content":"x"}', 3, "k1", kind, "", "", "", 0)
        return await raw_redis.evalsha(sha, 4, *lean_keys, *head, *message)  # type: ignore[misc]

    async def state() -> Any:
        return await raw_redis.xlen(keys.log), await raw_redis.hgetall(keys.meta)

    before = await state()
    assert await lean("s") == [b"keys"]  # its keep copy is a key the lean form lacks
    await store.set_ttl("s", 600)
    await raw_redis.pexpire(keys.log, 599_000)  # a second on: every key's expiry must move
    assert await lean("") == [b"keys"]
    after = await state()
    assert after[0] == before[0] and after[1] == {**before[1], b"ttl": b"600000"}
    assert not await raw_redis.hexists(keys.idem, "k1")


# -- lost replies on either send ----------------------------------------------------------


@pytest.mark.parametrize("backend", BACKENDS, indirect=True)
async def test_a_lost_reply_of_the_full_send_after_a_lean_refusal_is_answered_once(
    settings: Settings, tenant: str, raw_redis: Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Lean refused (another pod's TTL), the full form applied and its reply lost: one entry."""
    async with two_pods(settings, tenant) as (pod, other):
        first = await pod.append("s", turn(0))
        await pod.append("s", turn(1))
        await pod.checkpoint("s")
        await pod.rewind("s", first.entry_id)  # a branch
        await pod.append("s", turn(1))
        await pod.view("s", token_budget=2_000, model="m")  # its anchor
        assert await pod.search("s", "fox") is not None  # the search index
        keys = pod.keys("s")
        for key in (keys.view, keys.anchor):  # as a summary job and a budgeted view leave them
            if not await raw_redis.exists(key):
                await raw_redis.hset(key, "x", "y")  # type: ignore[misc]
        for key in (keys.branches, keys.checkpoints, keys.view, keys.anchor, keys.index):
            assert await raw_redis.exists(key), key
        await other.set_ttl("s", 600)
        for key in (keys.branches, keys.view, keys.anchor, keys.index):
            await raw_redis.pexpire(key, 5_000)
        await shorten(raw_redis, pod, "s")
        runs = sent(pod)
        dropped = drop_reply(pod, monkeypatch, SCRIPTS.append, keys=FULL[0])
        result = await pod.append("s", turn(2))
        assert dropped == [True]
        assert runs == [LEAN, FULL, FULL]  # the retry is the full form again
        assert result.duplicate
        assert [m.message for m in (await pod.read("s")).messages] == [turn(0), turn(1), turn(2)]
        await every_key_expires(raw_redis, pod, "s", 500_000)


async def test_a_lost_lean_reply_retried_after_another_pod_set_a_ttl_is_answered_once(
    settings: Settings, tenant: str, raw_redis: Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Lean applied, reply lost, another pod sets a TTL: the retry is refused lean, then full."""
    async with two_pods(settings, tenant) as (pod, other):
        await pod.append("s", turn(0))
        runs = sent(pod)

        async def ttl_set_a_while_ago() -> None:
            await other.set_ttl("s", 600)
            await shorten(raw_redis, pod, "s")

        dropped = drop_reply(pod, monkeypatch, SCRIPTS.append, ttl_set_a_while_ago, keys=LEAN[0])
        result = await pod.append("s", turn(1))
        assert dropped == [True]
        assert runs == [LEAN, LEAN, FULL]
        assert (result.seq, result.duplicate) == (2, True)
        assert [m.message for m in (await pod.read("s")).messages] == [turn(0), turn(1)]
        runs.clear()
        await pod.append("s", turn(2))  # a duplicate moved nothing: this write does, and
        assert runs == [FULL]  # at once: the retry's reply told the expiry was due
        await every_key_expires(raw_redis, pod, "s", 500_000)
        runs.clear()
        await pod.append("s", turn(3))  # lean until it is due again
        assert runs == [LEAN]


async def test_the_attack_suites_lost_reply_is_of_an_applied_append_not_of_a_lean_refusal(
    settings: Settings, tenant: str, raw_redis: Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """support.faults.drop_reply loses "a reply Redis applied": a {'keys'} refusal wrote nothing.

    Its ``applied`` knows the refusals conflict, quota, reserve, lease_lost and stale, not
    keys: on a session with a TTL another pod set, it drops the lean form's refusal and
    runs ``between`` before the append is written (the retry then writes it after,
    not as a duplicate), so a test built on it (the soak machine's
    append_whose_reply_is_lost, say) checks another race than it says.
    """
    async with two_pods(settings, tenant) as (pod, other):
        await pod.append("s", turn(0))
        await other.set_ttl("s", 600)
        written: list[int] = []

        async def between() -> None:
            written.append(await raw_redis.xlen(pod.keys("s").log))

        dropped = drop_reply(pod, monkeypatch, SCRIPTS.append, between)
        result = await pod.append("s", turn(1))
        assert dropped == [True]
        assert written == [2]  # the append was applied when its reply was lost
        assert result.duplicate


# -- other pods' writes the pod cannot know of ---------------------------------------------


@pytest.mark.parametrize("backend", BACKENDS, indirect=True)
async def test_a_session_deleted_and_written_again_with_a_ttl_by_another_pod(
    settings: Settings, tenant: str, raw_redis: Redis
) -> None:
    """The lean form finds no session (refused: a reservation), then one with a TTL (refused)."""
    async with two_pods(settings, tenant) as (pod, other):
        await pod.append_many("s", [turn(0), turn(1)])
        await other.delete("s")
        runs = sent(pod)
        recreated = await pod.append("s", turn(2))  # lean: refused, reserve; full: creates
        assert runs == [LEAN, FULL]
        assert (recreated.epoch, recreated.seq) == (1, 4)  # the tombstone's, read by the full
        await other.delete("s")
        await other.append("s", turn(3))
        await other.set_ttl("s", 600)
        await other.checkpoint("s")
        await other.append("s", system())  # a keep copy
        await shorten(raw_redis, pod, "s")
        runs.clear()
        result = await pod.append("s", turn(4))
        assert runs == [LEAN, FULL]
        assert (result.epoch, result.seq) == (2, 8)
        await every_key_expires(raw_redis, pod, "s", 500_000)
        # ...and once more deleted and written again without one: the pod goes lean again.
        await other.delete("s")
        await other.append("s", turn(5))
        runs.clear()
        await pod.append("s", turn(6))
        await pod.append("s", turn(7))
        assert runs == [LEAN, LEAN]
        assert await raw_redis.pttl(pod.keys("s").log) == -1


async def test_a_ttl_removed_by_another_pod_is_kept_removed_by_the_full_form(
    settings: Settings, tenant: str, raw_redis: Redis
) -> None:
    """set_ttl(None) elsewhere, after this pod's: neither form sets an expiry."""
    async with two_pods(settings, tenant) as (pod, other):
        await pod.append("s", turn(0))
        await pod.set_ttl("s", 600)
        await other.set_ttl("s", None)
        runs = sent(pod)
        await pod.append("s", turn(1))
        await pod.append("s", turn(2), pinned=True)  # and the full form
        assert runs == [LEAN, FULL]
        for key in (pod.keys("s").log, pod.keys("s").meta):
            assert await raw_redis.pttl(key) == -1, key


async def test_a_pod_without_the_default_takes_another_pods_expiry_away_at_its_appends(
    settings: Settings, tenant: str, raw_redis: Redis
) -> None:
    """Pods that disagree on a default TTL (a rolling deploy): the last writer's holds.

    The pod without one finds meta expiring with no TTL in force: its lean form is
    refused and the full one takes every key's expiry away; its next append is lean.
    After the other pod's next due append the keys expire again, and the same follows.
    """
    defaulted = settings.model_copy(update={"session_ttl_seconds": 600})
    async with (
        ContextStore.from_settings(settings, tenant=tenant) as pod,
        ContextStore.from_settings(defaulted, tenant=tenant) as other,
    ):
        await other.append("s", turn(0))  # the default TTL: every key expires
        runs = sent(pod)
        await pod.append("s", turn(1))
        await pod.append("s", turn(2))
        assert runs == [LEAN, FULL, LEAN]
        assert await raw_redis.pttl(pod.keys("s").meta) == -1
        await other.append("s", turn(3))  # due: the default TTL again
        assert await raw_redis.pttl(pod.keys("s").meta) > 0
        await pod.append("s", turn(4))
        assert runs[3:] == [LEAN, FULL]
        for key in (pod.keys("s").log, pod.keys("s").meta):
            assert await raw_redis.pttl(key) == -1, key


async def test_a_retry_that_adds_nothing_still_takes_a_removed_ttls_expiry_away(
    settings: Settings, tenant: str, raw_redis: Redis
) -> None:
    """A retry answered from the record takes a removed TTL's expiry away too.

    An append under the tenant's TTL, then the TTL removed, then the same call again
    (its idempotency key): every message is a duplicate, and the keys lose their expiry.
    """
    async with ContextStore.from_settings(settings, tenant=tenant) as pod:
        await pod.set_limits(TenantLimits(ttl_seconds=600))
        await pod.append("s", turn(0), idempotency_key="call-1")
        assert await raw_redis.pttl(pod.keys("s").meta) > 0
        await pod.set_limits(TenantLimits(ttl_seconds=None))
        again = await pod.append("s", turn(0), idempotency_key="call-1")
        assert again.duplicate
        for key in (pod.keys("s").log, pod.keys("s").meta):
            assert await raw_redis.pttl(key) == -1, key


async def test_an_own_never_beats_a_default_ttl_and_a_pod_without_the_default_goes_lean(
    settings: Settings, tenant: str, raw_redis: Redis
) -> None:
    """An own TTL of 0 ("never") beats the default: the lean form with it sets no expiry.

    A pod whose settings have no default TTL sends the lean form to a session another
    pod's default gave an expiry: it is refused (meta expires, yet no TTL is in force),
    and the full form takes every key's expiry away, as after a default removed. The
    same holds for 30 s (LIMITS_TTL) after an operator sets a tenant's TTL or quotas
    elsewhere: a pod's cached limits decide, in both forms.
    """
    defaulted = settings.model_copy(update={"session_ttl_seconds": 600})
    async with (
        ContextStore.from_settings(settings, tenant=tenant) as pod,
        ContextStore.from_settings(defaulted, tenant=tenant) as other,
    ):
        await pod.append("s", turn(0))
        await other.set_ttl("s", None)
        runs = sent(other)
        await other.append("s", turn(1))  # a default TTL: carried by the lean form
        await other.append("s", turn(2), pinned=True)  # and by the full form
        assert runs == [LEAN_LIMITED, FULL]
        assert await raw_redis.pttl(pod.keys("s").log) == -1
        await other.append("t", turn(0))  # a new session: the default applies
        runs = sent(pod)
        assert await raw_redis.pttl(pod.keys("t").log) > 0
        await pod.append("t", turn(1))  # this pod has no default: the expiry goes
        await pod.append("t", turn(2))  # and then lean again
        assert runs == [LEAN, FULL, LEAN]
        assert await raw_redis.pttl(pod.keys("t").log) == -1
        assert await raw_redis.pttl(pod.keys("t").meta) == -1


async def test_a_default_ttl_and_quotas_ride_the_lean_form(
    settings: Settings, tenant: str, raw_redis: Redis
) -> None:
    """A pod with a default TTL and quotas sends them in the lean form (10 arguments).

    Steady appends move no expiry and are held to the quotas there, refused with
    nothing written; when the expiry is due the lean form is refused and the full one
    moves every key's.
    """
    limited = settings.model_copy(
        update={"session_ttl_seconds": 600, "session_bytes": 4_000, "appends_per_second": 50.0}
    )
    async with ContextStore.from_settings(limited, tenant=tenant) as pod:
        await pod.append("s", turn(0))
        keys = pod.keys("s")
        expiry = await raw_redis.pexpiretime(keys.meta)
        runs = sent(pod)
        await pod.append("s", turn(1))
        await pod.append_many("s", [turn(2), turn(3)])
        assert runs == [LEAN_LIMITED, LEAN_LIMITED]
        assert await raw_redis.pexpiretime(keys.meta) == expiry  # not due: nothing moved
        assert await raw_redis.hget(keys.meta, "rl_at")  # type: ignore[misc]  # the rate taken
        before = await raw_redis.xlen(keys.log), await raw_redis.hget(keys.meta, "bytes")  # type: ignore[misc]
        runs.clear()
        with pytest.raises(QuotaExceededError) as refused:
            await pod.append("s", {"role": "user", "content": "x" * 4_000})
        assert refused.value.quota == "session_bytes" and runs == [LEAN_LIMITED]
        assert (await raw_redis.xlen(keys.log), await raw_redis.hget(keys.meta, "bytes")) == before  # type: ignore[misc]
        await raw_redis.pexpire(keys.meta, 599_000)  # a second on: due
        runs.clear()
        await pod.append("s", turn(4))
        assert runs == [LEAN_LIMITED, FULL]
        for key in (keys.log, keys.meta):
            assert 600_000 < await raw_redis.pttl(key) <= 660_000, key
        assert [m.message for m in (await pod.read("s")).messages] == [turn(n) for n in range(5)]


async def test_a_session_written_less_often_than_its_slack_takes_the_full_form_at_once(
    settings: Settings, tenant: str, raw_redis: Redis
) -> None:
    """The reply says how long the keys' expiry need not move; past that, full at once.

    A chat written every few minutes would otherwise pay a lean refusal before each
    append; the full form also serves an append that is not due (it moves nothing).
    """
    limited = settings.model_copy(update={"session_ttl_seconds": 600})
    async with ContextStore.from_settings(limited, tenant=tenant) as pod:
        await pod.append("s", turn(0))  # creates: moves the expiry to 660 s
        lean_until = pod._writer._lean_until
        window = (lean_until.get("s") or 0) - time.monotonic()
        assert 55 < window <= 60  # the slack: TTL/10, at most a minute
        keys = pod.keys("s")
        expiry = await raw_redis.pexpiretime(keys.meta)
        runs = sent(pod)
        lean_until.put("s", time.monotonic() - 1)  # as if a minute had passed
        await pod.append("s", turn(1))
        assert runs == [FULL]  # no lean refusal first
        assert await raw_redis.pexpiretime(keys.meta) == expiry  # not due in Redis's time
        runs.clear()
        await pod.append("s", turn(2))  # the reply gave the window back
        assert runs == [LEAN_LIMITED]
        await raw_redis.pexpire(keys.meta, 599_000)  # due: another pod's clock, say
        runs.clear()
        await pod.append("s", turn(3))
        assert runs == [LEAN_LIMITED, FULL]
        assert [m.message for m in (await pod.read("s")).messages] == [turn(n) for n in range(4)]


async def test_a_sub_millisecond_idempotency_period_still_flags_the_limits(
    settings: Settings, tenant: str
) -> None:
    """The period's sign flags the limits: one under a millisecond is sent as 1 ms.

    As 0 it would have no sign, and the script would read the limits as a message.
    """
    brief = settings.model_copy(
        update={"idempotency_seconds": 0.0004, "session_ttl_seconds": 600, "session_bytes": 10**6}
    )
    async with ContextStore.from_settings(brief, tenant=tenant) as pod:
        await pod.append("s", turn(0))
        runs = sent(pod)
        await pod.append_many("s", [turn(1), turn(2)])
        assert runs == [LEAN_LIMITED]
        assert [m.message for m in (await pod.read("s")).messages] == [turn(n) for n in range(3)]


async def test_conflicts_in_both_forms(settings: Settings, tenant: str, raw_redis: Redis) -> None:
    """A stale expected_seq is refused in the lean form, and in the full one after a refusal."""
    async with two_pods(settings, tenant) as (pod, other):
        await pod.append_many("s", [turn(0), turn(1)])
        runs = sent(pod)
        with pytest.raises(ConflictError):
            await pod.append("s", turn(2), expected_seq=1)
        assert runs == [LEAN]
        await other.set_ttl("s", 600)
        await shorten(raw_redis, pod, "s")
        runs.clear()
        with pytest.raises(ConflictError):
            await pod.append("s", turn(2), expected_seq=1)
        assert runs == [LEAN, FULL]
        assert await pod.append("s", turn(2), expected_seq=2)
        assert await raw_redis.xlen(pod.keys("s").log) == 3


# -- Redis Functions ----------------------------------------------------------------------


async def test_both_forms_as_functions(servers: ServerPool) -> None:
    """FCALL: the lean form, its refusal on another pod's TTL, the full form, then lean again."""
    server = servers.start()
    settings = Settings(
        redis_url=server.url(), script_mode="functions", key_prefix="fn", queue_name="fn:q"
    )
    async with (
        ContextStore.from_settings(settings, tenant="acme") as pod,
        ContextStore.from_settings(settings, tenant="acme") as other,
    ):
        await load_functions(pod._connection)
        await pod.append("s", turn(0))
        await pod.checkpoint("s")
        runs = sent(pod)
        await pod.append("s", turn(1))
        await other.set_ttl("s", 600)
        raw = Redis.from_url(server.url())
        try:
            await shorten(raw, pod, "s")
            result = await pod.append("s", turn(2))
            assert (result.seq, result.duplicate) == (3, False)
            await every_key_expires(raw, pod, "s", 500_000)
            await other.set_ttl("s", None)
            await pod.append("s", turn(3))
            await pod.append("s", turn(4))
            assert runs == [LEAN, LEAN, FULL, LEAN, LEAN]
            assert await raw.pttl(pod.keys("s").log) == -1
        finally:
            await raw.aclose()
        assert [m.message for m in (await pod.read("s")).messages] == [turn(n) for n in range(5)]


# -- declared keys ------------------------------------------------------------------------


async def test_the_lean_form_touches_only_the_keys_it_declares(servers: ServerPool) -> None:
    """Under MONITOR: rotation, a due summary, duplicates, conflicts, refusals, all lean."""
    server = servers.start()
    settings = Settings(
        redis_url=server.url(),
        key_prefix="lk",
        queue_name="lk:q",
        idempotency_window=2,  # RENAME of idem to idem_old
        summary_trigger_tokens=100,  # next_generation
        summary_keep_tokens=20,
    )
    async with (
        ContextStore.from_settings(settings, tenant="acme") as pod,
        ContextStore.from_settings(settings, tenant="acme") as other,
    ):
        await pod.append("s", turn(0))
        await pod.checkpoint("s")
        async with Monitor(server.port) as monitor:
            for n in range(1, 7):
                await pod.append("s", turn(n), idempotency_key=f"k{n}")
            await pod.append("s", turn(6), idempotency_key="k6")  # a duplicate
            with pytest.raises(ConflictError):
                await pod.append("s", turn(7), expected_seq=1)
            await other.delete("s")
            await pod.append("s", turn(6), idempotency_key="k6")  # deleted: still a duplicate
            await pod.append("s", turn(7))  # lean refused (no reservation), then full
            await other.set_ttl("s", 600)
            await pod.append("s", turn(8))  # lean refused (a TTL), then full
            calls = script_calls(await monitor.drain())
    admin = Redis.from_url(server.url())
    try:
        bad, checked = await undeclared(admin, calls)
    finally:
        await admin.aclose()
    append = (SCRIPTS.append.sha.encode(), SCRIPTS.append.source)
    lean = [c for c in calls if c.sha_or_body in append and len(c.declared) == LEAN[0]]
    assert len(lean) == 11
    assert any(command[0] == b"RENAME" for c in lean for command in c.inner)
    assert checked > 50
    assert bad == []


async def test_keys_the_sdk_made_are_looked_up_on_every_attempt_but_the_first(
    servers: ServerPool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Under MONITOR: a call's own keys skip the lookup once; a retry and a caller's keys don't.

    A key the SDK made for this call cannot have been recorded before the call's first
    attempt. A retry's first attempt may have written (its reply lost): it looks up, and
    answers with the entry written, never a second one.
    """
    server = servers.start()
    settings = Settings(redis_url=server.url(), key_prefix="mk", queue_name="mk:q")
    async with ContextStore.from_settings(settings, tenant="acme") as pod:
        await pod.append("s", turn(0))
        idem = pod.keys("s").idem.encode()
        async with Monitor(server.port) as monitor:
            await pod.append("s", turn(1))  # its own key, first attempt: no lookup
            await pod.append_many("s", [turn(2), turn(3)])
            await pod.append("s", turn(4), idempotency_key="mine")  # the caller's: looked up
            dropped = drop_reply(pod, monkeypatch, SCRIPTS.append, keys=LEAN[0])
            result = await pod.append("s", turn(5))  # applied, reply lost: the retry looks up
            calls = script_calls(await monitor.drain())
        assert dropped == [True] and result.duplicate and result.seq == 6
        looked = [
            sum(1 for c in call.inner if c[0].upper() == b"HGET" and c[1] == idem) for call in calls
        ]
        assert looked == [0, 0, 1, 0, 1]
        added = [sum(1 for c in call.inner if c[0].upper() == b"XADD") for call in calls]
        assert added == [1, 2, 1, 1, 0]  # the retry wrote nothing more
        assert [m.message for m in (await pod.read("s")).messages] == [turn(n) for n in range(6)]


# -- the three-pod machine, with the lean form ---------------------------------------------


def test_three_pods_keep_every_guarantee_with_lean_appends(
    settings: Settings, redis_url: str
) -> None:
    """The three-pod machine (leases, limits, expiry, lost replies, deletes), appends lean."""
    import hypothesis
    from hypothesis import HealthCheck
    from hypothesis.stateful import run_state_machine_as_test
    from support.machine import TenantMachine

    sent: list[bytes] = []

    class Machine(TenantMachine):
        base = settings

        def __init__(self) -> None:
            super().__init__()
            for pod in self.pods:
                leanify(pod, sent)

    Machine.redis_url = redis_url
    run_state_machine_as_test(
        Machine,
        settings=hypothesis.settings(
            deadline=None,
            suppress_health_check=list(HealthCheck),
            max_examples=examples(60),
            stateful_step_count=40,
            derandomize=True,
        ),
    )
    assert sent.count(b"ok") > examples(60) // 3  # derandomized: the same runs every time
    assert b"keys" in sent  # another pod's TTL met by the lean form
