"""A removed TTL goes at the next append, with its segments; a TTL in force never does.

Every append with no TTL in force (no 'ttl' of the session's own in meta, no default)
reads meta's PTTL; if meta still expires, the lean form is refused with ``{'keys'}``
and the full one PERSISTs the nine keys, even on a retry answered entirely from the
idempotency record. Its reply then says -1 as the keys' time left, and the writer makes
the segments the session's history starts in last for ever too
(``Lineage.keep_alive(..., now=True)``). No writer memo skips the check. So a session
that must keep a TTL never loses it; a removed TTL does go at the next append, whatever
came before it (a lost reply, a refusal, a batch, a pin, a fork, a delete, a lease,
another write path of the same pod, another pod's TTL given and removed), its segments
with it; a refusal writes nothing, no PERSIST either.

Time is never slept through: expiries are moved with PEXPIRE(AT).
"""

from __future__ import annotations

import pytest
from redis.asyncio import Redis
from support.append_forms import FULL, LEAN, LEAN_LIMITED, sent
from support.config import BACKENDS
from support.expiry import (
    age,
    change_default,
    expiries,
    fork_settings,
    nine,
    now_ms,
    segment_keys,
    states,
    together,
    with_ttl,
)
from support.faults import drop_reply
from support.helpers import SYSTEM, turn
from support.pods import pods_on
from support.servers import ServerPool

from ctxstore import (
    ConflictError,
    ContextStore,
    QuotaExceededError,
    Settings,
    TenantLimits,
)
from ctxstore._layout.chain import segments_of
from ctxstore._redis.functions import load_functions
from ctxstore._redis.scripts import SCRIPTS

SHORT = 30
"""A short tenant TTL (s): a session given it is gone half a minute after that write
unless its next append, once the TTL is removed, takes the expiry away."""


async def meta_left(raw: Redis, pod: ContextStore, session: str) -> int:
    return int(await raw.pttl(pod.keys(session).meta))


async def never_expires(raw: Redis, store: ContextStore, session: str) -> list[str]:
    """Neither ``session``'s keys nor the segments its history starts in expire; those."""
    assert await together(raw, store, session) == -1
    segments = await segment_keys(store, session)
    left = {key[-12:]: await raw.pttl(key) for key in segments}
    assert all(v == -1 for v in left.values()), left
    return segments


# -- a removed TTL goes at the next append ---------------------------------------------------


@pytest.mark.parametrize("backend", BACKENDS, indirect=True)
async def test_a_removed_tenant_ttl_goes_at_the_next_append_on_either_backend(
    settings: Settings, tenant: str, raw_redis: Redis
) -> None:
    """Tenant TTL 600 s to none, 10 s left: the next append takes all nine expiries away.

    On a cluster too (the nine keys share a slot). Lean refused, the full form PERSISTs
    once; the next append, finding meta without an expiry, is lean; nothing expires.
    """
    async with change_default(settings, tenant, "tenant limits", 600, None) as store:
        assert (await store.search("s", "quick fox")) is not None  # the search index too
        await age(raw_redis, nine(store, "s"), (await meta_left(raw_redis, store, "s")) - 10_000)
        assert set(await expiries(raw_redis, store, "s")) >= {"log", "meta", "keep"}
        runs = sent(store)
        await store.append("s", turn(1))
        assert runs == [LEAN, FULL]
        assert await together(raw_redis, store, "s") == -1
        await store.append("s", turn(2))
        assert runs[2:] == [LEAN]
        assert await together(raw_redis, store, "s") == -1
        assert [m.message for m in (await store.read("s")).messages][-2:] == [turn(1), turn(2)]


async def test_paths_that_copy_meta_s_expiry_before_the_next_append_lose_it_with_meta(
    settings: Settings, tenant: str, raw_redis: Redis
) -> None:
    """Paths that copy meta's expiry before the next append lose it with meta.

    After the removal and before any append: a pin, a checkpoint, the search index and a
    view's anchors copy meta's (old) expiry. The next append PERSISTs every one of them.
    """
    async with change_default(settings, tenant, "tenant limits", 600, None) as store:
        first = (await store.read("s")).messages[1]
        await store.pin("s", first.entry_id)
        await store.checkpoint("s")
        assert await store.search("s", "quick fox")
        await store.view("s", token_budget=300)
        before = await expiries(raw_redis, store, "s")
        assert all(at > 0 for at in before.values()), before
        await store.append("s", turn(3))
        at = await expiries(raw_redis, store, "s")
        assert set(at) == set(before) and all(v == -1 for v in at.values()), at


