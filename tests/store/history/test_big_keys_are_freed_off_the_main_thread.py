"""Deleting a session or forgetting a tenant frees big keys off Redis's main thread (UNLINK)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import pytest
from redis.asyncio import Redis
from support.servers import ServerPool, redis7_binary

from ctxstore import ContextStore, Settings

# The search index of this history is a hash of about 1,500 terms: past Redis's lazy-free
# threshold (64 elements), so UNLINK hands it to the background thread where DEL frees it
# while every other client waits.
HISTORY = [{"role": "user", "content": " ".join(f"w{i}x{j}" for j in range(5))} for i in range(300)]


async def _delete(store: ContextStore) -> None:
    await store.delete("s")


async def _forget(store: ContextStore) -> None:
    await store.forget_tenant()


@pytest.mark.parametrize("remove", [_delete, _forget], ids=["delete", "forget_tenant"])
async def test_a_big_index_is_freed_in_the_background(
    servers: ServerPool, remove: Callable[[ContextStore], Awaitable[None]]
) -> None:
    """A session's 1,500-term index goes by lazy free: Redis counts it in lazyfreed_objects."""
    if redis7_binary() is None:
        pytest.skip("needs redis-server >= 7 (INFO's lazyfreed_objects)")
    server = servers.start()
    settings = Settings(redis_url=server.url(), key_prefix="lazy")
    admin = Redis.from_url(server.url())
    try:
        async with ContextStore.from_settings(settings, tenant="t") as store:
            await store.append_many("s", HISTORY)
            assert await store.search("s", "w5x1")  # the index is made
            before = (await admin.info("memory"))["lazyfreed_objects"]
            await remove(store)

            # The background thread counts an object once it has freed it: ask until it has
            # (DEL frees it before replying, and the count never moves).
            for _ in range(20_000):
                if (await admin.info("memory"))["lazyfreed_objects"] > before:
                    break
            else:
                raise AssertionError("nothing was freed in the background")
            assert await admin.exists("lazy:{t:s}:index", "lazy:{t:s}:log") == 0
    finally:
        await admin.aclose()
