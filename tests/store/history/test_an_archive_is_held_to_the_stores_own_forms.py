"""An archive's lines are held to the forms the store writes: each attack is refused by line.

A line that would leave a session the store cannot read, view, rewind or
checkpoint (a boolean for a number, a lone surrogate, a separator in a tie,
an id spelled with leading zeros, a checkpoint number with no successor) is
refused with ``MalformedArchiveError`` naming it, and nothing of the session is
written. What the forms allow (ids past 2**53, up to 2**64 - 1) works: ids are
compared as integers everywhere, the scripts included.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from redis.asyncio import Redis
from support.config import BACKENDS
from support.helpers import dumped, paired, turn

from ctxstore import (
    ContextStore,
    InvalidInputError,
    LocalSummarizer,
    MalformedArchiveError,
    Settings,
)

pytestmark = pytest.mark.parametrize("backend", BACKENDS, indirect=True)

SURROGATE = "\ud800"


async def exported(store: ContextStore, session: str) -> list[dict[str, Any]]:
    """The session's export, each line parsed."""
    return [json.loads(line) async for line in store.export_session(session)]


def lines(records: list[dict[str, Any]], *, ascii: bool = True) -> list[str]:
    """An archive edited by hand: its end line without the digest (an attacker's own)."""
    end = {k: v for k, v in records[-1].items() if k != "digest"}
    return [json.dumps(r, ensure_ascii=ascii) for r in [*records[:-1], end]]


def numbered(records: list[dict[str, Any]], kind: str) -> int:
    """The line number (from 1) of the first line of ``kind``."""
    return next(i for i, r in enumerate(records, 1) if r["ctxstore"] == kind)


async def full(store: ContextStore) -> list[dict[str, Any]]:
    """A session with a pin, a reasoning item tied to the next, a summary and a checkpoint."""
    await store.append_many("s", [turn(i) for i in range(20)])
    first = (await store.read("s", limit=1)).messages[0]
    await store.pin("s", first.entry_id)
    await store.append_many(
        "s",
        [
            {"type": "reasoning", "id": "rs_1", "summary": []},
            {"type": "function_call", "call_id": "fc1", "name": "f", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "fc1", "output": "ok"},
        ],
    )
    await store.summarize("s", LocalSummarizer())
    await store.checkpoint("s", name="saved")
    return await exported(store, "s")


async def refused_at(
    store: ContextStore, raw: Redis, archive: list[str], number: int, session: str = "copy"
) -> MalformedArchiveError:
    """Import ``archive``: refused naming line ``number``, and nothing of the session written."""
    with pytest.raises(MalformedArchiveError) as refused:
        await store.import_sessions(archive, session=session)
    assert refused.value.line == number, refused.value
    assert f"line {number}:" in str(refused.value)
    assert not (await store.info(session)).exists
    assert [k async for k in raw.scan_iter(match=f"*{store.tenant}:{session}}}*")] == []
    return refused.value


@pytest.fixture
async def store(summary_settings: Settings, tenant: str) -> Any:
    """A store with a small summary window (the archives hold a summary)."""
    async with ContextStore.from_settings(summary_settings, tenant=tenant) as opened:
        yield opened


async def test_a_boolean_or_out_of_range_counter_is_refused(
    store: ContextStore, raw_redis: Redis
) -> None:
    """`true` (or a float, a string, 2**63) for a checkpoint's or summary's counter: refused."""
    records = await full(store)
    point, summary = numbered(records, "checkpoint"), numbered(records, "summary")
    for field in ("seq", "epoch", "created_ms", "count", "tokens"):
        for bad in (True, False, 1.0, "3", -1, 2**63):
            edited = [dict(r) for r in records]
            edited[point - 1][field] = bad
            await refused_at(store, raw_redis, lines(edited), point)
    for bad in (True, 2**64, "350"):
        edited = [dict(r) for r in records]
        edited[summary - 1]["covered_tokens"] = bad
        await refused_at(store, raw_redis, lines(edited), summary)
        edited = [dict(r) for r in records]
        edited[point - 1]["summary"] = {**edited[point - 1]["summary"], "covered_tokens": bad}
        await refused_at(store, raw_redis, lines(edited), point)
    assert [p.checkpoint_id for p in await store.checkpoints("s")] == ["cp-1"]
    assert len([line async for line in store.export_session("s")]) == len(records)


async def test_a_lone_surrogate_anywhere_is_refused(store: ContextStore, raw_redis: Redis) -> None:
    """In a message, a tie, the ledger, narrative or model, a checkpoint's name: refused."""
    records = await full(store)
    message, summary = 2, numbered(records, "summary")
    tied = next(i for i, r in enumerate(records, 1) if "ties" in r)
    point = numbered(records, "checkpoint")
    edits: list[tuple[int, str, Any]] = [
        (message, "message", {"role": "user", "content": "a" + SURROGATE}),
        (tied, "ties", ["~reasoning:" + SURROGATE]),
        (summary, "ledger", "facts " + SURROGATE),
        (summary, "narrative", SURROGATE),
        (summary, "model", "m" + SURROGATE),
        (point, "name", "saved " + SURROGATE),
    ]
    for number, field, value in edits:
        for ascii in (True, False):  # escaped in the JSON, or a raw surrogate in the text
            edited = [dict(r) for r in records]
            edited[number - 1][field] = value
            await refused_at(store, raw_redis, lines(edited, ascii=ascii), number)


