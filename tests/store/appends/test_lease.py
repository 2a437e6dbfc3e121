"""Fenced, token-owned leases, with an injected clock: no sleeps."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from redis.asyncio import Redis
from support.config import BACKENDS
from support.helpers import USER

from ctxstore import ContextStore, LeaseHeldError, LeaseLostError, Settings
from ctxstore._redis.scripts import SCRIPTS
from ctxstore.testing import ManualClock

pytestmark = pytest.mark.parametrize("backend", BACKENDS, indirect=True)


@pytest.fixture
async def timed(settings: Settings, tenant: str, clock: ManualClock) -> AsyncIterator[ContextStore]:
    """A store whose leases use the manual clock."""
    async with ContextStore.from_settings(settings, tenant=tenant, clock=clock) as store:
        yield store


async def until(condition: Callable[[], bool]) -> None:
    """Yield to the loop until ``condition`` holds (a safety net of 60 s)."""
    async with asyncio.timeout(60):
        # Yields to the renewal task; the condition is what is waited on, not time.
        while not condition():  # noqa: ASYNC110
            await asyncio.sleep(0)


async def test_fence_grows_with_every_acquisition(timed: ContextStore) -> None:
    """On a session, each acquisition gets a larger fencing number, even after release."""
    await timed.append("s", USER)
    fences = []
    for _ in range(3):
        lease = await timed.lease("s", wait_s=0)
        fences.append(lease.fence)
        assert await lease.release()
    assert fences == sorted(fences) and len(set(fences)) == 3


async def test_a_held_lease_is_not_given_twice(timed: ContextStore) -> None:
    """While one holder has it, another gets LeaseHeldError after its wait."""
    await timed.append("s", USER)
    first = await timed.lease("s", wait_s=0)
    with pytest.raises(LeaseHeldError):
        await timed.lease("s", wait_s=0)
    await first.release()
    second = await timed.lease("s", wait_s=0)
    assert second.fence > first.fence


async def test_waiting_taker_gets_the_lease_when_it_is_released(
    timed: ContextStore, raw_redis: Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A taker that waits gets the lease as soon as the holder releases it, not before."""
    await timed.append("s", USER)
    first = await timed.lease("s", wait_s=0)
    keys = timed.keys("s")
    # Count the waiter's attempts that Redis has answered (only it takes leases from here).
    answered = 0
    script = timed._connection.script

    async def counting(called: Any, *args: Any, **kwargs: Any) -> Any:
        nonlocal answered
        reply = await script(called, *args, **kwargs)
        answered += called is SCRIPTS.lease_acquire
        return reply

    monkeypatch.setattr(timed._connection, "script", counting)
    waiting = asyncio.create_task(timed.lease("s", wait_s=600))  # never gives up in the test
    await until(lambda: answered >= 1)
    # A round trip more gives a waiter that had (wrongly) been granted time to finish.
    await first.renew()  # raises LeaseLostError had the waiter taken the lease
    assert await raw_redis.hget(keys.lease, "token") == first.token.encode()
    assert int(await raw_redis.hget(keys.meta, "fence")) == first.fence  # no new acquisition
    assert not waiting.done()
    await first.release()
    second = await asyncio.wait_for(waiting, 60)  # a safety net
    assert second.fence == first.fence + 1


async def test_expired_holder_cannot_renew_or_release_the_successors_lease(
    timed: ContextStore, clock: ManualClock, raw_redis: Redis
) -> None:
    """After expiry and takeover, the old holder's renew raises and its release deletes nothing."""
    old = await timed.lease("s", ttl_s=10, wait_s=0)
    clock.advance(11)
    new = await timed.lease("s", ttl_s=10, wait_s=0)
    assert new.fence > old.fence
    with pytest.raises(LeaseLostError):
        await old.renew()
    assert old.lost
    assert not await old.release()
    assert await raw_redis.hget(timed.keys("s").lease, "token") == new.token.encode()


