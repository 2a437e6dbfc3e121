"""The SDK's soft-cancel tests that keep a session, on a CtxstoreSession.

Origin: openai/openai-agents-python, tests/test_soft_cancel.py, at commit
7f7a44f8dc0650296bd5ab6c745c9bcbaa6ac3b7 (main, version 0.22.0: the newest the
snapshot holds; the installed SDK is 0.24.0, whose tests it does not hold): the
three tests there that keep their history in a ``SQLiteSession``.

Ported as they are; only the session under test is built otherwise
(``new_session(...)`` for ``SQLiteSession(...)``, see conftest.py).
"""

from __future__ import annotations

import pytest

pytest.importorskip("agents")

from agents import Agent, Runner
from agents.testing import ScriptedModel
from sdk_responses import get_function_tool, get_function_tool_call, get_text_message


async def test_soft_cancel_saves_session(new_session):
    """A soft cancel after the first item leaves the turn stored, and the session resumes."""
    model = ScriptedModel([[], []])
    agent = Agent(name="Assistant", model=model)

    session = new_session("test_soft_cancel_session")
    await session.clear_session()  # Start fresh

    result = Runner.run_streamed(agent, input="Hello", session=session)

    async for event in result.stream_events():
        if event.type == "run_item_stream_event":
            result.cancel(mode="after_turn")

    # Check session has the turn
    items = await session.get_items()
    assert len(items) > 0, "Session should have saved items from completed turn"

    # Verify we can resume
    result2 = await Runner.run(agent, "Continue", session=session)
    assert result2.final_output is not None

    # Cleanup
    await session.clear_session()


async def test_soft_cancel_with_handoff(new_session):
    """A soft cancel right after a handoff leaves the handoff turn stored."""
    from agents import Handoff

    model = ScriptedModel()

    # Create two agents with handoff
    agent2 = Agent(name="Agent2", model=model)

    async def on_invoke_handoff(context, data):
        return agent2

    agent1 = Agent(
        name="Agent1",
        model=model,
        handoffs=[
            Handoff(
                tool_name=Handoff.default_tool_name(agent2),
                tool_description=Handoff.default_tool_description(agent2),
                input_json_schema={},
                on_invoke_handoff=on_invoke_handoff,
                agent_name=agent2.name,
            )
        ],
    )

    # Setup: Agent1 does handoff, Agent2 responds
    model.extend(
        [
            # Agent1's turn - triggers handoff
            [get_function_tool_call(Handoff.default_tool_name(agent2), "{}")],
            # Agent2's turn after handoff
            [get_text_message("Agent2 response")],
        ]
    )

    session = new_session("test_soft_cancel_handoff")
    await session.clear_session()

    result = Runner.run_streamed(agent1, input="Hello", session=session)

    handoff_seen = False
    async for event in result.stream_events():
        if event.type == "run_item_stream_event" and event.name == "handoff_requested":
            handoff_seen = True
            # Cancel right after handoff
            result.cancel(mode="after_turn")

    assert handoff_seen, "Handoff should have occurred"

    # Verify session has items from the handoff turn
    items = await session.get_items()
    assert len(items) > 0, "Session should have saved the handoff turn"

    # Cleanup
    await session.clear_session()


async def test_soft_cancel_with_session_and_multiple_turns(new_session):
    """A soft cancel after the second tool turn leaves both turns stored."""
    model = ScriptedModel()
    agent = Agent(
        name="Assistant",
        model=model,
        tools=[get_function_tool("tool1", "result1")],
    )

    session = new_session("test_soft_cancel_multi")
    await session.clear_session()

    # Setup 3 turns
    model.extend(
        [
            [get_function_tool_call("tool1", "{}", call_id="tool_1")],
            [get_function_tool_call("tool1", "{}", call_id="tool_2")],
            [get_text_message("Final")],
        ]
    )

    result = Runner.run_streamed(agent, input="Hello", session=session)

    turns_seen = 0
    async for event in result.stream_events():
        if event.type == "run_item_stream_event" and event.name == "tool_output":
            turns_seen += 1
            if turns_seen == 2:
                result.cancel(mode="after_turn")

    # Should have completed 2 turns
    assert turns_seen == 2

    # Check session has both turns
    items = await session.get_items()
    assert len(items) > 0

    # Cleanup
    await session.clear_session()