async def test_a_removed_ttl_goes_under_a_rate_quota_as_functions(servers: ServerPool) -> None:
    """FCALL: under a rate quota (burst 5) the TTL removed goes at the next append.

    The lean form with the limits is refused, the full one PERSISTs every key and takes
    one token: four messages, one token left.
    """
    url = servers.start().url()
    config = Settings(redis_url=url, script_mode="functions", key_prefix="fn", queue_name="fn:q")
    async with pods_on(config, tenant="acme") as [pod], Redis.from_url(url) as raw:
        await load_functions(pod._connection)
        await pod.set_limits(
            TenantLimits(ttl_seconds=600, appends_per_second=0.001, append_burst=5)
        )
        await pod.append_many("s", [SYSTEM, turn(0)])
        await pod.set_limits(TenantLimits(appends_per_second=0.001, append_burst=5))
        await age(raw, nine(pod, "s"), 590_000)
        runs = sent(pod)
        await pod.append("s", turn(1))
        await pod.append("s", turn(2))
        assert runs == [LEAN_LIMITED, FULL, LEAN_LIMITED]
        assert await together(raw, pod, "s") == -1
        tokens = float(await raw.hget(pod.keys("s").meta, "rl_tokens"))  # type: ignore[misc,arg-type]
        assert tokens == pytest.approx(1, abs=0.01)


async def test_a_batch_with_system_and_pinned_messages_goes_full_and_persists_every_key(
    settings: Settings, tenant: str, raw_redis: Redis
) -> None:
    """A batch with system and pinned messages goes full and persists every key.

    The first append after the removal is a batch needing the keep hash: one full send,
    which PERSISTs; the nine keys (the keep copies included) never expire.
    """
    async with change_default(settings, tenant, "tenant limits", 600, None) as store:
        await age(raw_redis, nine(store, "s"), 100_000)
        runs = sent(store)
        await store.append_many("s", [SYSTEM, turn(1), turn(2)], pinned=True)
        assert runs == [FULL]
        assert await together(raw_redis, store, "s") == -1
        assert len(await raw_redis.hgetall(store.keys("s").keep)) >= 4  # type: ignore[misc]


