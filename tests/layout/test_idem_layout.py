"""An idempotency generation past ``IDEM_TABLE_AT`` keys is kept in the hashtable encoding.

As a listpack (kept up to ``hash-max-listpack-entries``, 512 by default), each
append's ``HSET`` scans every key of the generation before it; a session written to
one message at a time, as an agent loop does, paid more for each append the longer
its generation grew. Past 16 keys the append writes the layout field (``''``, which
no idempotency key can be) into the generation, and Redis keeps it as a hashtable.
"""

from __future__ import annotations

import pytest
from redis.asyncio import Redis
from support.config import BACKENDS
from support.helpers import turn
from support.layout import encoding

from ctxstore import ContextStore, InvalidInputError

pytestmark = pytest.mark.parametrize("backend", BACKENDS, indirect=True)

TABLE_AT = 16
"""``IDEM_TABLE_AT`` in append.lua."""


async def test_a_generation_turns_into_a_hashtable_past_16_keys(
    store: ContextStore, raw_redis: Redis
) -> None:
    """Sixteen one-message appends leave a listpack; the seventeenth, a hashtable."""
    idem = store.keys("s").idem
    for i in range(TABLE_AT):
        await store.append("s", turn(i))
    assert await encoding(raw_redis, idem) == "listpack"
    assert await raw_redis.hlen(idem) == TABLE_AT
    assert await raw_redis.hget(idem, "") is None

    await store.append("s", turn(TABLE_AT))
    assert await encoding(raw_redis, idem) == "hashtable"
    layout = await raw_redis.hget(idem, "")
    assert layout is not None and len(layout) > 64
    assert await raw_redis.hlen(idem) == TABLE_AT + 2  # the keys, and the layout once
    for i in range(TABLE_AT + 1, 40):
        await store.append("s", turn(i))
    assert await raw_redis.hget(idem, "") == layout
    assert [m["content"] for m in await store.get_messages("s")] == [
        turn(i)["content"] for i in range(40)
    ]


async def test_retries_are_answered_from_either_encoding(store: ContextStore) -> None:
    """Keys written before and after the conversion each answer their retry, writing nothing."""
    first = [await store.append("s", turn(i), idempotency_key=f"k{i}") for i in range(30)]
    for i in (0, TABLE_AT - 1, TABLE_AT, TABLE_AT + 1, 29):
        again = await store.append("s", turn(i), idempotency_key=f"k{i}")
        assert again.duplicate, i
        assert (again.entry_id, again.seq, again.epoch) == (
            first[i].entry_id,
            first[i].seq,
            first[i].epoch,
        ), i
    assert (await store.info("s")).count == 30


async def test_a_batch_converts_within_its_call_and_every_key_answers(
    store: ContextStore, raw_redis: Redis
) -> None:
    """One ``append_many`` crossing the threshold: every key of it is found on its retry."""
    keys = [f"b{i}" for i in range(TABLE_AT + 10)]
    messages = [turn(i) for i in range(len(keys))]
    first = await store.append_many("s", messages, idempotency_keys=keys)
    assert await encoding(raw_redis, store.keys("s").idem) == "hashtable"
    again = await store.append_many("s", messages, idempotency_keys=keys)
    assert all(r.duplicate for r in again)
    assert [r.entry_id for r in again] == [r.entry_id for r in first]
    assert (await store.info("s")).count == len(keys)


async def test_the_empty_key_the_layout_takes_is_refused(store: ContextStore) -> None:
    """No caller can write, or read back, the layout field as an idempotency key."""
    for i in range(TABLE_AT + 1):
        await store.append("s", turn(i))
    with pytest.raises(InvalidInputError):
        await store.append("s", turn(99), idempotency_key="")
    assert (await store.info("s")).count == TABLE_AT + 1


async def test_the_next_generation_starts_small_and_the_old_one_still_answers(
    store: ContextStore, raw_redis: Redis
) -> None:
    """A rotation keeps the old generation's hashtable and its answers; the new one turns too.

    The new generation starts as a listpack and becomes a hashtable at its own
    seventeenth key.
    """
    keys = store.keys("s")
    for i in range(20):
        await store.append("s", turn(i), idempotency_key=f"old{i}")
    since = int(await raw_redis.hget(keys.meta, "idem_since") or 0)
    await raw_redis.hset(
        keys.meta, "idem_since", since - int(store.settings.idempotency_seconds * 2000)
    )

    await store.append("s", turn(20), idempotency_key="new0")
    assert await encoding(raw_redis, keys.idem_old) == "hashtable"
    assert await encoding(raw_redis, keys.idem) == "listpack"
    assert await raw_redis.hlen(keys.idem) == 1
    retried = await store.append("s", turn(3), idempotency_key="old3")
    assert retried.duplicate and retried.seq == 4

    for i in range(1, TABLE_AT + 1):
        await store.append("s", turn(20 + i), idempotency_key=f"new{i}")
    assert await encoding(raw_redis, keys.idem) == "hashtable"
    assert (await store.info("s")).count == 20 + TABLE_AT + 1
