"""A session's expiry, read and moved without sleeping: its keys' PEXPIRETIME, aged at will.

Time is "passed" by moving keys' expiries back (PEXPIRE, PEXPIREAT), and absolute
expiries are read with PEXPIRETIME.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from redis.asyncio import Redis

from ctxstore import ContextStore, Settings, TenantLimits
from ctxstore._layout.chain import Chain
from support.helpers import SYSTEM, turn
from support.pods import pods_on


async def shorten(raw: Redis, store: ContextStore, session: str) -> None:
    """As if time had passed since the TTL was set: every key of the session expires soon."""
    keys = store.keys(session)
    for key in (keys.log, keys.meta, keys.keep, keys.checkpoints, keys.checkpoint_summaries):
        if await raw.exists(key):
            await raw.pexpire(key, 5_000)


def all_keys(pod: ContextStore, session: str) -> list[str]:
    k = pod.keys(session)
    return [k.log, k.meta, k.idem, k.idem_old, k.keep, k.gone, k.view, k.anchor, k.index]


async def states(raw: Redis, pod: ContextStore, session: str) -> list[Any]:
    """Every key of the session as it stands: content and absolute expiry."""
    out: list[Any] = []
    for key in all_keys(pod, session):
        kind = (await raw.type(key)).decode()  # type: ignore[union-attr]
        if kind == "stream":
            body: Any = await raw.xrange(key)
        elif kind == "hash":
            body = sorted((await raw.hgetall(key)).items())  # type: ignore[misc]
        elif kind == "string":
            body = await raw.get(key)
        else:
            body = None
        out.append((key, kind, body, await raw.pexpiretime(key)))
    return out


NINE = (
    "log",
    "meta",
    "keep",
    "view",
    "anchor",
    "index",
    "checkpoints",
    "checkpoint_summaries",
    "branches",
)
"""The session keys whose expiry an append moves (append.lua's KEYS 1, 2, 5, 7-12)."""


SAME_MS = 5
"""How far two keys set in one script may differ (a copied PTTL, then PEXPIRE)."""


def with_ttl(settings: Settings, seconds: int | None, **more: Any) -> Settings:
    return settings.model_copy(update={"session_ttl_seconds": seconds, **more})


async def now_ms(raw: Redis) -> int:
    reply: Any = await raw.time()
    if isinstance(reply, dict):  # a cluster client asks every node
        reply = next(iter(reply.values()))
    return int(reply[0]) * 1000 + int(reply[1]) // 1000


async def expiries(raw: Redis, store: ContextStore, session: str) -> dict[str, int]:
    """PEXPIRETIME of each of the nine keys that exists (-1: none)."""
    keys = store.keys(session)
    found = {}
    for name in NINE:
        at = await raw.pexpiretime(getattr(keys, name))
        if at != -2:
            found[name] = at
    return found


async def together(raw: Redis, store: ContextStore, session: str) -> int:
    """Every key that exists expires with meta (or none does); meta's PEXPIRETIME."""
    at = await expiries(raw, store, session)
    meta = at["meta"]
    if meta == -1:
        assert all(v == -1 for v in at.values()), at
    else:
        assert all(v > 0 and abs(v - meta) <= SAME_MS for v in at.values()), at
    return meta


async def age(raw: Redis, keys: list[str], ms: int) -> None:
    """As if ``ms`` had passed: each key that expires does so ``ms`` sooner."""
    for key in keys:
        at = await raw.pexpiretime(key)
        if at > 0:
            await raw.pexpireat(key, at - ms)


def nine(store: ContextStore, session: str) -> list[str]:
    return [getattr(store.keys(session), name) for name in NINE]


async def segment_keys(store: ContextStore, session: str) -> list[str]:
    (raw,) = await store._connection.transaction(
        [("HGET", store.keys(session).meta, "chain")], key=store.keys(session).meta
    )
    found = []
    for seg in Chain.parse(raw).segments:
        keys = store._lineage.keys(seg.owner, seg.segment)
        found += [keys.log, keys.info]
    return found


def fork_settings(settings: Settings, seconds: int | None) -> Settings:
    return with_ttl(settings, seconds, bridge_entries=40, bridge_tokens=2_000)


@asynccontextmanager
async def change_default(
    settings: Settings, tenant: str, source: str, old: int, new: int | None
) -> AsyncIterator[ContextStore]:
    """A session ``s`` written under a default TTL of ``old`` s, then a store under ``new``."""
    if source == "tenant limits":
        async with ContextStore.from_settings(settings, tenant=tenant) as store:
            await store.set_limits(TenantLimits(ttl_seconds=old))
            await store.append_many("s", [SYSTEM, turn(0)])
            await store.checkpoint("s")
            await store.set_limits(TenantLimits(ttl_seconds=new))
            yield store
    else:
        async with pods_on(with_ttl(settings, old), with_ttl(settings, new), tenant=tenant) as (
            before,
            after,
        ):
            await before.append_many("s", [SYSTEM, turn(0)])
            await before.checkpoint("s")
            yield after