async def test_a_lost_reply_of_the_persisting_full_form_is_answered_and_keeps_it_persisted(
    settings: Settings, tenant: str, raw_redis: Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A lost reply of the persisting full form is answered and keeps it persisted.

    The full form PERSISTs and its reply is lost: the retry (a duplicate) answers, the
    keys stay persistent, and the next append, finding none expiring, is lean.
    """
    async with change_default(settings, tenant, "tenant limits", 600, None) as store:
        await age(raw_redis, nine(store, "s"), 500_000)
        runs = sent(store)
        dropped = drop_reply(store, monkeypatch, SCRIPTS.append, keys=FULL[0])
        [result] = await store.append_many("s", [turn(1)])
        assert dropped == [True] and result.duplicate and result.seq == 3
        assert runs == [LEAN, FULL, FULL]
        assert await together(raw_redis, store, "s") == -1
        await store.append("s", turn(2))
        assert runs[3:] == [LEAN]
        assert await raw_redis.xlen(store.keys("s").log) == 4


async def test_a_stale_expected_seq_writes_nothing_and_the_next_append_still_unbinds(
    settings: Settings, tenant: str, raw_redis: Redis
) -> None:
    """A stale expected seq writes nothing and the next append still takes the expiry.

    A conflict refuses the full form that would PERSIST: no entry, no PERSIST; the next
    append, with the right seq, is refused lean again and takes the expiry in full.
    """
    async with change_default(settings, tenant, "tenant limits", 600, None) as store:
        before = await states(raw_redis, store, "s")
        runs = sent(store)
        with pytest.raises(ConflictError):
            await store.append("s", turn(1), expected_seq=0)
        assert runs == [LEAN, FULL]
        assert await states(raw_redis, store, "s") == before
        assert await meta_left(raw_redis, store, "s") > 0
        await store.append("s", turn(1), expected_seq=2)
        assert runs[2:] == [LEAN, FULL]
        assert await together(raw_redis, store, "s") == -1


async def test_a_rate_refusal_writes_nothing_and_a_later_append_still_takes_the_expiry(
    settings: Settings, tenant: str, raw_redis: Redis
) -> None:
    """A rate refusal writes nothing and a later append still takes the expiry.

    TTL removed with the bucket empty: the append (lean, then full) is refused, the keys
    still expire, the bucket is as it was. Refilled (its clock moved back), the next
    PERSISTs.
    """
    async with ContextStore.from_settings(settings, tenant=tenant) as pod:
        await pod.set_limits(
            TenantLimits(ttl_seconds=600, appends_per_second=0.001, append_burst=2)
        )
        await pod.append("s", turn(0))
        await pod.append("s", turn(1))  # the bucket is empty
        await pod.set_limits(TenantLimits(appends_per_second=0.001, append_burst=2))
        meta = pod.keys("s").meta
        before = await states(raw_redis, pod, "s")
        runs = sent(pod)
        with pytest.raises(QuotaExceededError) as refused:
            await pod.append("s", turn(2))
        assert refused.value.quota == "appends_per_second"
        assert runs == [LEAN_LIMITED, FULL]
        assert await states(raw_redis, pod, "s") == before
        at = int(await raw_redis.hget(meta, "rl_at"))  # type: ignore[misc,arg-type]
        await raw_redis.hset(meta, "rl_at", at - 2_000_000)  # type: ignore[misc,arg-type]
        await pod.append("s", turn(2))
        assert runs[2:] == [LEAN_LIMITED, FULL]
        assert await together(raw_redis, pod, "s") == -1
        assert float(await raw_redis.hget(meta, "rl_tokens")) == pytest.approx(1, abs=0.01)  # type: ignore[misc,arg-type]


async def test_fork_segments_never_expire_once_the_fork_and_its_source_are_unbound(
    settings: Settings, tenant: str, raw_redis: Redis
) -> None:
    """Fork segments never expire once the fork and its source are unbound.

    A fork made under tenant TTL 100 s; the TTL removed. The fork's next append
    PERSISTs its keys and its segments; the source's does the same for its own.
    """
    async with ContextStore.from_settings(fork_settings(settings, None), tenant=tenant) as store:
        await store.set_limits(TenantLimits(ttl_seconds=100))
        await store.append_many("s", [turn(i) for i in range(100)])
        await store.fork("s", "f")
        await store.append("f", turn(100))
        segments = await segment_keys(store, "f")
        assert segments and all([await raw_redis.pttl(k) > 0 for k in segments])
        await store.set_limits(TenantLimits(ttl_seconds=None))
        await store.append("f", turn(101))
        assert await never_expires(raw_redis, store, "f") == segments
        await store.append("s", turn(100))
        await never_expires(raw_redis, store, "s")


async def test_another_pod_fresh_to_a_fork_unbinds_it_and_its_segments(
    settings: Settings, tenant: str, raw_redis: Redis
) -> None:
    """Another pod fresh to a fork unbinds it and its segments.

    As above, but the first append after the removal comes from a pod that never saw
    the fork (its memos empty).
    """
    config = fork_settings(settings, None)
    async with pods_on(config, config, tenant=tenant) as (a, b):
        await a.set_limits(TenantLimits(ttl_seconds=100))
        await a.append_many("s", [turn(i) for i in range(100)])
        await a.fork("s", "f")
        await a.set_limits(TenantLimits(ttl_seconds=None))
        b._quotas.forget()
        await b.append("f", turn(100))
        assert await never_expires(raw_redis, b, "f")


async def test_a_session_deleted_after_the_removal_comes_back_without_any_expiry(
    settings: Settings, tenant: str, raw_redis: Redis
) -> None:
    """Written under the TTL, the TTL removed, deleted, written again: nothing expires."""
    async with change_default(settings, tenant, "tenant limits", 600, None) as store:
        assert await store.delete("s")
        again = await store.append("s", turn(5))
        assert again.epoch == 1
        await store.append("s", SYSTEM)
        assert await together(raw_redis, store, "s") == -1


# -- a TTL in force is never taken away ------------------------------------------------------


async def test_an_own_ttl_set_on_another_pod_survives_the_other_pods_appends(
    settings: Settings, tenant: str, raw_redis: Redis
) -> None:
    """An own ttl set on another pod survives the other pod's appends.

    Pod A (no default TTL) wrote the session; pod B gives it an own TTL of 600 s. A's
    appends find the TTL in meta: none PERSISTs, every key expires within its promise.
    """
    async with pods_on(settings, settings, tenant=tenant) as (a, b):
        await a.append("s", turn(0))
        await a.checkpoint("s")
        await b.set_ttl("s", 600)
        for i in range(1, 4):
            await a.append("s", turn(i))
        left = await meta_left(raw_redis, a, "s")
        assert 590_000 < left <= 660_000, left
        assert await together(raw_redis, a, "s") > 0
        async with ContextStore.from_settings(settings, tenant=tenant) as c:  # a fresh pod
            await c.append("s", turn(4))
        assert await together(raw_redis, a, "s") > 0


@pytest.mark.parametrize("source", ["tenant limits", "pod settings"])
async def test_a_default_ttl_in_force_is_never_taken_away_by_an_append(
    settings: Settings, tenant: str, raw_redis: Redis, source: str
) -> None:
    """A default ttl in force is never taken away by an append.

    A default TTL in force (the tenant's, or the pod's with no tenant TTL): meta always
    expires, and no append takes any key's expiry away.
    """
    config = with_ttl(settings, 600) if source == "pod settings" else settings
    async with ContextStore.from_settings(config, tenant=tenant) as pod:
        if source == "tenant limits":
            await pod.set_limits(TenantLimits(ttl_seconds=600))
        else:
            await pod.set_limits(TenantLimits(ttl_seconds=None))
        await pod.append_many("s", [SYSTEM, turn(0)])
        await pod.checkpoint("s")
        for i in range(1, 4):
            await pod.append("s", turn(i))
            assert 590_000 < await meta_left(raw_redis, pod, "s") <= 660_000
            assert await together(raw_redis, pod, "s") > 0


async def test_a_lease_on_a_session_not_yet_written_leaves_nothing_expiring_once_written(
    settings: Settings, tenant: str, raw_redis: Redis
) -> None:
    """A lease on a session not yet written leaves nothing expiring once written.

    A lease taken on a session not written (here since its delete) gives meta the
    lease's expiry; the append that creates it (again: its epoch goes on) and a replace
    under a lease both leave nothing expiring.
    """
    async with ContextStore.from_settings(settings, tenant=tenant) as pod:
        await pod.append("s", turn(0))  # an earlier life
        assert await pod.delete("s")
        lease = await pod.lease("s", ttl_s=30)
        assert 0 < await meta_left(raw_redis, pod, "s") <= 30_000
        assert (await pod.append("s", turn(1))).epoch == 1
        assert await together(raw_redis, pod, "s") == -1
        await lease.release()
        lease = await pod.lease("r", ttl_s=30)
        assert await meta_left(raw_redis, pod, "r") > 0
        await pod.replace("r", [turn(0)], lease=lease)
        assert await together(raw_redis, pod, "r") == -1
        await pod.append("r", turn(1))
        assert await together(raw_redis, pod, "r") == -1


async def test_a_lease_on_a_session_not_yet_written_under_a_ttl_gives_way_to_the_ttl(
    settings: Settings, tenant: str, raw_redis: Redis
) -> None:
    """A lease on a session not yet written under a ttl gives way to the ttl.

    The same under the tenant's TTL: the session expires within the TTL's promise, not
    at the lease's expiry, nor never.
    """
    async with ContextStore.from_settings(settings, tenant=tenant) as pod:
        await pod.set_limits(TenantLimits(ttl_seconds=600))
        lease = await pod.lease("s", ttl_s=30)
        assert 0 < await meta_left(raw_redis, pod, "s") <= 30_000
        since = await now_ms(raw_redis)
        await pod.append("s", turn(0))
        meta = await together(raw_redis, pod, "s")
        assert since + 600_000 <= meta <= since + 60_000 + 660_000
        await lease.release()


# -- no memo: every append checks -------------------------------------------------------------


async def test_every_append_without_a_ttl_takes_away_an_expiry_given_since_the_last(
    settings: Settings, tenant: str, raw_redis: Redis
) -> None:
    """Every append with no TTL in force reads meta's PTTL: no memo skips one.

    Before each of three appends, meta is given an expiry behind the pod's back (as
    another write path or pod may): each is refused lean and PERSISTs the nine keys in
    full, right after the last did. An append with nothing given between stays lean.
    """
    async with ContextStore.from_settings(settings, tenant=tenant) as pod:
        await pod.append("s", turn(0))
        runs = sent(pod)
        for i in range(1, 4):
            await raw_redis.pexpire(pod.keys("s").meta, SHORT * 1000)
            await pod.append("s", turn(i))
            assert runs[2 * i - 2 :] == [LEAN, FULL], i
            assert await together(raw_redis, pod, "s") == -1
        await pod.append("s", turn(4))
        assert runs[6:] == [LEAN]


async def _through(path: str, pod: ContextStore) -> None:
    """A write of ``path`` to ``s`` under the tenant's TTL, with no append of this pod."""
    if path == "replace":
        await pod.replace("s", [turn(5)])
    elif path == "clear":
        await pod.clear("s")
    elif path == "rewind":
        first = (await pod.read("s")).messages[0]
        await pod.rewind("s", first.entry_id)
    elif path == "fork into a deleted id":
        assert await pod.delete("s")
        await pod.fork("src", "s")
    else:  # import into a deleted id
        lines = [line async for line in pod.export_session("src")]
        assert await pod.delete("s")
        await pod.import_sessions(lines, session="s")


