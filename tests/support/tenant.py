"""A tenant's sessions as Redis holds them (meta, the index) and as the store lists them."""

from __future__ import annotations

from typing import Any

from redis.asyncio import Redis

from ctxstore import ContextStore, Settings, TenantLimits
from ctxstore._layout.keys import tenant_sessions_key


async def existing(raw: Redis, store: ContextStore, names: Any) -> set[str]:
    """The sessions among ``names`` whose meta holds a sequence number (they exist)."""
    return {s for s in names if await raw.hexists(store.keys(s).meta, "seq")}


async def indexed(raw: Redis, store: ContextStore) -> set[str]:
    """The raw members of the tenant's index."""
    key = tenant_sessions_key(store.settings.key_prefix, store.tenant)
    return {m.decode() for m in await raw.zrange(key, 0, -1)}


async def listed(store: ContextStore) -> set[str]:
    """The sessions the store lists (``list_sessions``)."""
    return {row.session for row in await store.list_sessions(limit=1_000)}


async def set_limits(settings: Settings, tenant: str, limits: TenantLimits) -> None:
    """Set a tenant's limits through an operator's store of its own (whose cache is empty)."""
    async with ContextStore.from_settings(settings, tenant=tenant) as operator:
        await operator.set_limits(limits)


async def raw_bytes(store: ContextStore, session: str) -> int:
    """The bytes the session's meta counts against its quota."""
    (value,) = await store._connection.transaction(
        [("HGET", store.keys(session).meta, "bytes")], key=store.keys(session).meta
    )
    return int(value or 0)
