"""A generated corpus of hostile archives: each is refused by its line, or imports whole.

Every field of every line of two real exports (one in clear, one sealed) is
replaced by what an adversary would put there: booleans, floats, negative and
huge integers and strings for numbers; lone surrogates (escaped in the JSON,
or raw in the line) and control characters for text; leading zeros and ids
too long or past 64 bits; lists and objects where neither belongs; the field
left out, or one added. Nested objects (a message, a checkpoint's summary)
have each of their fields replaced the same way. The end line's digest is
left out (an adversary can compute one), so what the import checks is each
line, not the digest.

Each mutated archive is imported on a private Redis. Either it is refused
with ``MalformedArchiveError`` naming one of its lines, and the Redis holds
exactly what it held before (nothing staged, nothing written), or it is
imported and the session then reads, views (no orphan tool call, no message
twice), checkpoints, rewinds and exports, and its export imports again, all
without an error.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from redis.asyncio import Redis
from support.config import THOROUGH
from support.helpers import dumped, key_states, oa_call, oa_result, paired, private_settings
from support.servers import PrivateRedis

from ctxstore import (
    BudgetExceededError,
    ContextStore,
    Keyring,
    LocalSummarizer,
    MalformedArchiveError,
)

SURROGATE = "\ud800"
LONG = " ".join(f"word{i}" for i in range(60))
"""About 120 tokens: four turns pass the summary's trigger."""


@dataclass(frozen=True)
class Case:
    """One hostile archive: which line, which field, what was put there."""

    line: int
    path: tuple[str, ...]
    label: str
    lines: list[str]


async def rich_session(store: ContextStore, session: str) -> None:
    """A session with every kind of line and field an export writes."""
    await store.append(session, {"role": "system", "content": "be careful"})
    for i in range(4):
        role = "user" if i % 2 == 0 else "assistant"
        await store.append(session, {"role": role, "content": f"turn {i}: {LONG}"})
    second = (await store.read(session, limit=3)).messages[2]
    await store.pin(session, second.entry_id)
    await store.append_many(session, [oa_call("c1"), oa_result("c1")])
    await store.append_many(
        session,
        [
            {"type": "reasoning", "id": "rs_1", "summary": []},
            {"type": "function_call", "call_id": "fc1", "name": "f", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "fc1", "output": "ok"},
        ],
    )
    await store.checkpoint(session, name="before")
    await store.summarize(session, LocalSummarizer())
    await store.checkpoint(session, name="after the summary")
    await store.append(session, {"role": "user", "content": "and now?"})


def replacements(value: Any) -> Iterator[tuple[str, Any, bool]]:
    """What an adversary puts in a field holding ``value``: (label, value, JSON-escaped)."""
    for label, new in [
        ("true", True),
        ("false", False),
        ("a float", 1.5),
        ("-1", -1),
        ("0", 0),
        ("2**63", 2**63),
        ("2**64", 2**64),
        ("10**30", 10**30),
        ("a numeric string", "7"),
        ("an empty string", ""),
        ("null", None),
        ("an empty list", []),
        ("a list of text", ["x"]),
        ("an object", {}),
        ("control characters", "a\x00\x1e\x1fb"),
        ("an over-long id", "1" * 30 + "-0"),
        ("an id past 64 bits", f"{2**64}-0"),
        ("an id at 2**53", "9007199254740992-0"),
        ("an id past 2**53", "9007199254740993-0"),
        ("the last id", f"{2**64 - 1}-{2**64 - 1}"),
        ("the id 0-0", "0-0"),
        ("the highest checkpoint id the store takes", "cp-9999999999999"),
        ("a checkpoint id of 14 digits", "cp-10000000000000"),
    ]:
        yield label, new, True
    yield "a lone surrogate, escaped", SURROGATE, True
    yield "a lone surrogate, raw", SURROGATE, False
    if isinstance(value, str):
        yield "leading zeros", "000" + value, True
        yield "a lone surrogate inside, escaped", value[:3] + SURROGATE + value[3:], True
        yield "a lone surrogate inside, raw", value[:3] + SURROGATE + value[3:], False
        yield "a record separator inside", value[:3] + "\x1e" + value[3:], True
        yield "10,000 characters more", value + "x" * 10_000, True
    if isinstance(value, int) and not isinstance(value, bool):
        yield "its digits as text", str(value), True
        yield "one more", value + 1, True
    if isinstance(value, list) and value and isinstance(value[0], str):
        yield "twice", value * 2, True
        yield "a record separator inside", [value[0][:11] + "a\x1eb"], True
        yield "a lone surrogate inside", [value[0] + SURROGATE], True


def corpus(lines: list[str]) -> list[Case]:
    """Every field of every line (and of the objects inside them) replaced, left out, added to."""
    records = [json.loads(line) for line in lines]
    cases = []

    def emit(index: int, path: tuple[str, ...], label: str, record: Any, ascii: bool) -> None:
        mutated = list(records)
        mutated[index] = record
        if (index, path) != (len(records) - 1, ("digest",)):
            mutated[-1] = {k: v for k, v in mutated[-1].items() if k != "digest"}
        out = [json.dumps(r, ensure_ascii=ascii or i != index) for i, r in enumerate(mutated)]
        cases.append(Case(index + 1, path, label, out))

    for index, record in enumerate(records):
        paths: list[tuple[str, ...]] = [(key,) for key in record]
        paths += [
            (key, inner)
            for key, value in record.items()
            if isinstance(value, dict)
            for inner in value
        ]
        for path in paths:
            original = record[path[0]] if len(path) == 1 else record[path[0]][path[1]]
            for label, value, ascii in replacements(original):
                emit(index, path, label, _with(record, path, value), ascii)
            emit(index, path, "left out", _without(record, path), True)
        holders: list[tuple[str, ...]] = [
            (),
            *((k,) for k, v in record.items() if isinstance(v, dict)),
        ]
        for path in holders:
            emit(
                index, (*path, "extra"), "an extra field", _with(record, (*path, "extra"), 1), True
            )
    return cases


