"""The lean form carrying the default TTL and the quotas refuses exactly as the full one.

In the lean form with limits (ARGV[5] negative) each quota refuses exactly as in the
full one (same limit, same value, nothing written), a retry of an applied append is
answered whatever the quota, and an expiry moves whenever it is due, whichever pod's
memo sent the call.
"""

from __future__ import annotations

import time
from typing import Any

import pytest
from redis.asyncio import Redis
from support.append_forms import FULL, LEAN_LIMITED, force_full, sent, tap
from support.config import BACKENDS
from support.expiry import states
from support.helpers import system, turn
from support.servers import ServerPool

from ctxstore import ContextStore, QuotaExceededError, Settings, TenantLimits
from ctxstore._redis.functions import load_functions

TTL = 600_000
SPAN = TTL + 60_000


def call(cid: str) -> dict[str, Any]:
    return {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": cid, "type": "function", "function": {"name": "f", "arguments": "{}"}}
        ],
    }


def result(cid: str) -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": cid, "content": "forty-two"}


BATCHES = {
    "bare": [turn(1), turn(2), turn(3)],
    "wide": [call("c1"), result("c1"), turn(3)],  # 8 arguments a message
}


async def expiring(raw: Redis, pod: ContextStore, session: str, low: int, high: int) -> None:
    """Each existing key of the session's nine expires within (low, high] ms."""
    k = pod.keys(session)
    for key in (k.log, k.meta, k.keep, k.view, k.anchor, k.index, k.checkpoints):
        if await raw.exists(key):
            assert low < await raw.pttl(key) <= high, key
    for key in (k.checkpoint_summaries, k.branches):
        if await raw.exists(key):
            assert await raw.pttl(key) > 0, key


