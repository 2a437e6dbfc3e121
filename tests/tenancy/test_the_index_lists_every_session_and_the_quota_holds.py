"""The tenant's index lists every session that exists, and the sessions quota is never exceeded.

Lost replies, deletes, forget_tenant, expired leases, lowered quotas and pods racing to
create sessions: whatever happens between two pods' round trips, a session whose keys
exist is listed (so the sweep and forget_tenant reach it), a reservation is held only by
a listed session, and no more sessions exist than the quota allows. Another pod's action
is run right before each round trip of the pod under test in turn (``before_call``).
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from redis.asyncio import Redis
from support.faults import Action, drop_reply
from support.helpers import msg
from support.tenant import existing, indexed, listed, set_limits

from ctxstore import (
    ConflictError,
    ContextStore,
    LeaseHeldError,
    LeaseLostError,
    QuotaExceededError,
    Settings,
    StoreUnavailableError,
    TenantLimits,
)
from ctxstore._layout.keys import tenant_pending_keys
from ctxstore._parts.writes import RESERVE_ATTEMPTS
from ctxstore._redis.scripts import NAMES, SCRIPTS
from ctxstore.testing import ManualClock


def before_call(
    store: ContextStore, monkeypatch: pytest.MonkeyPatch, k: int, act: Action
) -> list[str]:
    """Run ``act`` once, right before ``store`` sends its ``k``-th round trip (0-based).

    Round trips are script calls, transactions and pipelines. Returns the names of
    the round trips seen (the one ``act`` preceded is marked with ``*``).
    """
    connection = store._connection
    real_node_call, real_pipeline = connection.node_call, connection.pipeline
    seen: list[str] = []

    async def maybe_fire(name: str) -> None:
        if len(seen) == k:
            seen.append("*" + name)
            await act()
        else:
            seen.append(name)

    def describe(commands: Any) -> str:
        first = commands[0]
        if first[0] in ("EVALSHA", "EVAL", "FCALL"):
            for name in NAMES:
                script = getattr(SCRIPTS, name)
                if first[1] in (script.sha, script.function, script.source):
                    return name
        return str(first[0])

    async def node_call(key: str, commands: Any, **kwargs: Any) -> Any:
        if kwargs.get("transaction") or not (commands and str(commands[0][0]) == "EVAL"):
            await maybe_fire(describe(commands))  # an EVAL after NOSCRIPT is the same trip
        return await real_node_call(key, commands, **kwargs)

    async def pipeline(queue: Any, **kwargs: Any) -> Any:
        await maybe_fire("pipeline")
        return await real_pipeline(queue, **kwargs)

    monkeypatch.setattr(connection, "node_call", node_call)
    monkeypatch.setattr(connection, "pipeline", pipeline)
    return seen


async def test_a_retried_first_append_after_a_delete_is_answered_and_not_written_again(
    pods: Callable[..., ContextStore], raw_redis: Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """First append applied, reply lost, another pod deletes, the retry: answered, not rewritten.

    The append happened before the delete: the retry gets its entry (a
    duplicate), and the delete stands. Nothing exists, nothing is listed.
    """
    a, b = pods(), pods()
    applied: list[str] = []

    async def b_deletes() -> None:
        applied.append((await raw_redis.hget(a.keys("s").meta, "last_id")).decode())
        assert await b.delete("s")

    dropped = drop_reply(a, monkeypatch, SCRIPTS.append, b_deletes)
    result = await a.append("s", msg("0"))
    assert dropped == [True]
    assert (result.entry_id, result.duplicate) == (applied[0], True)
    assert await existing(raw_redis, a, ["s"]) == set()
    assert await indexed(raw_redis, a) == set()


async def test_a_retried_first_append_after_a_delete_cannot_exceed_the_sessions_quota(
    settings: Settings,
    tenant: str,
    pods: Callable[..., ContextStore],
    raw_redis: Redis,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """sessions=1: A's first append's reply is lost, B deletes it and creates t, A retries: <= 1."""
    await set_limits(settings, tenant, TenantLimits(sessions=1))
    a, b = pods(), pods()

    async def b_deletes_and_creates() -> None:
        await b.delete("s")
        await b.append("t", msg("t"))

    drop_reply(a, monkeypatch, SCRIPTS.append, b_deletes_and_creates)
    with contextlib.suppress(QuotaExceededError):
        await a.append("s", msg("s"))
    assert len(await existing(raw_redis, a, ["s", "t"])) <= 1


async def test_a_first_write_refused_for_a_lost_lease_frees_its_quota_slot(
    settings: Settings, tenant: str, pods: Callable[..., ContextStore]
) -> None:
    """sessions=1, a replace on a new session with an expired lease is refused: the slot is free."""
    await set_limits(settings, tenant, TenantLimits(sessions=1))
    clock = ManualClock()
    a = pods(clock=clock)
    lease = await a.lease("new", ttl_s=1)
    clock.advance(2)
    with pytest.raises(LeaseLostError):
        await a.replace("new", [msg("x")], lease=lease)
    assert await listed(a) == set()
    await a.append("other", msg("y"))  # refused: quota sessions exceeded (0 exist)


async def test_sessions_written_after_forget_tenant_are_visible_to_the_sweep(
    pods: Callable[..., ContextStore],
) -> None:
    """Pod A writes, the operator forgets the tenant, A writes again: the tenant is listed again."""
    a, operator = pods(), pods()
    await a.append("s1", msg("0"))
    await operator.forget_tenant()
    await a.append("s2", msg("1"))
    assert await listed(a) == {"s2"}
    assert a.tenant in await operator.list_tenants()


async def test_forget_tenant_leaves_nothing_of_a_session_deleted_before(
    pods: Callable[..., ContextStore], raw_redis: Redis
) -> None:
    """Append s, delete s, forget_tenant: no key of the tenant is left (README: nothing of it)."""
    a = pods()
    await a.append("s", msg("0"))
    await a.delete("s")
    await a.forget_tenant()
    pattern = f"{a.settings.key_prefix}:{{{a.tenant}:*"
    assert [k async for k in raw_redis.scan_iter(match=pattern)] == []


async def test_a_lowered_sessions_quota_is_never_exceeded_by_a_recreated_session(
    settings: Settings, tenant: str, pods: Callable[..., ContextStore], raw_redis: Redis
) -> None:
    """a, d exist; B writes d; cap lowered to 1; d deleted; C writes d: refused (1 exists)."""
    a, b, c = pods(), pods(), pods()
    await a.append("a", msg("a"))
    await a.append("d", msg("d"))
    await b.append("d", msg("b"))  # b's reservation of d stays pending for 10 s
    await set_limits(settings, tenant, TenantLimits(sessions=1))
    assert await a.delete("d")
    assert await existing(raw_redis, a, ["a", "d"]) == {"a"}  # at the cap now
    with contextlib.suppress(QuotaExceededError):
        await c.append("d", msg("c"))
    assert await existing(raw_redis, a, ["a", "d"]) == {"a"}


async def test_concurrent_first_writes_of_three_pods_never_exceed_the_sessions_quota(
    settings: Settings, tenant: str, pods: Callable[..., ContextStore], raw_redis: Redis
) -> None:
    """sessions=5, 3 pods race to create 30 sessions (and delete some): never more than 5 exist."""
    await set_limits(settings, tenant, TenantLimits(sessions=5))
    trio = [pods(), pods(), pods()]
    names = [f"s{i}" for i in range(30)]
    peak = 0

    async def create(pod: ContextStore, name: str) -> None:
        nonlocal peak
        with contextlib.suppress(QuotaExceededError):
            await pod.append(name, msg(name))
        peak = max(peak, len(await existing(raw_redis, pod, names)))
        if int(name[1:]) % 4 == 0:
            await pod.delete(name)

    await asyncio.gather(*(create(trio[i % 3], n) for i, n in enumerate(names)))
    assert peak <= 5
    now = await existing(raw_redis, trio[0], names)
    assert await indexed(raw_redis, trio[0]) >= now
    assert await listed(trio[0]) == now


# -- every interleaving of two pods at every round trip --------------------------------------

SETUPS = ("absent", "exists", "exists, known to A", "deleted")


async def _setup(kind: str, a: ContextStore, b: ContextStore) -> None:
    await b.append("o", msg("other session"))  # one slot of the quota taken
    if kind == "absent":
        return
    if kind == "exists, known to A":
        await a.append("s", msg("a0"))
    else:
        await b.append("s", msg("b0"))
    if kind == "deleted":
        await b.delete("s")


def _a_actions() -> dict[str, Callable[[ContextStore], Awaitable[Any]]]:
    async def lease_write(a: ContextStore) -> None:
        async with await a.lease("s", wait_s=0) as lease:
            await a.replace("s", [msg("leased")], lease=lease)

    return {
        "append": lambda a: a.append("s", msg("a1")),
        "append_many": lambda a: a.append_many("s", [msg("a1"), msg("a2")]),
        "append stale if": lambda a: a.append("s", msg("a1"), expected_seq=999),
        "append over bytes": lambda a: a.append("s", {"role": "user", "content": "x" * 5_000}),
        "replace": lambda a: a.replace("s", [msg("r")]),
        "clear": lambda a: a.clear("s"),
        "replace under lease": lease_write,
        "delete": lambda a: a.delete("s"),
        "pin": lambda a: a.pin("s", "1-1"),
        "list": lambda a: a.list_sessions(),
        "create another": lambda a: a.append("t", msg("t")),
    }


def _b_actions(raw: Redis) -> dict[str, Callable[[ContextStore], Awaitable[Any]]]:
    async def expire(b: ContextStore) -> None:
        keys = b.keys("s")
        await raw.delete(keys.log, keys.meta, keys.keep, keys.view)  # as a TTL that fired

    return {
        "append": lambda b: b.append("s", msg("b1")),
        "replace": lambda b: b.replace("s", [msg("br")]),
        "delete": lambda b: b.delete("s"),
        "list": lambda b: b.list_sessions(),
        "create another": lambda b: b.append("u", msg("u")),
        "expire": expire,
        "abandon a lease": lambda b: b.lease("s", ttl_s=30, wait_s=0),
    }


EXPECTED = (ConflictError, QuotaExceededError, LeaseHeldError, LeaseLostError)


async def _index_true(raw: Redis, a: ContextStore, cap: int, created_over_cap: bool) -> None:
    names = ["s", "t", "u", "o"]
    now = await existing(raw, a, names)
    members = await indexed(raw, a)
    assert now <= members, f"exists but unlisted: {now - members}"
    pending, _ = tenant_pending_keys(a.settings.key_prefix, a.tenant)
    assert {k.decode() for k in await raw.hkeys(pending)} <= members
    assert not created_over_cap, "a session was created while the quota was full"
    assert len(now) <= cap
    assert await listed(a) == now


@pytest.mark.parametrize(
    "b_action",
    ["append", "replace", "delete", "list", "create another", "expire", "abandon a lease"],
)
@pytest.mark.parametrize("a_action", list(_a_actions()))
async def test_every_interleaving_of_two_pods_keeps_the_index_true(
    settings: Settings, raw_redis: Redis, a_action: str, b_action: str
) -> None:
    """A's action with B's before each of A's round trips, from 4 states: the index stays true."""
    cases = 0
    for setup in SETUPS:
        k = 0
        while True:
            tenant = f"i{uuid.uuid4().hex[:12]}"
            await set_limits(settings, tenant, TenantLimits(sessions=3, session_bytes=4_000))
            own = settings.model_copy(update={"lease_wait_seconds": 0})
            async with (
                ContextStore.from_settings(own, tenant=tenant) as a,
                ContextStore.from_settings(own, tenant=tenant) as b,
            ):
                await _setup(setup, a, b)
                before = await existing(raw_redis, a, ["s", "t", "u", "o"])
                with pytest.MonkeyPatch.context() as mp:

                    async def b_acts() -> None:
                        with contextlib.suppress(*EXPECTED):
                            await _b_actions(raw_redis)[b_action](b)

                    seen = before_call(a, mp, k, b_acts)
                    with contextlib.suppress(*EXPECTED):
                        await _a_actions()[a_action](a)
                after = await existing(raw_redis, a, ["s", "t", "u", "o"])
                created = after - before
                over = bool(created) and len(after) > 3
                try:
                    await _index_true(raw_redis, a, 3, over)
                except AssertionError as exc:
                    raise AssertionError(
                        f"setup {setup!r}, B before trip {k} of {seen}: {exc}"
                    ) from exc
                cases += 1
                if not any(name.startswith("*") for name in seen):
                    break  # B ran after A's last round trip: every point was tried
                k += 1
    assert cases >= len(SETUPS) * 2