def _with(record: dict[str, Any], path: tuple[str, ...], value: Any) -> dict[str, Any]:
    out = dict(record)
    if len(path) == 1:
        out[path[0]] = value
    else:
        out[path[0]] = {**out[path[0]], path[1]: value}
    return out


def _without(record: dict[str, Any], path: tuple[str, ...]) -> dict[str, Any]:
    out = dict(record)
    if len(path) == 1:
        del out[path[0]]
    else:
        out[path[0]] = {k: v for k, v in out[path[0]].items() if k != path[1]}
    return out


async def everything(raw: Redis) -> dict[str, tuple[Any, str]]:
    """What the whole (private) Redis holds: every key, its value and whether it expires."""
    keys = sorted([k.decode() async for k in raw.scan_iter(count=1_000)])
    states: dict[str, tuple[Any, str]] = await key_states(raw, keys)
    return states


async def reads_whole(store: ContextStore, session: str, scratch: str) -> None:
    """The session reads, views, checkpoints, rewinds and exports as one the store wrote."""
    messages = await store.get_messages(session)
    assert [m.message async for m in store.iter_history(session)] == messages
    await store.read(session, limit=3)
    info = await store.info(session)
    assert info.count == len(messages)
    await sound_views(store, session)
    points = await store.checkpoints(session)
    made = await store.checkpoint(session, name="after the import")
    lines = [line async for line in store.export_session(session)]
    [again] = await store.import_sessions(lines, session=scratch)
    assert again.status == "imported"
    assert await store.get_messages(scratch) == messages
    for point in reversed([*points, made]):
        if point.branch is None:
            await store.rewind(scratch, point.checkpoint_id)
            await sound_views(store, scratch)
    assert await store.delete_checkpoint(session, made.checkpoint_id)
    [line async for line in store.export_session(scratch)]


async def sound_views(store: ContextStore, session: str) -> None:
    """A roomy view and a tight one: no orphan tool call, no message sent twice."""
    for budget in (100_000, 300):
        try:
            view = await store.view(session, token_budget=budget)
        except BudgetExceededError:
            assert budget < 100_000
            continue
        paired(view.messages)
        sent = dumped(view)
        assert len(set(sent)) == len(sent), sent


@pytest.mark.parametrize("sealed", [False, True], ids=["clear", "sealed"])
async def test_every_mutation_of_every_field_is_refused_by_line_or_imports_whole(
    server: PrivateRedis, sealed: bool
) -> None:
    """Each mutated archive: MalformedArchiveError naming a line and nothing written, or whole."""
    keyring = {"encryption_keys": {"k1": Keyring.generate_key()}, "encryption_active_key": "k1"}
    settings = private_settings(
        server.url(),
        "hostile",
        summary_trigger_tokens=400,
        summary_keep_tokens=150,
        **(keyring if sealed else {}),
    )
    raw = Redis.from_url(server.url())
    failures: list[str] = []
    outcomes = {"imported": 0, "refused": 0}
    async with ContextStore.from_settings(settings, tenant="acme") as store:
        await rich_session(store, "s")
        lines = [line async for line in store.export_session("s")]
        assert any('"sealed"' in line for line in lines) == sealed
        cases = corpus(lines)
        # One target and one scratch session, deleted after each case: the Redis stays small.
        target, scratch = "c", "d"
        for case in cases if THOROUGH else cases[::5]:
            what = f"line {case.line} {'.'.join(case.path)} <- {case.label}"
            before = await everything(raw)
            try:
                results = await store.import_sessions(case.lines, session=target)
            except MalformedArchiveError as refused:
                outcomes["refused"] += 1
                if not 1 <= refused.line <= len(case.lines):
                    failures.append(f"{what}: refused naming line {refused.line}")
                if await everything(raw) != before:
                    failures.append(f"{what}: refused, but Redis changed")
                continue
            except Exception as exc:  # noqa: BLE001 - each failure is reported, all at once
                failures.append(f"{what}: {type(exc).__name__}: {exc}")
                continue
            outcomes["imported"] += 1
            try:
                assert [r.status for r in results] == ["imported"], results
                await reads_whole(store, target, scratch)
            except Exception as exc:  # noqa: BLE001
                failures.append(f"{what}: imported, then {type(exc).__name__}: {exc}")
            await store.delete(target)
            await store.delete(scratch)
    await raw.aclose()
    print(f"{'sealed' if sealed else 'clear'}: {outcomes}")  # the count, under -s
    assert not failures, f"{len(failures)} of {sum(outcomes.values())}:\n" + "\n".join(
        failures[:40]
    )
    assert outcomes["imported"] > 0 and outcomes["refused"] > 0, outcomes