async def test_write_by_an_expired_holder_is_refused_at_commit(
    timed: ContextStore, clock: ManualClock
) -> None:
    """A replace under a lease that expired (and was taken) is refused; nothing is written."""
    await timed.append("s", USER)
    old = await timed.lease("s", ttl_s=10, wait_s=0)
    clock.advance(11)
    new = await timed.lease("s", ttl_s=10, wait_s=0)
    with pytest.raises(LeaseLostError):
        await timed.replace("s", [], lease=old)
    assert await timed.get_messages("s") == [USER]
    result = await timed.replace("s", [], lease=new)
    assert result.count == 0


async def test_write_after_expiry_is_refused_even_without_a_successor(
    timed: ContextStore, clock: ManualClock
) -> None:
    """An expired lease cannot write even if nobody took it since."""
    await timed.append("s", USER)
    lease = await timed.lease("s", ttl_s=10, wait_s=0)
    clock.advance(10.001)
    with pytest.raises(LeaseLostError):
        await timed.clear("s", lease=lease)
    assert await timed.get_messages("s") == [USER]


async def test_renew_extends_the_expiry(timed: ContextStore, clock: ManualClock) -> None:
    """Renewing before expiry moves the expiry forward by the TTL."""
    lease = await timed.lease("s", ttl_s=10, wait_s=0)
    clock.advance(8)
    await lease.renew()
    clock.advance(8)  # 16 s after acquisition: alive only because it was renewed
    result = await timed.clear("s", lease=lease)
    assert result.epoch == 1


async def test_writer_takes_over_a_summary_lease(timed: ContextStore) -> None:
    """A write lease preempts a live summary lease, whose holder then loses it."""
    worker = await timed.lease("s", kind="summary", wait_s=0)
    writer = await timed.lease("s", kind="write", wait_s=0)
    assert writer.fence > worker.fence
    with pytest.raises(LeaseLostError):
        await worker.renew()


async def test_summary_lease_does_not_take_over_a_writer(timed: ContextStore) -> None:
    """A summary worker waits for a writer; it never preempts one."""
    await timed.lease("s", kind="write", wait_s=0)
    with pytest.raises(LeaseHeldError):
        await timed.lease("s", kind="summary", wait_s=0)


async def test_kept_alive_renews_in_the_background(timed: ContextStore, clock: ManualClock) -> None:
    """kept_alive renews the lease while the block runs."""
    lease = await timed.lease("s", ttl_s=10, wait_s=0)
    first_expiry = lease.expires_ms
    clock.advance(5)
    async with lease.kept_alive(every_s=0.001):
        await until(lambda: lease.expires_ms > first_expiry)
    assert lease.expires_ms == clock.now_ms() + 10_000


async def test_kept_alive_marks_the_lease_lost(timed: ContextStore, clock: ManualClock) -> None:
    """When a renewal finds the lease taken, kept_alive stops and the lease is lost."""
    lease = await timed.lease("s", ttl_s=10, wait_s=0)
    async with lease.kept_alive(every_s=0.001):
        clock.advance(11)
        await timed.lease("s", ttl_s=10, wait_s=0)
        await until(lambda: lease.lost)
    with pytest.raises(LeaseLostError):
        await timed.clear("s", lease=lease)


async def test_server_clock_is_used_by_default(store: ContextStore) -> None:
    """Without an injected clock, leases expire by the Redis server's time."""
    await store.append("s", USER)
    lease = await store.lease("s", ttl_s=30, wait_s=0)
    now_ms = (await store._connection.client.time())[0] * 1000
    assert now_ms + 25_000 < lease.expires_ms <= now_ms + 31_000
    async with lease:
        pass
    assert (await store.lease("s", wait_s=0)).fence == lease.fence + 1


async def test_a_lease_on_a_session_never_written_leaves_nothing(
    store: ContextStore, raw_redis: Redis
) -> None:
    """Taking and giving back a lease on a session never written leaves no key."""
    lease = await store.lease("ghost", wait_s=0)
    assert await raw_redis.exists(store.keys("ghost").meta)  # the fence lives in meta
    assert await lease.release()
    assert not any([await raw_redis.exists(k) for k in store.keys("ghost").all()])
