"""A scripted agent's turns give the same model inputs and history on ctxstore as on SQLite.

The SDK's Runner drives one script twice, once with a CtxstoreSession and once with the
SDK's own in-memory ``SQLiteSession(":memory:")``: several turns with a reasoning item,
parallel tool calls, a tool that fails and one whose result is large, by ``Runner.run``,
``run_streamed`` and ``run_sync`` (in a thread, while the test's event loop runs). Each
model call must get the same input from both sessions, and both must end with the same
history.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

pytest.importorskip("agents")

from agents import Agent, Runner, SQLiteSession, function_tool
from agents.testing import ScriptedModel, assistant_message, function_call
from openai.types.responses import ResponseReasoningItem
from openai.types.responses.response_reasoning_item import Summary
from support.helpers import paired

LARGE = 200_000
"""Characters in the large tool result (a fifth of the store's largest message)."""


@function_tool
def read_file(path: str) -> str:
    """Read a file of the repository."""
    if path == "big.log":
        return "log line\n" * (LARGE // 9)
    return f"contents of {path}"


@function_tool
def run_tests(suite: str) -> str:
    """Run a test suite."""
    raise RuntimeError(f"the {suite} suite crashed")


def reasoning(item_id: str, text: str) -> ResponseReasoningItem:
    """A reasoning item as the Responses API returns one (its content encrypted)."""
    return ResponseReasoningItem(
        id=item_id,
        type="reasoning",
        summary=[Summary(text=text, type="summary_text")],
        encrypted_content=f"gAAAA-{item_id}",
    )


def script() -> list[list[Any]]:
    """The model's answers, one list per model call, for the turns of :data:`TURNS`."""
    return [
        [
            reasoning("rs_1", "Read both files at once."),
            function_call("read_file", {"path": "main.py"}, call_id="call_a"),
            function_call("read_file", {"path": "big.log"}, call_id="call_b"),
        ],
        [assistant_message("main.py prints; big.log is long.", item_id="msg_1")],
        [
            reasoning("rs_2", "Run the unit suite."),
            function_call("run_tests", {"suite": "unit"}, call_id="call_c"),
        ],
        [assistant_message("The unit suite crashed.", item_id="msg_2")],
        [
            function_call("read_file", {"path": "a.py"}, call_id="call_d"),
            function_call("read_file", {"path": "b.py"}, call_id="call_e"),
            function_call("read_file", {"path": "c.py"}, call_id="call_f"),
        ],
        [assistant_message("Three files read.", item_id="msg_3")],
        [assistant_message("Done.", item_id="msg_4")],
    ]


TURNS = [
    ("run", "What is in main.py and big.log?"),
    ("run_streamed", "Do the tests pass?"),
    ("run_sync", "Read a.py, b.py and c.py."),
    ("run", "Anything else?"),
]
"""Each turn: the Runner method, and the user's input."""


def _run_sync(agent: Agent[Any], text: str, session: Any) -> Any:
    """``Runner.run_sync`` on a loop of this thread's own (what a sync caller does)."""
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    try:
        return Runner.run_sync(agent, text, session=session)
    finally:
        asyncio.set_event_loop(None)
        loop.close()


async def converse(session: Any) -> tuple[list[list[Any]], list[Any]]:
    """Run :data:`TURNS` on ``session``: each model call's input, and the history after."""
    model = ScriptedModel(script())
    agent = Agent(name="dev", model=model, tools=[read_file, run_tests])
    for method, text in TURNS:
        if method == "run":
            await Runner.run(agent, text, session=session)
        elif method == "run_streamed":
            streamed = Runner.run_streamed(agent, text, session=session)
            async for _ in streamed.stream_events():
                pass
        else:
            await asyncio.to_thread(_run_sync, agent, text, session)
    model.assert_complete()
    return [list(call.input) for call in model.calls], await session.get_items()


async def test_every_model_input_and_the_history_match_the_sdks_own_session(
    new_session: Any,
) -> None:
    """Each model call's input, and the history stored, equal the SDK's SQLiteSession's."""
    reference = SQLiteSession("dev", ":memory:")
    try:
        expected_inputs, expected_history = await converse(reference)
    finally:
        reference.close()
    inputs, history = await converse(new_session("dev"))

    assert len(inputs) == len(script())
    for index, (got, expected) in enumerate(zip(inputs, expected_inputs, strict=True)):
        assert got == expected, f"model call {index}"
    assert history == expected_history
    assert paired(history) == 6  # every call with its output, the failing one's too

    outputs = {item["call_id"]: item["output"] for item in history if "output" in item}
    assert len(outputs["call_b"]) >= LARGE - 9  # the large result whole
    assert outputs["call_c"].startswith("An error occurred while running the tool")
    kinds = [item.get("type") or item.get("role") for item in history]
    assert kinds[:7] == [  # the first turn: both calls made at once, then both outputs
        "user",
        "reasoning",
        "function_call",
        "function_call",
        "function_call_output",
        "function_call_output",
        "message",
    ]
    assert kinds.count("reasoning") == 2 and kinds.count("user") == len(TURNS)
    assert json.loads(history[3]["arguments"]) == {"path": "big.log"}
