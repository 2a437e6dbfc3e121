"""Every write path is held to the tenant's append rate and byte quota, previews included."""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import pytest
from redis.asyncio import Redis
from support.helpers import msg
from support.tenant import set_limits

from ctxstore import ContextStore, QuotaExceededError, Settings, TenantLimits


async def _clear_times(store: ContextStore, times: int) -> None:
    for _ in range(times):
        await store.clear("s")


async def test_clear_is_held_to_the_append_rate(
    settings: Settings, tenant: str, pods: Callable[..., ContextStore]
) -> None:
    """appends_per_second=1, burst 2, the bucket empty: 20 clears in a row are refused."""
    await set_limits(settings, tenant, TenantLimits(appends_per_second=1, append_burst=2))
    a = pods()
    await a.append_many("s", [msg("0"), msg("1")])
    with pytest.raises(QuotaExceededError):
        await a.append("s", msg("2"))
    with pytest.raises(QuotaExceededError):
        await _clear_times(a, 20)


async def test_delete_and_recreate_does_not_refill_the_append_rate(
    settings: Settings, tenant: str, pods: Callable[..., ContextStore]
) -> None:
    """appends_per_second=1, burst 2: append 2, delete, append 2 more at once: refused."""
    await set_limits(settings, tenant, TenantLimits(appends_per_second=1, append_burst=2))
    a = pods()
    await a.append_many("s", [msg("0"), msg("1")])
    await a.delete("s")
    with pytest.raises(QuotaExceededError):
        await a.append_many("s", [msg("2"), msg("3")])


async def test_stored_previews_count_against_session_bytes(
    settings: Settings, tenant: str, pods: Callable[..., ContextStore], raw_redis: Redis
) -> None:
    """session_bytes=200,000 and 18 KB tool results: what is stored never passes 200,000 bytes."""
    await set_limits(settings, tenant, TenantLimits(session_bytes=200_000))
    a = pods()
    big = "lorem ipsum dolor sit amet " * 700
    with contextlib.suppress(QuotaExceededError):
        for i in range(50):
            await a.append_many(
                "s",
                [
                    {
                        "role": "assistant",
                        "content": None,
                        "tool_calls": [
                            {
                                "id": f"c{i}",
                                "type": "function",
                                "function": {"name": "f", "arguments": "{}"},
                            }
                        ],
                    },
                    {"role": "tool", "tool_call_id": f"c{i}", "content": big},
                ],
            )
    rows = await raw_redis.xrange(a.keys("s").log)
    stored = sum(len(f[b"m"]) + len(f.get(b"v", b"")) for _, f in rows)
    assert stored <= 200_000