async def test_a_tie_is_spelled_as_the_store_writes_it(
    store: ContextStore, raw_redis: Redis
) -> None:
    """A pinned reasoning item whose tie holds a separator is refused; other sessions still view."""
    records = await full(store)
    tied = next(i for i, r in enumerate(records, 1) if "ties" in r)
    for bad in (["~reasoning:a\x1eb"], ["~reasoning:a\x1fb"], ["reasoning:ab"], ["~reasoning:"]):
        edited = [dict(r) for r in records]
        edited[tied - 1] = {**edited[tied - 1], "ties": bad, "pinned": True}
        await refused_at(store, raw_redis, lines(edited), tied)
    edited = [dict(r) for r in records]
    edited[tied - 1] = {**edited[tied - 1], "pinned": True}  # a well-formed tie, pinned: views
    await store.import_sessions(lines(edited), session="copy")
    view = await store.view("copy", token_budget=2_000)
    paired(view.messages)
    assert {"type": "reasoning", "id": "rs_1", "summary": []} in view.messages
    await store.view("s", token_budget=2_000)


async def test_an_entry_id_has_one_spelling(store: ContextStore, raw_redis: Redis) -> None:
    """Leading zeros in an id (pinned, or a summary's) are refused; pin() refuses them too."""
    records = await full(store)
    pinned = next(i for i, r in enumerate(records, 1) if r.get("pinned"))
    edited = [dict(r) for r in records]
    edited[pinned - 1]["id"] = "000" + edited[pinned - 1]["id"]
    await refused_at(store, raw_redis, lines(edited), pinned)
    summary = numbered(records, "summary")
    edited = [dict(r) for r in records]
    edited[summary - 1]["covers"] = "0" + edited[summary - 1]["covers"]
    await refused_at(store, raw_redis, lines(edited), summary)
    first = (await store.read("s", limit=1)).messages[0].entry_id
    with pytest.raises(InvalidInputError, match="not a stream entry id"):
        await store.pin("s", "0" + first)
    view = await store.view("s", token_budget=100_000)
    sent = dumped(view)
    assert len(sent) == len(set(sent))


async def test_ids_past_two_to_the_53_compare_as_integers(store: ContextStore) -> None:
    """Pinned entries at 2**53 and 2**53 + 1: a rewind to the first abandons the second."""
    low, high = "9007199254740992-0", "9007199254740993-0"
    header = {"ctxstore": "session", "version": 1, "tenant": store.tenant, "session": "big"}
    records = [
        header,
        {"ctxstore": "message", "id": low, "message": turn(0), "pinned": True},
        {"ctxstore": "message", "id": high, "message": turn(1), "pinned": True},
        *(
            {
                "ctxstore": "checkpoint",
                "id": name,
                "entry_id": at,
                "seq": 2,
                "epoch": 0,
                "count": 0,
                "tokens": 0,
                "created_ms": 1,
            }
            for name, at in (("cp-1", low), ("cp-2", high))
        ),
        {"ctxstore": "end", "session": "big", "count": 2},
    ]
    await store.import_sessions(lines(records))
    rewound = await store.rewind("big", "cp-1")
    assert (rewound.count, rewound.abandoned) == (1, 1)
    assert await store.get_messages("big") == [turn(0)]
    assert (await store.view("big", token_budget=10_000)).messages == [turn(0)]
    assert (await store.info("big")).pinned == (low,)
    points = {p.checkpoint_id: p.branch for p in await store.checkpoints("big")}
    assert points == {"cp-1": None, "cp-2": rewound.branch}
    await store.append("big", turn(2))  # Redis gives it an id after the last
    assert await store.get_messages("big") == [turn(0), turn(2)]
    [line async for line in store.export_session("big")]


async def test_a_checkpoint_number_leaves_room_for_the_next(
    store: ContextStore, raw_redis: Redis
) -> None:
    """cp-9999999999999 is refused (its next could not be named); below it, the next one works."""
    records = await full(store)
    point = numbered(records, "checkpoint")
    for bad in ("cp-9999999999999", "cp-1000000000000", "cp-01", "cp-0"):
        edited = [dict(r) for r in records]
        edited[point - 1]["id"] = bad
        await refused_at(store, raw_redis, lines(edited), point)
    edited = [dict(r) for r in records]
    edited[point - 1]["id"] = "cp-999999999999"
    await store.import_sessions(lines(edited), session="copy")
    made = await store.checkpoint("copy")
    assert made.checkpoint_id == "cp-1000000000000"
    await store.append("copy", turn(99))
    await store.rewind("copy", made.checkpoint_id)
    assert await store.delete_checkpoint("copy", made.checkpoint_id)
    assert [p.checkpoint_id for p in await store.checkpoints("copy")] == ["cp-999999999999"]


async def test_the_end_line_is_held_to_its_forms(store: ContextStore, raw_redis: Redis) -> None:
    """An end line counting with a boolean, or a digest that is no SHA-256, is refused."""
    records = await full(store)
    for bad in ({"count": True}, {"count": 1.0 * (len(records) - 2)}, {"digest": "x" * 64}):
        edited = [*records[:-1], {**records[-1], **bad}]
        archive = [json.dumps(r) for r in edited]
        await refused_at(store, raw_redis, archive, len(records))


async def test_the_deepest_message_an_append_takes_imports_again(store: ContextStore) -> None:
    """A message nested as deep as an append allows: its export imports (the line is one deeper)."""
    deepest = None
    for depth in range(300, 0, -1):
        message = {"role": "user", "content": "x", "x": json.loads("[" * depth + "]" * depth)}
        try:
            await store.append("deep", message)
        except InvalidInputError:
            continue
        deepest = message
        break
    assert deepest is not None
    archive = [line async for line in store.export_session("deep")]
    await store.import_sessions(archive, session="copy")
    assert await store.get_messages("copy") == [deepest]
