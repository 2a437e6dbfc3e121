"""The tenant's index stays true: listing, the session quota and forget agree with the keys.

The index lives in the tenant's slot, the sessions in their own: every race
here interleaves a write, a delete, a lease or a refused write of one pod
with another pod's, at the step where the index and the session's keys could
disagree. The invariant checked: a session whose keys exist is listed (so
forget_tenant reaches it), and the session quota counts what exists.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
from redis.asyncio import Redis
from support.helpers import turn

from ctxstore import ConflictError, ContextStore, QuotaExceededError, Settings, TenantLimits
from ctxstore._layout.keys import tenant_sessions_key


@pytest.fixture
async def pods(settings: Settings, tenant: str) -> AsyncIterator[Callable[[], ContextStore]]:
    """Builds stores for this test's tenant, each with its own connection and memory (a pod)."""
    opened: list[ContextStore] = []

    def make() -> ContextStore:
        pod = ContextStore.from_settings(settings, tenant=tenant)
        opened.append(pod)
        return pod

    yield make
    for pod in opened:
        await pod.aclose()


async def listed(store: ContextStore) -> set[str]:
    return {row.session for row in await store.list_sessions()}


async def existing(raw: Redis, store: ContextStore, sessions: list[str]) -> set[str]:
    """The sessions among ``sessions`` whose meta holds a sequence number."""
    found = set()
    for session in sessions:
        if await raw.hexists(store.keys(session).meta, "seq"):
            found.add(session)
    return found


def before_the_index_is_touched(
    store: ContextStore, monkeypatch: pytest.MonkeyPatch, act: Callable[[], Awaitable[Any]]
) -> list[bool]:
    """Run ``act`` once, right before ``store`` next sends a command naming its tenant index."""
    index = tenant_sessions_key(store.settings.key_prefix, store.tenant)
    real_node_call = store._connection.node_call
    real_pipeline = store._connection.pipeline
    fired: list[bool] = []

    async def fire_if(commands: Any) -> None:
        if not fired and any(index in map(str, command) for command in commands):
            fired.append(True)
            await act()

    async def node_call(key: str, commands: Any, **kwargs: Any) -> Any:
        await fire_if(commands)
        return await real_node_call(key, commands, **kwargs)

    async def pipeline(queue: Any, **kwargs: Any) -> Any:
        recorded: list[tuple[Any, ...]] = []

        class Recorder:
            def __getattr__(self, name: str) -> Any:
                return lambda *args, **kw: recorded.append((name, *args, *kw.values()))

        queue(Recorder())
        await fire_if([tuple(str(a) for a in command) for command in recorded])
        return await real_pipeline(queue, **kwargs)

    monkeypatch.setattr(store._connection, "node_call", node_call)
    monkeypatch.setattr(store._connection, "pipeline", pipeline)
    return fired


# -- finding 4: what forget_tenant must reach ---------------------------------------------------


async def test_a_session_deleted_by_one_pod_and_written_again_by_another_stays_listed(
    pods: Callable[[], ContextStore], raw_redis: Redis
) -> None:
    """Pod B writes s within its index interval after pod A deleted it: listed, then forgotten."""
    a, b = pods(), pods()
    await a.append("s", turn(0))
    await b.append("s", turn(1))  # b has just touched the index for s
    assert await a.delete("s")
    await b.append("s", turn(2))  # within b's index interval: no touch of its own
    assert await listed(a) == {"s"}
    assert await a.forget_tenant() == 1
    assert not await raw_redis.exists(*a.keys("s").all())


async def test_an_abandoned_lease_on_a_new_session_leaves_nothing_that_lasts(
    pods: Callable[[], ContextStore], raw_redis: Redis
) -> None:
    """A lease taken on a session never written, and never released, expires with its meta."""
    store = pods()
    await store.lease("new", ttl_s=5)  # abandoned
    keys = store.keys("new")
    for key in keys.all():
        assert await raw_redis.pttl(key) in (-2, *range(1, 5_001)), key
    assert await listed(store) == set()


async def test_a_refused_first_write_never_unlists_a_session_another_pod_just_wrote(
    pods: Callable[[], ContextStore], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A's first write is refused; before A cleans the index up, B writes s: s stays listed."""
    a, b = pods(), pods()
    fired = []

    async def b_writes() -> None:
        await b.append("s", turn(1))

    real = a._connection.node_call

    async def arm_after_refusal(key: str, commands: Any, **kwargs: Any) -> Any:
        replies = await real(key, commands, **kwargs)
        if not fired and commands[0][0] in ("EVALSHA", "EVAL", "FCALL"):
            reply = replies[0]
            if isinstance(reply, list) and reply and reply[0] == b"conflict":
                fired.append(True)
                monkeypatch.setattr(a._connection, "node_call", real)
                before_the_index_is_touched(a, monkeypatch, b_writes)
        return replies

    monkeypatch.setattr(a._connection, "node_call", arm_after_refusal)
    with pytest.raises(ConflictError):
        await a.append("s", turn(0), expected_seq=5)
    assert fired == [True]
    assert await b.get_messages("s") == [turn(1)]
    assert await listed(b) == {"s"}


# -- finding 5: the session quota has no side doors ----------------------------------------------


async def test_a_cached_reservation_does_not_let_a_deleted_session_back_over_the_quota(
    pods: Callable[[], ContextStore], raw_redis: Redis
) -> None:
    """max_sessions=2: A writes s1, s2; B deletes them, writes s3, s4; A's s1 is refused."""
    await pods().set_limits(TenantLimits(sessions=2))
    a, b = pods(), pods()
    await a.append("s1", turn(0))
    await a.append("s2", turn(0))
    await b.delete("s1")
    await b.delete("s2")
    await b.append("s3", turn(0))
    await b.append("s4", turn(0))
    for session in ("s1", "s2"):
        with pytest.raises(QuotaExceededError):
            await a.append(session, turn(1))
    names = ["s1", "s2", "s3", "s4"]
    assert await existing(raw_redis, a, names) == {"s3", "s4"}
    assert await listed(a) == {"s3", "s4"}


async def test_abandoned_leases_leave_no_key_without_an_expiry(
    pods: Callable[[], ContextStore], raw_redis: Redis
) -> None:
    """Under max_sessions=1, leases on ten new sessions create no key that lasts or counts."""
    await pods().set_limits(TenantLimits(sessions=1))
    store = pods()
    for i in range(10):
        await store.lease(f"n{i}", ttl_s=30)
    for i in range(10):
        for key in store.keys(f"n{i}").all():
            assert await raw_redis.pttl(key) in (-2, *range(1, 30_001)), key
    await store.append("real", turn(0))  # the one slot is still free
    assert await listed(store) == {"real"}