PATHS = ["replace", "clear", "rewind", "fork into a deleted id", "import into a deleted id"]


@pytest.mark.parametrize("path", PATHS)
async def test_a_ttl_given_by_another_write_path_of_the_same_pod_goes_at_its_next_append(
    settings: Settings, tenant: str, raw_redis: Redis, path: str
) -> None:
    """A ttl given by another write path of the same pod goes at its next append.

    One pod, no pod default. It appends to ``s`` (no TTL), the tenant's TTL is set to
    30 s, the same pod writes ``s`` by another path (its keys now expire in 30 s), the TTL
    is removed, and the pod appends: as the README's "takes effect at a session's next
    append" says, no key expires then, though no append of the pod saw the TTL.
    """
    async with ContextStore.from_settings(settings, tenant=tenant) as pod:
        await pod.append_many("s", [turn(0), turn(1)])
        await pod.append("src", turn(0))
        await pod.set_limits(TenantLimits(ttl_seconds=SHORT))
        await _through(path, pod)
        assert 0 < await meta_left(raw_redis, pod, "s") <= SHORT * 1000
        await pod.set_limits(TenantLimits(ttl_seconds=None))
        await pod.append("s", turn(9))
        assert await together(raw_redis, pod, "s") == -1


async def test_a_ttl_toggled_on_and_off_by_another_pod_goes_at_the_next_append(
    settings: Settings, tenant: str, raw_redis: Redis
) -> None:
    """A ttl toggled on and off by another pod goes at the next append.

    A appends to ``s`` (no TTL); B sets the tenant's TTL to 30 s, appends (every key
    expires in 30 s) and removes it. A, reading the limits now in force (none), appends:
    nothing expires any more, though A's last append saw no TTL either.
    """
    async with pods_on(settings, settings, tenant=tenant) as (a, b):
        await a.append("s", turn(0))
        await b.set_limits(TenantLimits(ttl_seconds=SHORT))
        await b.append("s", turn(1))
        assert 0 < await meta_left(raw_redis, a, "s") <= (SHORT + 3) * 1000
        await b.set_limits(TenantLimits(ttl_seconds=None))
        a._quotas.forget()  # A agrees with B: no TTL
        assert (await a._quotas.resolved("s")).ttl_ms == 0
        await a.append("s", turn(2))
        assert await together(raw_redis, a, "s") == -1


