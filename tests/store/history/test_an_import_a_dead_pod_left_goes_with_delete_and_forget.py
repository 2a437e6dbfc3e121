"""An import a pod died in leaves nothing that delete or forget_tenant does not remove.

A pod that dies between an import's batches and its end line leaves the staged
messages (in clear, under keys nothing lists) until they expire. The store names
each import's staging in the tenant's registry before staging anything, so
``delete`` of that session and ``forget_tenant`` find and remove it.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from redis.asyncio import Redis

from ctxstore import ContextStore, MalformedArchiveError
from ctxstore._layout.keys import tenant_staging_key
from ctxstore._parts.staging import STAGE_BATCH, StagedSession


async def _died_mid_import(store: ContextStore, monkeypatch: pytest.MonkeyPatch) -> None:
    """Import 'moved' until a batch is staged, then fail as a pod that dies would: no cleanup."""
    for i in range(STAGE_BATCH + 10):
        await store.append("src", {"role": "user", "content": f"message {i}"})
    lines = [line async for line in store.export_session("src")]

    def cut() -> Iterator[str]:
        yield from lines[:-1]  # every message, so at least one batch is staged
        yield "not json"  # then the import stops, as at a pod's death

    async def died(self: StagedSession) -> None:  # its process is gone: nothing cleans up
        return None

    monkeypatch.setattr(StagedSession, "abandon", died)
    with pytest.raises(MalformedArchiveError):
        await store.import_sessions(cut(), session="moved")
    monkeypatch.undo()


async def _staged(raw: Redis, store: ContextStore) -> list[Any]:
    keys = store.keys("moved")
    pattern = keys.log.removesuffix(keys.log.rsplit(":", 1)[-1]) + "stage:*"
    return [key async for key in raw.scan_iter(match=pattern)]


async def test_delete_removes_an_import_of_the_session_a_dead_pod_left(
    store: ContextStore, raw_redis: Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """delete('moved') removes the staged keys of an import into 'moved' that never ended."""
    await _died_mid_import(store, monkeypatch)
    assert await _staged(raw_redis, store)  # the dead import's messages are there
    assert not await store.delete("moved")  # the session never appeared
    assert await _staged(raw_redis, store) == []


async def test_forget_tenant_removes_every_import_a_dead_pod_left(
    store: ContextStore, raw_redis: Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """forget_tenant removes the staged keys and the registry: no key of the tenant is left."""
    await _died_mid_import(store, monkeypatch)
    assert await _staged(raw_redis, store)
    await store.forget_tenant()
    assert await _staged(raw_redis, store) == []
    assert not await raw_redis.exists(tenant_staging_key(store.settings.key_prefix, store.tenant))


async def test_an_import_that_ends_leaves_no_entry_in_the_registry(
    store: ContextStore, raw_redis: Redis
) -> None:
    """An import that commits, and one refused at its end, take their staging out."""
    await store.append_many("src", [{"role": "user", "content": f"m {i}"} for i in range(3)])
    lines = [line async for line in store.export_session("src")]
    await store.import_sessions(lines, session="copy")
    with pytest.raises(MalformedArchiveError):
        await store.import_sessions([*lines[:-1], lines[-1].replace('"count":3', '"count":4')])
    registry = tenant_staging_key(store.settings.key_prefix, store.tenant)
    assert await raw_redis.zcard(registry) == 0
    assert await _staged(raw_redis, store) == []