@pytest.mark.parametrize("write", ["append", "replace"])
async def test_a_write_stalled_past_its_reservation_twice_raises_a_typed_error(
    pods: Callable[..., ContextStore], monkeypatch: pytest.MonkeyPatch, write: str
) -> None:
    """Each run of the write script comes after its reservation's deadline: a CtxstoreError."""
    monkeypatch.setattr("ctxstore._tenant.index.RESERVATION_MS", 50)  # 10 s in production
    a = pods()
    real = a._connection.node_call
    script = SCRIPTS.append if write == "append" else SCRIPTS.rewrite
    stalls = []

    async def stalled(key: str, commands: Any, **kwargs: Any) -> Any:
        if commands[0][0] in ("EVALSHA", "FCALL") and commands[0][1] in (
            script.sha,
            script.function,
        ):
            stalls.append(True)
            await asyncio.sleep(0.08)  # the fault: the pod (or Redis) stalls past the deadline
        return await real(key, commands, **kwargs)

    monkeypatch.setattr(a._connection, "node_call", stalled)
    with pytest.raises(StoreUnavailableError, match="reservation ran out"):
        await (a.append("s", msg("0")) if write == "append" else a.replace("s", [msg("0")]))
    assert len(stalls) == 1 + RESERVE_ATTEMPTS  # a first run, then one per reservation
    assert await listed(a) == set()  # the last reservation was given back
    assert not (await a.info("s")).exists