async def test_a_check_that_unbinds_a_session_unbinds_the_segments_its_history_starts_in(
    settings: Settings, tenant: str, raw_redis: Redis
) -> None:
    """The keys and the segments their chain names lose their expiry together.

    A (no TTL) writes ``s`` and forks it (a segment, never expiring); its next append
    stretches that chain (its keep-alive memo: "no TTL", for a minute). B sets the
    tenant's TTL to 30 s, appends to ``s`` and forks it again: a second segment, frozen
    with the log's 33 s. B removes the TTL. A's append, within its keep-alive minute,
    PERSISTs the keys, replies -1 as their time left, and so persists the segments at
    once too: ``s`` never expires, nor does any of its history.
    """
    config = fork_settings(settings, None)
    async with pods_on(config, config, tenant=tenant) as (a, b):
        await a.append_many("s", [turn(i) for i in range(100)])
        await a.fork("s", "f")
        await a.append_many("s", [turn(i) for i in range(100, 200)])  # keep-alive: no TTL
        await b.set_limits(TenantLimits(ttl_seconds=SHORT))
        await b.append("s", turn(200))
        await b.fork("s", "g")
        segments = await segment_keys(a, "s")
        assert any([await raw_redis.pttl(k) > 0 for k in segments])  # the second segment
        await b.set_limits(TenantLimits(ttl_seconds=None))
        a._quotas.forget()
        await a.append("s", turn(201))
        assert await never_expires(raw_redis, a, "s") == segments


