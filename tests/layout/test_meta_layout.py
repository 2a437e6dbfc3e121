"""A session's meta is kept in Redis's hashtable encoding (``LAYOUT`` in ``_lib.lua``).

Every append and view reads 9-12 of meta's fields. In the listpack encoding of a
small hash each is found by a scan (an absent one by scanning all); in the
hashtable encoding by a lookup. A field longer than ``hash-max-listpack-value``
keeps meta there: written by every script that creates a session, and by the
first append of a new idempotency generation for a session made before it.
"""

from __future__ import annotations

import pytest
from redis.asyncio import Redis
from support.config import BACKENDS
from support.helpers import system, turn
from support.layout import LAYOUT, encoding

from ctxstore import ContextStore, Settings

pytestmark = pytest.mark.parametrize("backend", BACKENDS, indirect=True)


async def test_each_way_of_making_a_session_keeps_meta_in_a_hashtable(
    store: ContextStore, raw_redis: Redis
) -> None:
    """Append, replace, fork and import each make a meta that reads by lookup."""
    await store.append_many("appended", [system(), *(turn(i) for i in range(3))])
    await store.replace("replaced", [turn(i) for i in range(2)])
    await store.fork("appended", "forked")
    lines = [line async for line in store.export_session("appended")]
    await store.import_sessions(lines, session="imported")
    for session in ("appended", "replaced", "forked", "imported"):
        meta = store.keys(session).meta
        assert await encoding(raw_redis, meta) == "hashtable", session
        value = await raw_redis.hget(meta, LAYOUT)
        assert value is not None and len(value) > 64, session


async def test_a_session_made_before_the_layout_moves_at_its_next_generation(
    settings: Settings, tenant: str, raw_redis: Redis
) -> None:
    """An older meta (listpack, no layout) stays readable, and moves when a generation starts.

    The older meta is made by writing its fields again without the layout. The
    append after it, in the same idempotency generation, leaves it as it is;
    once the generation is over (its start moved back by a period), the next
    append writes the layout.
    """
    async with ContextStore.from_settings(settings, tenant=tenant) as store:
        await store.append_many("s", [turn(i) for i in range(4)])
        meta = store.keys("s").meta
        fields = await raw_redis.hgetall(meta)
        del fields[LAYOUT]
        await raw_redis.delete(meta)
        await raw_redis.hset(meta, mapping=fields)
        assert await encoding(raw_redis, meta) == "listpack"

        await store.append("s", turn(4))
        assert await encoding(raw_redis, meta) == "listpack"
        assert await raw_redis.hget(meta, LAYOUT) is None
        assert [m["content"] for m in await store.get_messages("s")] == [
            turn(i)["content"] for i in range(5)
        ]

        since = int(await raw_redis.hget(meta, "idem_since") or 0)
        await raw_redis.hset(meta, "idem_since", since - store.settings.idempotency_seconds * 2000)
        await store.append("s", turn(5))
        assert await encoding(raw_redis, meta) == "hashtable"
        assert await raw_redis.hget(meta, LAYOUT) is not None
        view = await store.view("s", token_budget=10_000)
        assert [m["content"] for m in view.messages] == [turn(i)["content"] for i in range(6)]