def limited(settings: Settings, **more: Any) -> Settings:
    return settings.model_copy(update={"session_ttl_seconds": TTL // 1000, **more})


# -- size quotas ---------------------------------------------------------------------------


@pytest.mark.parametrize("shape", ["bare", "wide"])
@pytest.mark.parametrize("quota", ["session_bytes", "session_tokens"])
async def test_a_size_quota_admits_the_exact_limit_and_refuses_alike_in_both_forms(
    settings: Settings, tenant: str, raw_redis: Redis, quota: str, shape: str
) -> None:
    """A batch that fills the quota exactly is written; one more message is refused.

    Lean and full: the same (quota, limit, value), nothing written (entries, counters,
    idempotency records, expiry), and a retry of the applied batch is a duplicate.
    """
    batch = BATCHES[shape]
    async with ContextStore.from_settings(settings, tenant=tenant) as probe:
        await probe.append("p", turn(0))
        await probe.append_many("p", batch)
        meta = await raw_redis.hgetall(probe.keys("p").meta)  # type: ignore[misc]
    limit = int(meta[b"bytes" if quota == "session_bytes" else b"tokens"])
    refusals: dict[str, tuple[Any, ...]] = {}
    async with ContextStore.from_settings(
        limited(settings, **{quota: limit}), tenant=tenant
    ) as pod:
        per: list[int] = []
        runs = sent(pod, per)
        for form in ("lean", "full"):
            s = f"s-{form}"
            await pod.append(s, turn(0))
            runs.clear()
            per.clear()
            keys = [f"{form}-{i}" for i in range(len(batch))]
            if form == "full":
                force_full(pod, s)
            done = await pod.append_many(s, batch, idempotency_keys=keys)
            assert runs == [LEAN_LIMITED if form == "lean" else FULL]
            assert set(per) == {3 if shape == "bare" else 8}
            assert [r.duplicate for r in done] == [False] * 3
            assert int(await raw_redis.hget(pod.keys(s).meta, meta_field(quota))) == limit  # type: ignore[misc]
            before = await states(raw_redis, pod, s)
            runs.clear()
            if form == "full":
                force_full(pod, s)
            with pytest.raises(QuotaExceededError) as refused:
                await pod.append(s, turn(4))
            assert runs == [LEAN_LIMITED if form == "lean" else FULL]
            assert await states(raw_redis, pod, s) == before
            err = refused.value
            refusals[form] = (err.quota, err.limit, err.value)
            if form == "full":
                force_full(pod, s)
            again = await pod.append_many(s, batch, idempotency_keys=keys)  # over quota: answered
            assert [(r.entry_id, r.duplicate) for r in again] == [(r.entry_id, True) for r in done]
            # A retry with one new message: refused whole, the applied ones not written again.
            with pytest.raises(QuotaExceededError):
                await pod.append_many(s, [*batch, turn(4)], idempotency_keys=[*keys, "new"])
            assert await states(raw_redis, pod, s) == before
    assert refusals["lean"] == refusals["full"]
    assert refusals["lean"][:2] == (quota, limit) and refusals["lean"][2] > limit


def meta_field(quota: str) -> str:
    return "bytes" if quota == "session_bytes" else "tokens"


# -- the rate quota --------------------------------------------------------------------------


@pytest.mark.parametrize("backend", BACKENDS, indirect=True)
@pytest.mark.parametrize("form", ["lean", "full"])
async def test_the_rate_bucket_is_emptied_exactly_and_retries_are_answered_over_it(
    settings: Settings, tenant: str, raw_redis: Redis, form: str
) -> None:
    """Burst 4: the creation takes 1, a batch of 3 the rest; the next is refused.

    The refusal leaves the bucket (rl_tokens, rl_at) as it was; a retry of the batch is
    answered as duplicates with the bucket empty; a batch of 4 with one new is refused.
    """
    rate = limited(settings, appends_per_second=0.001, append_burst=4)
    async with ContextStore.from_settings(rate, tenant=tenant) as pod:
        runs = sent(pod)
        await pod.append("s", turn(0))
        meta = pod.keys("s").meta
        keys = ["a", "b", "c"]
        runs.clear()
        if form == "full":
            force_full(pod, "s")
        await pod.append_many("s", BATCHES["bare"], idempotency_keys=keys)
        assert runs == [LEAN_LIMITED if form == "lean" else FULL]
        assert float(await raw_redis.hget(meta, "rl_tokens")) < 0.01  # type: ignore[misc,arg-type]
        before = await states(raw_redis, pod, "s")
        runs.clear()
        if form == "full":
            force_full(pod, "s")
        with pytest.raises(QuotaExceededError) as refused:
            await pod.append("s", turn(4))
        assert refused.value.quota == "appends_per_second"
        assert runs == [LEAN_LIMITED if form == "lean" else FULL]
        assert await states(raw_redis, pod, "s") == before
        if form == "full":
            force_full(pod, "s")
        again = await pod.append_many("s", BATCHES["bare"], idempotency_keys=keys)
        assert all(r.duplicate for r in again) and [r.seq for r in again] == [2, 3, 4]
        with pytest.raises(QuotaExceededError):
            await pod.append_many("s", [*BATCHES["bare"], turn(4)], idempotency_keys=[*keys, "d"])
        assert await states(raw_redis, pod, "s") == before
        assert (await pod.info("s")).count == 4


async def test_a_lost_lean_reply_then_a_due_expiry_is_answered_once_by_the_full_form(
    settings: Settings, tenant: str, raw_redis: Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The lean send applies (taking the last but one token) and its reply is lost.

    Meanwhile the expiry becomes due: the retry is refused lean, the full form answers it
    as a duplicate (the bucket is not taken twice). The memo then sends the next append
    full at once, which moves every key's expiry.
    """
    rate = limited(settings, appends_per_second=0.001, append_burst=3)
    async with ContextStore.from_settings(rate, tenant=tenant) as pod:
        await pod.append("s", system("be brief"))  # a keep hash, moved with the rest
        k = pod.keys("s")

        async def due() -> None:
            for key in (k.log, k.meta, k.keep):
                await raw_redis.pexpire(key, TTL - 1_000)

        sends = tap(pod, monkeypatch, lose=1, form=4, between=due)
        retried = await pod.append("s", turn(1))
        assert [keys for keys, _, _ in sends.shapes] == [4, 4, 12]
        assert (retried.seq, retried.duplicate) == (2, True)
        assert await raw_redis.xlen(k.log) == 2
        assert float(await raw_redis.hget(k.meta, "rl_tokens")) == pytest.approx(1, abs=0.01)  # type: ignore[misc,arg-type]
        sends.shapes.clear()
        await pod.append("s", turn(2))  # the last token
        assert [keys for keys, _, _ in sends.shapes] == [12]  # no lean refusal first
        await expiring(raw_redis, pod, "s", TTL, SPAN)
        with pytest.raises(QuotaExceededError):
            await pod.append("s", turn(3))
        assert [m.message for m in (await pod.read("s")).messages][1:] == [turn(1), turn(2)]


async def test_a_bucket_emptied_across_another_pods_delete_and_recreation_refuses_lean(
    settings: Settings, tenant: str, raw_redis: Redis
) -> None:
    """Pod A's memo still says lean; pod B deleted and re-created the session meanwhile.

    The new life inherits the bucket (2 taken by A, 1 by B's creation): A's lean append
    finds it empty and is refused with nothing written, lean and then full alike.
    """
    rate = limited(settings, appends_per_second=0.001, append_burst=3)
    async with (
        ContextStore.from_settings(rate, tenant=tenant) as a,
        ContextStore.from_settings(rate, tenant=tenant) as b,
    ):
        await a.append("s", turn(0))
        await a.append("s", turn(1))
        assert await b.delete("s")
        fresh = await b.append("s", turn(2))
        assert fresh.epoch == 1
        before = await states(raw_redis, a, "s")
        runs = sent(a)
        with pytest.raises(QuotaExceededError) as refused:
            await a.append("s", turn(3))
        assert refused.value.quota == "appends_per_second"
        assert runs == [LEAN_LIMITED]
        force_full(a, "s")
        with pytest.raises(QuotaExceededError):
            await a.append("s", turn(3))
        assert runs == [LEAN_LIMITED, FULL]
        assert await states(raw_redis, a, "s") == before
        await expiring(raw_redis, a, "s", TTL - 5_000, SPAN)


# -- expiry ----------------------------------------------------------------------------------


WITHIN = TTL + 30_000
"""An expiry not due: past the TTL, short of the span, by half a minute (no step is as long)."""

CASES = {
    "meta under the TTL": ("meta", TTL - 1_000, True),
    "log under the TTL": ("log", TTL - 1_000, True),
    "meta past the span": ("meta", SPAN + 1_000, True),
    "log past the span": ("log", SPAN + 1_000, True),
    "both within": ("both", WITHIN, False),
    "log without expiry": ("persist", 0, True),
}


@pytest.mark.parametrize("case", list(CASES))
async def test_an_expiry_moves_exactly_when_due_whatever_the_quotas(
    settings: Settings, tenant: str, raw_redis: Redis, case: str
) -> None:
    """Under a quota, the lean form is refused when the log's or meta's expiry is due.

    Then every key (keep, checkpoints...) moves to the span; otherwise nothing moves.
    """
    which, ms, due = CASES[case]
    async with ContextStore.from_settings(
        limited(settings, session_tokens=10**6), tenant=tenant
    ) as pod:
        await pod.append("s", system("be brief"))
        await pod.append("s", turn(0))
        await pod.checkpoint("s")
        k = pod.keys("s")
        for key in (k.log, k.meta, k.keep, k.checkpoints, k.checkpoint_summaries):
            if await raw_redis.exists(key):
                await raw_redis.pexpire(key, WITHIN)
        if which == "persist":
            await raw_redis.persist(k.log)
        elif which != "both":
            await raw_redis.pexpire(k.log if which == "log" else k.meta, ms)
        before = await states(raw_redis, pod, "s")
        runs = sent(pod)
        await pod.append("s", turn(1))
        assert runs == ([LEAN_LIMITED, FULL] if due else [LEAN_LIMITED])
        if due:
            await expiring(raw_redis, pod, "s", TTL, SPAN)
        else:
            after = await states(raw_redis, pod, "s")
            assert [s[3] for s in after] == [s[3] for s in before]  # nothing moved
            window = (pod._writer._lean_until.get("s") or 0) - time.monotonic()
            assert 0 < window <= (WITHIN - TTL) / 1000  # what is left before the TTL


async def test_another_pods_limits_reach_a_new_store_in_the_lean_form(
    settings: Settings, tenant: str, raw_redis: Redis
) -> None:
    """set_limits on pod B: a new store sends the lowered TTL and token quota lean.

    The token quota refuses with nothing written, a retry is still a duplicate, and the
    lowered TTL is due at once (the keys outlive its span): every key moves down to it.
    """
    async with ContextStore.from_settings(limited(settings), tenant=tenant) as a:
        await a.append("s", turn(0), idempotency_key="k0")
        tokens = int(await raw_redis.hget(a.keys("s").meta, "tokens"))  # type: ignore[misc,arg-type]
        await a.set_limits(TenantLimits(ttl_seconds=300, session_tokens=tokens + 38))
    async with ContextStore.from_settings(limited(settings), tenant=tenant) as c:
        runs = sent(c)
        await c.append("s", turn(1))  # 38 tokens: exactly the limit
        assert runs == [LEAN_LIMITED, FULL]  # the TTL, lowered, is due
        await expiring(raw_redis, c, "s", 300_000, 330_000)
        before = await states(raw_redis, c, "s")
        runs.clear()
        with pytest.raises(QuotaExceededError) as refused:
            await c.append("s", turn(2))
        assert (refused.value.quota, refused.value.limit) == ("session_tokens", tokens + 38)
        assert runs == [LEAN_LIMITED]
        assert await states(raw_redis, c, "s") == before
        again = await c.append("s", turn(0), idempotency_key="k0")
        assert (again.seq, again.duplicate) == (1, True)


async def test_two_pods_memos_disagree_after_set_ttl_and_every_key_follows(
    settings: Settings, tenant: str, raw_redis: Redis
) -> None:
    """Pod A's memo says lean for a minute; pod B raises then lowers the session's TTL.

    Each time A's lean append is refused and the full one moves every key to the new
    span; B, whose memo is its own, goes lean once nothing is due.
    """
    cfg = limited(settings, session_bytes=10**6)
    async with (
        ContextStore.from_settings(cfg, tenant=tenant) as a,
        ContextStore.from_settings(cfg, tenant=tenant) as b,
    ):
        await a.append("s", system("be brief"))
        await a.append("s", turn(0))
        runs_a, runs_b = sent(a), sent(b)
        for seconds in (1_200, 300):
            await b.set_ttl("s", seconds)
            ms = seconds * 1000
            k = a.keys("s")
            for key in (k.log, k.meta, k.keep):  # a second on
                await raw_redis.pexpire(key, ms - 1_000)
            await a.append("s", turn(seconds))
            await expiring(raw_redis, a, "s", ms, ms + 60_000)
            await b.append("s", turn(seconds + 1))
        assert runs_a == [LEAN_LIMITED, FULL] * 2
        assert runs_b == [LEAN_LIMITED] * 2
        assert (await a.info("s")).count == 6


# -- Redis Functions -------------------------------------------------------------------------


async def test_quotas_in_the_lean_form_as_functions(servers: ServerPool) -> None:
    """FCALL: the lean form with the limits fills the byte quota exactly and refuses after."""
    server = servers.start()
    base = Settings(
        redis_url=server.url(), script_mode="functions", key_prefix="fn", queue_name="fn:q"
    )
    raw = Redis.from_url(server.url())
    try:
        async with ContextStore.from_settings(base, tenant="probe") as probe:
            await load_functions(probe._connection)
            await probe.append_many("p", [turn(0), *BATCHES["wide"]])
            limit = int(await raw.hget(probe.keys("p").meta, "bytes"))  # type: ignore[misc,arg-type]
        cfg = limited(base, session_bytes=limit, appends_per_second=0.001, append_burst=5)
        async with ContextStore.from_settings(cfg, tenant="acme") as pod:
            await pod.append("s", turn(0))
            runs = sent(pod)
            await pod.append_many("s", BATCHES["wide"])
            assert int(await raw.hget(pod.keys("s").meta, "bytes")) == limit  # type: ignore[misc,arg-type]
            before = await states(raw, pod, "s")
            with pytest.raises(QuotaExceededError) as refused:
                await pod.append("s", turn(4))
            assert (refused.value.quota, refused.value.limit) == ("session_bytes", limit)
            assert runs == [LEAN_LIMITED, LEAN_LIMITED]
            assert await states(raw, pod, "s") == before
            assert float(await raw.hget(pod.keys("s").meta, "rl_tokens")) == pytest.approx(
                1, abs=0.01
            )  # type: ignore[misc,arg-type]
    finally:
        await raw.aclose()