async def branch_segment_expiries(raw: Redis, store: ContextStore, session: str) -> list[int]:
    """PTTL of each key of the segments ``session``'s branches read (none in its chain)."""
    (records,) = await store._connection.transaction(
        [("HVALS", store.keys(session).branches)], key=store.keys(session).branches
    )
    chain = set(await segment_keys(store, session))
    found = []
    for owner, segment in segments_of("", records):
        keys = store._lineage.keys(owner, segment)
        found += [await raw.pttl(k) for k in (keys.log, keys.info) if k not in chain]
    return found


@pytest.mark.parametrize("how", ["tenant TTL removed", "set_ttl(None)"])
async def test_a_branch_made_under_a_ttl_outlives_its_removal(
    settings: Settings, tenant: str, raw_redis: Redis, how: str
) -> None:
    """A rewind under a TTL gives its branch's segment that TTL; removed, the branch stays.

    A keep-alive that walked the chain alone would take the session's keys' expiry
    away while its branch's segment kept the rewind's, and the branch would go
    unreadable (``CorruptEntryError``) while the session lived on. A session that
    never forked has an empty chain, so the writer's keep-alive must run on the -1
    reply all the same.
    """
    async with ContextStore.from_settings(settings, tenant=tenant) as pod:
        await pod.set_limits(TenantLimits(ttl_seconds=600))
        ids = [(await pod.append("s", turn(i))).entry_id for i in range(6)]
        await pod.rewind("s", ids[2])
        (branch,) = await pod.branches("s")
        left = await branch_segment_expiries(raw_redis, pod, "s")
        assert left and all(v > 0 for v in left), left
        if how == "set_ttl(None)":
            await pod.set_ttl("s", None)
        else:
            await pod.set_limits(TenantLimits(ttl_seconds=None))
            await pod.append("s", turn(9))
        assert await together(raw_redis, pod, "s") == -1
        assert await branch_segment_expiries(raw_redis, pod, "s") == [-1] * len(left)
        page = await pod.read_branch("s", branch.branch_id)
        assert [m.message for m in page.messages] == [turn(i) for i in range(3, 6)]


async def test_a_branch_whose_segment_is_gone_keeps_no_other_segment_from_its_hold(
    settings: Settings, tenant: str, raw_redis: Redis
) -> None:
    """One branch's segment expired: the TTL's removal still reaches the others'.

    A hold refuses all of one owner's segments when one is missing, so the keep-alive
    holds each branch's alone: the gone one stays gone, the other never expires.
    """
    async with ContextStore.from_settings(settings, tenant=tenant) as pod:
        await pod.set_limits(TenantLimits(ttl_seconds=600))
        ids = [(await pod.append("s", turn(i))).entry_id for i in range(6)]
        await pod.rewind("s", ids[4])
        await pod.rewind("s", ids[2])
        _, second = await pod.branches("s")
        (fields,) = await pod._connection.transaction(
            [("HGETALL", pod.keys("s").branches)], key=pod.keys("s").branches
        )
        # The first branch's record (HGETALL's order is the hash's: not the branches').
        pairs = dict(zip(fields[::2], fields[1::2], strict=True))
        first = [v for k, v in pairs.items() if k.decode() != second.branch_id]
        assert len(first) == 1
        gone = pod._lineage.keys(*segments_of("", first)[0])
        await raw_redis.delete(gone.log, gone.info)  # what its expiry does
        await pod.set_ttl("s", None)
        assert not await raw_redis.exists(gone.log)
        left = await branch_segment_expiries(raw_redis, pod, "s")
        assert sorted(left) == [-2, -2, -1, -1], left  # the gone one's two keys, the other's
        page = await pod.read_branch("s", second.branch_id)
        assert page.messages
