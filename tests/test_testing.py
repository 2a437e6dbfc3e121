"""The shipped test helpers: the audit must catch what it claims to catch."""

from __future__ import annotations

from typing import Any

from ctxstore import ContextStore
from ctxstore.testing import Ack, ManualClock, WordCounter, audit


def key(message: dict[str, Any]) -> tuple[str, int] | None:
    """(writer, index) from a message like {"content": "w:3"}."""
    writer, _, index = message["content"].partition(":")
    return (writer, int(index)) if index else None


async def test_audit_passes_a_sound_session(store: ContextStore) -> None:
    """Acks that match the history give an all-zero audit."""
    acks = []
    for i in range(3):
        result = await store.append("s", {"role": "user", "content": f"w:{i}"})
        acks.append(Ack("w", i, result.entry_id, result.epoch))
    found = await audit(store, "s", acks, key_of=key)
    assert (found.lost, found.duplicated, found.out_of_order, found.checked) == (0, 0, 0, 3)


async def test_audit_catches_loss_doubles_and_reordering(store: ContextStore) -> None:
    """A missing ack, a doubled message and a writer's swapped order are each counted."""
    first = await store.append("s", {"role": "user", "content": "w:0"})
    second = await store.append("s", {"role": "user", "content": "w:1"})
    await store.append("s", {"role": "user", "content": "w:1"})  # stored twice
    acks = [
        Ack("w", 0, second.entry_id, 0),  # claims index 0 got the later id...
        Ack("w", 1, first.entry_id, 0),  # ...and index 1 the earlier: out of order, and wrong ids
        Ack("w", 2, "9999999999999-0", 0),  # acked but never stored
    ]
    found = await audit(store, "s", acks, key_of=key)
    assert found.duplicated == 1
    assert found.out_of_order == 1
    assert found.lost == 3


async def test_audit_counts_appends_a_rewrite_did_not_account_for(store: ContextStore) -> None:
    """An ack in a superseded epoch that the rewrite's count misses is lost."""
    acked = await store.append("s", {"role": "user", "content": "w:0"})
    rewrite = await store.clear("s")
    acks = [Ack("w", 0, acked.entry_id, 0), Ack("w", 1, "1-1", 0)]  # the second never happened
    found = await audit(store, "s", acks, [rewrite], key_of=key)
    assert found.lost == 1


def test_manual_clock_and_word_counter() -> None:
    """The manual clock moves only when told; the word counter counts words."""
    clock = ManualClock(1000)
    clock.advance(1.5)
    assert clock.now_ms() == 2500
    assert WordCounter().count("three little words") == 3
