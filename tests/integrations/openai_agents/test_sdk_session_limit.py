"""The SDK's session limit tests, on a CtxstoreSession.

Origin: openai/openai-agents-python, tests/memory/test_session_limit.py, at commit
7f7a44f8dc0650296bd5ab6c745c9bcbaa6ac3b7 (main, version 0.22.0: the newest the
snapshot holds; the installed SDK is 0.24.0, whose tests it does not hold).

Ported as they are, by every Runner method (``run_sync`` in a thread with an event
loop of its own, while the test's loop lives); only the session under test is built
otherwise (``new_session(...)`` for ``SQLiteSession(...)``, see conftest.py), its
temporary directory dropped, and its ``close()`` left to the fixture.
"""

from __future__ import annotations

from typing import cast

import pytest

pytest.importorskip("agents")

from agents import Agent, RunConfig
from agents.items import TResponseInputItem
from agents.memory import SessionSettings
from agents.testing import ScriptedModel
from sdk_responses import get_text_message
from test_sdk_session import run_agent_async


@pytest.mark.parametrize("runner_method", ["run", "run_sync", "run_streamed"])
async def test_session_limit_parameter(runner_method, new_session):
    """RunConfig's session limit bounds the history a run sends, by every Runner method."""
    session_id = "limit_test"
    session = new_session(session_id)

    model = ScriptedModel()
    agent = Agent(name="test", model=model)

    # Build up a longer conversation history
    model.enqueue([get_text_message("Reply 1")])
    await run_agent_async(runner_method, agent, "Message 1", session=session)

    model.enqueue([get_text_message("Reply 2")])
    await run_agent_async(runner_method, agent, "Message 2", session=session)

    model.enqueue([get_text_message("Reply 3")])
    await run_agent_async(runner_method, agent, "Message 3", session=session)

    # Verify we have 6 items in total (3 user + 3 assistant)
    all_items = await session.get_items()
    assert len(all_items) == 6

    # Test session_limit via RunConfig - should only get last 2 history items + new input
    model.enqueue([get_text_message("Reply 4")])
    await run_agent_async(
        runner_method,
        agent,
        "Message 4",
        session=session,
        run_config=RunConfig(session_settings=SessionSettings(limit=2)),
    )

    # Verify model received limited history
    last_input = model.calls[-1].input
    # Should have: 2 history items + 1 new message = 3 total
    assert len(last_input) == 3
    # First item should be "Message 3" (not Message 1 or 2)
    assert last_input[0].get("content") == "Message 3"
    # Assistant message has content as a list
    assert last_input[1].get("content")[0]["text"] == "Reply 3"
    assert last_input[2].get("content") == "Message 4"


@pytest.mark.parametrize("runner_method", ["run", "run_sync", "run_streamed"])
async def test_session_limit_drops_unmatched_history_function_call_output(
    runner_method, new_session
):
    """A limit boundary must not pass an output whose matching call was excluded."""
    session = new_session("limit_tool_pair")
    history = cast(
        list[TResponseInputItem],
        [
            {"role": "user", "content": "What is the weather?"},
            {
                "type": "function_call",
                "call_id": "call_1",
                "name": "get_weather",
                "arguments": "{}",
            },
            {
                "type": "function_call_output",
                "call_id": "call_1",
                "output": "sunny",
            },
            {
                "type": "message",
                "role": "assistant",
                "content": [
                    {
                        "type": "output_text",
                        "text": "It is sunny.",
                        "annotations": [],
                    }
                ],
            },
        ],
    )
    await session.add_items(history)

    assert await session.get_items(limit=2) == history[-2:]

    model = ScriptedModel()
    model.enqueue([get_text_message("Tomorrow is sunny too.")])
    agent = Agent(name="test", model=model)

    await run_agent_async(
        runner_method,
        agent,
        "What about tomorrow?",
        session=session,
        run_config=RunConfig(session_settings=SessionSettings(limit=2)),
    )

    assert model.calls[-1].input == [
        history[-1],
        {"role": "user", "content": "What about tomorrow?"},
    ]


@pytest.mark.parametrize("runner_method", ["run", "run_sync", "run_streamed"])
async def test_session_limit_zero(runner_method, new_session):
    """A session limit of 0 sends no history, only the new message."""
    session_id = "limit_zero_test"
    session = new_session(session_id)

    model = ScriptedModel()
    agent = Agent(name="test", model=model)

    # Build conversation history
    model.enqueue([get_text_message("Reply 1")])
    await run_agent_async(runner_method, agent, "Message 1", session=session)

    model.enqueue([get_text_message("Reply 2")])
    await run_agent_async(runner_method, agent, "Message 2", session=session)

    # Test with limit=0 - should get NO history, just new message
    model.enqueue([get_text_message("Reply 3")])
    await run_agent_async(
        runner_method,
        agent,
        "Message 3",
        session=session,
        run_config=RunConfig(session_settings=SessionSettings(limit=0)),
    )

    # Verify model received only the new message
    last_input = model.calls[-1].input
    assert len(last_input) == 1
    assert last_input[0].get("content") == "Message 3"


@pytest.mark.parametrize("runner_method", ["run", "run_sync", "run_streamed"])
async def test_session_limit_none_gets_all_history(runner_method, new_session):
    """A session limit of None sends the whole history (the default)."""
    session_id = "limit_none_test"
    session = new_session(session_id)

    model = ScriptedModel()
    agent = Agent(name="test", model=model)

    # Build longer conversation
    for i in range(1, 6):
        model.enqueue([get_text_message(f"Reply {i}")])
        await run_agent_async(runner_method, agent, f"Message {i}", session=session)

    # Verify 10 items in session (5 user + 5 assistant)
    all_items = await session.get_items()
    assert len(all_items) == 10

    # Test with session_limit=None (default) - should get all history
    model.enqueue([get_text_message("Reply 6")])
    await run_agent_async(
        runner_method,
        agent,
        "Message 6",
        session=session,
        run_config=RunConfig(session_settings=SessionSettings(limit=None)),
    )

    # Verify model received all history + new message
    last_input = model.calls[-1].input
    assert len(last_input) == 11  # 10 history + 1 new
    assert last_input[0].get("content") == "Message 1"
    assert last_input[-1].get("content") == "Message 6"


@pytest.mark.parametrize("runner_method", ["run", "run_sync", "run_streamed"])
async def test_session_limit_larger_than_history(runner_method, new_session):
    """A session limit larger than the history sends all of it."""
    session_id = "limit_large_test"
    session = new_session(session_id)

    model = ScriptedModel()
    agent = Agent(name="test", model=model)

    # Build small conversation
    model.enqueue([get_text_message("Reply 1")])
    await run_agent_async(runner_method, agent, "Message 1", session=session)

    # Test with limit=100 (much larger than actual history)
    model.enqueue([get_text_message("Reply 2")])
    await run_agent_async(
        runner_method,
        agent,
        "Message 2",
        session=session,
        run_config=RunConfig(session_settings=SessionSettings(limit=100)),
    )

    # Verify model received all available history + new message
    last_input = model.calls[-1].input
    assert len(last_input) == 3  # 2 history + 1 new
    assert last_input[0].get("content") == "Message 1"
    # Assistant message has content as a list
    assert last_input[1].get("content")[0]["text"] == "Reply 1"
    assert last_input[2].get("content") == "Message 2"
