"""A session's epoch and sequence number never go backwards; no reader mixes two lives.

A session deleted (or expired) and written again starts a new life past the last one's
epoch and sequence number: an expected_seq read in the old life is refused in the new, a
paged reader crossing into it raises EpochChangedError, and a summary made of the old
life never lands in the new.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
from redis.asyncio import Redis
from support.faults import Action
from support.helpers import msg, turn

from ctxstore import ConflictError, ContextStore, EpochChangedError, LocalSummarizer

RECREATE: dict[str, Callable[[ContextStore], Awaitable[Any]]] = {
    "append": lambda p: p.append("s", msg("new")),
    "append_many": lambda p: p.append_many("s", [msg("n1"), msg("n2")]),
    "replace": lambda p: p.replace("s", [msg("new")]),
    "clear": lambda p: p.clear("s"),
}


@pytest.mark.parametrize("recreate", list(RECREATE))
@pytest.mark.parametrize("by", ["same pod", "another pod"])
async def test_a_session_recreated_after_delete_moves_epoch_and_seq_forward(
    pods: Callable[..., ContextStore], recreate: str, by: str
) -> None:
    """Delete then recreate (append, append_many, replace, clear; same or other pod): both grow."""
    a = pods()
    b = a if by == "same pod" else pods()
    await a.append_many("s", [msg("0"), msg("1"), msg("2")])
    await a.replace("s", [msg("r")])
    before = await a.info("s")
    assert await a.delete("s")
    await RECREATE[recreate](b)
    after = await a.info("s")
    assert after.exists and after.epoch > before.epoch and after.seq > before.seq


@pytest.mark.parametrize("write", ["append", "append_many", "replace", "clear"])
@pytest.mark.parametrize("recreated_by", ["nobody", "append", "replace"])
async def test_an_expected_seq_read_before_a_delete_is_refused_after_it(
    pods: Callable[..., ContextStore], write: str, recreated_by: str
) -> None:
    """An expected_seq read before delete: ConflictError, recreated or not, on every write path."""
    a, b = pods(), pods()
    await a.append_many("s", [msg("0"), msg("1")])
    seq = (await a.info("s")).seq
    assert await b.delete("s")
    if recreated_by != "nobody":
        await RECREATE[recreated_by](b)
    calls: dict[str, Action] = {
        "append": lambda: a.append("s", msg("x"), expected_seq=seq),
        "append_many": lambda: a.append_many("s", [msg("x"), msg("y")], expected_seq=seq),
        "replace": lambda: a.replace("s", [msg("x")], expected_seq=seq),
        "clear": lambda: a.clear("s", expected_seq=seq),
    }
    before = await b.get_messages("s")
    with pytest.raises(ConflictError):
        await calls[write]()
    assert await b.get_messages("s") == before


@pytest.mark.parametrize("between", ["replace", "clear", "delete+append", "delete+replace"])
async def test_a_paged_reader_crossing_a_new_life_raises_epoch_changed(
    pods: Callable[..., ContextStore], between: str
) -> None:
    """A paged read across replace, clear, or delete and recreate: EpochChangedError, no mix."""
    writer, reader = pods(), pods(history_page_size=1)
    await writer.append_many("s", [msg("0"), msg("1"), msg("2")])
    pages = reader.iter_history("s")
    assert (await anext(pages)).message == msg("0")
    if between == "replace":
        await writer.replace("s", [msg("r0"), msg("r1")])
    elif between == "clear":
        await writer.clear("s")
        await writer.append_many("s", [msg("c0"), msg("c1")])
    else:
        await writer.delete("s")
        await RECREATE[between.split("+")[1]](writer)
        await writer.append("s", msg("more"))
    with pytest.raises(EpochChangedError):
        await _drain(pages)


async def _drain(pages: AsyncIterator[Any]) -> list[Any]:
    return [stored.message async for stored in pages]


async def test_a_paged_reader_never_mixes_an_expired_life_with_the_next(
    pods: Callable[..., ContextStore], raw_redis: Redis
) -> None:
    """A paged read across a TTL expiry and a recreate: EpochChangedError, not two lives mixed."""
    writer, reader = pods(), pods(history_page_size=1)
    await writer.append_many("s", [msg("old0"), msg("old1")])
    await writer.set_ttl("s", 3_600)
    pages = reader.iter_history("s")
    assert (await anext(pages)).message == msg("old0")
    # As if the hour had passed: the keys the TTL moved expire in a millisecond, and Redis
    # drops an expired key when it is next read (polled, never slept on).
    timed = [key for key in writer.keys("s").all() if await raw_redis.pttl(key) > 0]
    for key in timed:
        await raw_redis.pexpire(key, 1)
    for _ in range(100_000):
        if await raw_redis.exists(*timed) == 0:
            break
    assert await raw_redis.exists(*timed) == 0
    await writer.append_many("s", [msg("new0"), msg("new1")])
    with pytest.raises(EpochChangedError):
        await _drain(pages)


async def test_a_summary_of_a_session_expired_mid_job_never_lands_in_its_next_life(
    pods: Callable[..., ContextStore], raw_redis: Redis
) -> None:
    """Keys expire mid-job and a new life starts at the same epoch: the commit is stale."""
    store = pods(summary_trigger_tokens=40, summary_keep_tokens=20)
    await store.append_many("s", [turn(i) for i in range(12)])

    keys = store.keys("s")

    async def expire_and_write_again() -> None:
        await raw_redis.delete(*(k for k in keys.all() if k != keys.lease))  # the job's lease stays
        await store.append("s", {"role": "user", "content": "a new life"})

    class ExpiringMidJob(LocalSummarizer):
        async def summarize(self, *args: Any, **kwargs: Any) -> str:
            await expire_and_write_again()
            return await super().summarize(*args, **kwargs)

        async def summarize_levels(self, *args: Any, **kwargs: Any) -> Any:
            await expire_and_write_again()
            return await super().summarize_levels(*args, **kwargs)

    outcome = await store.summarize("s", ExpiringMidJob())
    assert outcome.status == "stale"
    info = await store.info("s")
    assert info.summary_covers is None and info.count == 1
    assert await store.get_messages("s") == [{"role": "user", "content": "a new life"}]
