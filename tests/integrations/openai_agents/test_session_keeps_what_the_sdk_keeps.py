"""What the SDK's own sessions keep, a CtxstoreSession keeps, and it fails as they fail.

Items with neither a role nor a type, and ``message`` items with no role, which
SQLiteSession stores as they are, come back equal from every read; settings the SDK
does not know raise its ``TypeError`` (an ``InvalidInputError`` too).
"""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("agents")

from agents import SQLiteSession

from ctxstore import InvalidInputError, InvalidMessageError
from ctxstore.integrations.openai_agents import HELD, SessionSettingsError

ROLELESS: list[Any] = [
    {"content": "hi"},
    {"type": "message", "content": "test"},
    {"id": "msg-1", "type": "message", "content": [{"type": "input_text", "text": "x"}]},
    {"type": HELD, "item": {"role": "user", "content": "a caller's own item of that type"}},
    {"type": 7, "content": "a type that is no string"},
]
"""Items the SDK's sessions store that name no role ctxstore knows them by."""


async def test_items_with_no_role_come_back_equal_from_every_read(new_session: Any) -> None:
    """Role-less items, among messages, come back as given: all, limited, popped, viewed."""
    session = new_session("roleless")
    items = [{"role": "user", "content": "first"}, *ROLELESS, {"role": "user", "content": "last"}]
    await session.add_items(items)
    assert await session.get_items() == items
    assert await session.get_items(limit=3) == items[-3:]
    view = await session.get_view(10_000)
    assert [item for item in view if item in items] == items
    assert await session.pop_item() == items[-1]
    assert await session.pop_item() == items[-2]
    assert await session.get_items() == items[:-2]


async def test_a_message_of_the_holding_type_it_did_not_write_comes_back_as_it_is(
    new_session: Any,
) -> None:
    """Written by another writer of the session: no None item, nothing unwrapped, pop pops it."""
    session = new_session("foreign")
    foreign = [
        {"type": HELD},
        {"type": HELD, "item": "not an item"},
        {"type": HELD, "item": {"role": "system", "content": "x"}, "extra": 1},
    ]
    await session.store.append_many(session.store_session_id, foreign)
    assert await session.get_items() == foreign
    assert await session.pop_item() == foreign[-1]
    assert await session.get_items() == foreign[:-1]


async def test_they_are_what_the_sdks_own_session_keeps(new_session: Any) -> None:
    """The same items in SQLiteSession and in a CtxstoreSession read back the same."""
    reference = SQLiteSession("roleless", ":memory:")
    try:
        await reference.add_items(ROLELESS)
        expected = await reference.get_items()
    finally:
        reference.close()
    session = new_session("roleless")
    await session.add_items(ROLELESS)
    assert await session.get_items() == expected


async def test_a_malformed_tool_item_is_still_refused_whole(new_session: Any) -> None:
    """A function call with no call_id is refused with a role-less item beside it: none lands."""
    session = new_session("refused")
    with pytest.raises(InvalidMessageError, match="call_id"):
        await session.add_items([{"content": "hi"}, {"type": "function_call", "name": "f"}])
    assert await session.get_items() == []


@pytest.mark.parametrize(
    ("given", "words"),
    [
        ({"limitt": 1}, "Unknown session settings: limitt"),
        ("limit=1", "session must be a SessionSettings instance or a dict, got str"),
    ],
)
def test_settings_the_sdk_refuses_raise_its_type_error(
    new_session: Any, given: object, words: str
) -> None:
    """A misspelt setting, or no settings at all: a TypeError that is an InvalidInputError."""
    with pytest.raises(SessionSettingsError, match=words) as refused:
        new_session("settings", session_settings=given)
    assert isinstance(refused.value, TypeError)
    assert isinstance(refused.value, InvalidInputError)


async def test_settings_set_as_a_dict_later_still_apply(new_session: Any) -> None:
    """session_settings replaced by a dict after construction: its limit applies, as the SDK's."""
    session = new_session("later")
    await session.add_items([{"role": "user", "content": str(i)} for i in range(5)])
    session.session_settings = {"limit": 2}
    assert [item["content"] for item in await session.get_items()] == ["3", "4"]
