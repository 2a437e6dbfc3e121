"""The SDK's runner tests that keep a session, on a CtxstoreSession.

Origin: openai/openai-agents-python, tests/test_agent_runner.py, at commit
7f7a44f8dc0650296bd5ab6c745c9bcbaa6ac3b7 (main, version 0.22.0: the newest the
snapshot holds; the installed SDK is 0.24.0, whose tests it does not hold): every
test there that keeps its history in a ``SQLiteSession`` or a ``SimpleListSession``
(the SDK's in-memory test double) and reads it only through the Session protocol,
with the helpers they use.

Ported as they are: each assertion and runner call is the SDK's (``run_sync`` in a
test with no event loop, then ``asyncio.run`` on the same session); only the session
under test is built otherwise: ``new_session(...)`` for ``SQLiteSession(...)`` and
``SimpleListSession()``, and ``simple_session(new_session, history)``, which adds
the history first, for ``SimpleListSession(history=...)`` (see conftest.py). Left
out: the tests that read a test double's own lists (``saved_items``, ``pop_calls``),
and the in-memory variant of the retried-model test (its ``sqlite`` one is here).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any, cast
from unittest.mock import patch

import pytest

pytest.importorskip("agents")

import httpx
from agents import (
    Agent,
    GuardrailFunctionOutput,
    InputGuardrail,
    InputGuardrailTripwireTriggered,
    ModelRetrySettings,
    ModelSettings,
    OutputGuardrail,
    OutputGuardrailTripwireTriggered,
    RunConfig,
    RunContextWrapper,
    Runner,
    UserError,
    retry_policies,
)
from agents.items import (
    HandoffOutputItem,
    ModelResponse,
    RunItem,
    ToolCallOutputItem,
    TResponseInputItem,
)
from agents.memory import SessionSettings
from agents.run_internal import run_loop
from agents.run_internal.items import (
    TOOL_CALL_SESSION_DESCRIPTION_KEY,
    TOOL_CALL_SESSION_TITLE_KEY,
    fingerprint_input_item,
)
from agents.run_internal.run_steps import NextStepFinalOutput, SingleStepResult
from agents.run_internal.session_persistence import (
    persist_session_items_for_guardrail_trip,
    prepare_input_with_session,
    wait_for_session_cleanup,
)
from agents.run_state import RunState
from agents.testing import ScriptedModel
from agents.tool import function_tool
from agents.usage import Usage
from openai import APIConnectionError, NotFoundError
from openai.types.responses.response_reasoning_item import ResponseReasoningItem
from sdk_hitl import make_shell_call
from sdk_responses import (
    get_final_output_message,
    get_function_tool,
    get_function_tool_call,
    get_handoff_tool_call,
    get_text_input_item,
    get_text_message,
)

from ctxstore.integrations.openai_agents import CtxstoreSession


async def simple_session(new_session, history):
    """A CtxstoreSession holding ``history``: what ``SimpleListSession(history=...)`` was."""
    session = new_session("test")
    await session.add_items(history)
    return session


@pytest.fixture
def loops_closed_after() -> Iterator[None]:
    """Event loops made in the test are closed after it (``run_sync`` leaves its own open)."""
    made: list[asyncio.AbstractEventLoop] = []
    before = asyncio.get_event_loop_policy()

    class Recording(type(before)):  # type: ignore[misc]
        def new_event_loop(self) -> asyncio.AbstractEventLoop:
            loop = super().new_event_loop()
            made.append(loop)
            return loop

    asyncio.set_event_loop_policy(Recording())
    try:
        yield
    finally:
        asyncio.set_event_loop_policy(before)
        for loop in made:
            if not loop.is_closed():
                loop.close()


class _DummyRunItem:
    def __init__(self, payload: dict[str, Any], item_type: str = "tool_call_output_item"):
        self._payload = payload
        self.type = item_type

    def to_input_item(self) -> dict[str, Any]:
        return self._payload


class _RevokedReasoningIdModel(ScriptedModel):
    """ScriptedModel that 404s like the Responses API when a revoked reasoning ID is replayed."""

    def __init__(self) -> None:
        super().__init__()
        self.revoked_reasoning_ids: set[str] = set()

    async def get_response(
        self,
        system_instructions: str | None,
        input: str | list[TResponseInputItem],
        *args: Any,
        **kwargs: Any,
    ) -> ModelResponse:
        if isinstance(input, list):
            for item in input:
                if not isinstance(item, dict) or item.get("type") != "reasoning":
                    continue
                item_id = item.get("id")
                if item_id in self.revoked_reasoning_ids:
                    message = f"Item with id '{item_id}' not found."
                    body = {"error": {"message": message, "type": "invalid_request_error"}}
                    raise NotFoundError(
                        message,
                        response=httpx.Response(
                            404,
                            request=httpx.Request("POST", "https://api.openai.com/v1/responses"),
                            json=body,
                        ),
                        body=body,
                    )
        return await super().get_response(system_instructions, input, *args, **kwargs)


def _find_reasoning_input_item(
    items: str | list[TResponseInputItem] | Any,
) -> dict[str, Any] | None:
    if not isinstance(items, list):
        return None
    for item in items:
        if isinstance(item, dict) and item.get("type") == "reasoning":
            return cast(dict[str, Any], item)
    return None


async def test_omit_policy_strips_reasoning_ids_already_stored_in_the_session(new_session) -> None:
    """The `omit` reasoning id policy also strips ids the session stored before it was set."""
    model = _RevokedReasoningIdModel()
    specialist = Agent(name="specialist", model=model)
    triage = Agent(name="triage", model=model, handoffs=[specialist])

    session = new_session("issue-2020")

    # Turn 1 predates the mitigation, so the session records the reasoning ID.
    model.extend(
        [
            [
                ResponseReasoningItem(id="rs_triage", type="reasoning", summary=[]),
                get_handoff_tool_call(specialist),
            ],
            [get_text_message("handled")],
        ]
    )
    first = await Runner.run(triage, input="hello", session=session)
    assert first.final_output == "handled"
    stored_reasoning = _find_reasoning_input_item(await session.get_items())
    assert stored_reasoning is not None
    assert stored_reasoning.get("id") == "rs_triage"

    # The server no longer resolves that reasoning item.
    model.revoked_reasoning_ids.add("rs_triage")

    # Turn 2 opts into the documented mitigation for this failure.
    model.extend([[get_text_message("done")]])
    second = await Runner.run(
        triage,
        input="anything else?",
        session=session,
        run_config=RunConfig(reasoning_item_id_policy="omit"),
    )

    assert second.final_output == "done"
    replayed_reasoning = _find_reasoning_input_item(model.calls[-1].input)
    assert replayed_reasoning is not None
    assert "id" not in replayed_reasoning


async def test_nested_handoff_filters_model_input_but_preserves_session_items(new_session):
    """A nested handoff's input filter changes the model's input, not the stored items."""
    model = ScriptedModel()
    delegate = Agent(
        name="delegate",
        model=model,
    )
    triage = Agent(
        name="triage",
        model=model,
        handoffs=[delegate],
        tools=[get_function_tool("some_function", "result")],
    )

    model.extend(
        [
            # First turn: a tool call.
            [get_function_tool_call("some_function", json.dumps({"a": "b"}))],
            # Second turn: a message and a handoff.
            [get_text_message("a_message"), get_handoff_tool_call(delegate)],
            # Third turn: final message.
            [get_text_message("done")],
        ]
    )

    model_input_types: list[list[str]] = []

    def capture_model_input(data):
        types: list[str] = []
        for item in data.model_data.input:
            if isinstance(item, dict):
                item_type = item.get("type")
                if isinstance(item_type, str):
                    types.append(item_type)
        model_input_types.append(types)
        return data.model_data

    session = new_session("test")
    result = await Runner.run(
        triage,
        input="user_message",
        run_config=RunConfig(
            nest_handoff_history=True,
            call_model_input_filter=capture_model_input,
        ),
        session=session,
    )

    assert result.final_output == "done"
    assert len(model_input_types) >= 3
    handoff_input_types = model_input_types[2]
    assert "function_call" not in handoff_input_types
    assert "function_call_output" not in handoff_input_types

    assert any(isinstance(item, ToolCallOutputItem) for item in result.new_items)
    assert any(isinstance(item, HandoffOutputItem) for item in result.new_items)

    session_items = await session.get_items()
    has_function_call_output = any(
        isinstance(item, dict) and item.get("type") == "function_call_output"
        for item in session_items
    )
    assert has_function_call_output


async def test_input_guardrail_tripwire_does_not_save_assistant_message_to_session(new_session):
    """An input guardrail's tripwire leaves the user's input in the session and no answer."""

    async def guardrail_function(
        context: RunContextWrapper[Any], agent: Agent[Any], input: Any
    ) -> GuardrailFunctionOutput:
        # Delay to ensure the agent has time to produce output before the guardrail finishes.
        await asyncio.sleep(0.01)
        return GuardrailFunctionOutput(
            output_info=None,
            tripwire_triggered=True,
        )

    session = new_session("test")

    model = ScriptedModel()
    model.enqueue([get_text_message("should_not_be_saved")])

    agent = Agent(
        name="test",
        model=model,
        input_guardrails=[InputGuardrail(guardrail_function=guardrail_function)],
    )

    with pytest.raises(InputGuardrailTripwireTriggered):
        await Runner.run(agent, input="user_message", session=session)

    items = await session.get_items()

    assert len(items) == 1
    first_item = cast(dict[str, Any], items[0])
    assert "role" in first_item
    assert first_item["role"] == "user"


async def test_prepare_input_with_session_keeps_orphan_output_without_limit(new_session):
    """Without a limit, a history output whose call is missing is sent as stored."""
    history_item = cast(
        TResponseInputItem,
        {
            "type": "function_call_output",
            "call_id": "call_prepare",
            "output": "ok",
        },
    )
    session = await simple_session(new_session, [history_item])

    prepared_input, session_items = await prepare_input_with_session("hello", session, None)

    assert prepared_input == [history_item, {"role": "user", "content": "hello"}]
    assert session_items == [{"role": "user", "content": "hello"}]


async def test_prepare_input_with_session_drops_limited_orphan_history_function_call_outputs(
    new_session,
):
    """A limit that cuts a call from its output drops the output from the input."""
    history_item = cast(
        TResponseInputItem,
        {
            "type": "function_call_output",
            "call_id": "call_prepare",
            "output": "ok",
        },
    )
    session = await simple_session(new_session, [history_item])

    prepared_input, session_items = await prepare_input_with_session(
        "hello",
        session,
        None,
        SessionSettings(limit=1),
    )

    assert prepared_input == [{"role": "user", "content": "hello"}]
    assert session_items == [{"role": "user", "content": "hello"}]


async def test_prepare_input_with_session_preserves_new_function_call_outputs(new_session):
    """New function call outputs are kept in the input and the items to store."""
    new_output = cast(
        TResponseInputItem,
        {
            "type": "function_call_output",
            "call_id": "call_prepare",
            "output": "ok",
        },
    )
    session = new_session("test")

    prepared_input, session_items = await prepare_input_with_session(
        [new_output],
        session,
        None,
        SessionSettings(limit=1),
    )

    assert prepared_input == [new_output]
    assert session_items == [new_output]


async def test_prepare_input_with_session_leaves_custom_callback_output_unchanged(new_session):
    """What a session_input_callback returns is the input, unchanged."""
    history_output = cast(
        TResponseInputItem,
        {
            "type": "function_call_output",
            "call_id": "call_callback",
            "output": "ok",
        },
    )
    session = await simple_session(new_session, [history_output])

    def callback(
        history: list[TResponseInputItem], new_input: list[TResponseInputItem]
    ) -> list[TResponseInputItem]:
        return history + new_input

    prepared_input, session_items = await prepare_input_with_session(
        "hello",
        session,
        callback,
        SessionSettings(limit=1),
    )

    assert prepared_input == [history_output, {"role": "user", "content": "hello"}]
    assert session_items == [{"role": "user", "content": "hello"}]


async def test_prepare_input_with_session_drops_output_for_program_owned_call_pruned_with_parent(
    new_session,
):
    """An output whose program-owned call was pruned with its program is dropped."""
    program = cast(
        TResponseInputItem,
        {
            "type": "program",
            "call_id": "program_orphan",
            "code": "return await tools.lookup({});",
            "fingerprint": "fingerprint:orphan",
        },
    )
    function_call = cast(
        TResponseInputItem,
        {
            "type": "function_call",
            "call_id": "call_orphan",
            "name": "lookup",
            "arguments": "{}",
            "caller": {"type": "program", "caller_id": "program_orphan"},
        },
    )
    function_output = cast(
        TResponseInputItem,
        {
            "type": "function_call_output",
            "call_id": "call_orphan",
            "output": "ok",
        },
    )
    session = await simple_session(new_session, [program, function_call, function_output])

    prepared_input, session_items = await prepare_input_with_session(
        "hello",
        session,
        None,
        SessionSettings(limit=3),
    )

    assert prepared_input == [{"role": "user", "content": "hello"}]
    assert session_items == [{"role": "user", "content": "hello"}]


async def test_prepare_input_with_session_keeps_paired_history_function_call_outputs(new_session):
    """A history call and its output are both sent."""
    function_call = cast(
        TResponseInputItem,
        {
            "type": "function_call",
            "call_id": "call_prepare",
            "name": "lookup",
            "arguments": "{}",
        },
    )
    function_call_output = cast(
        TResponseInputItem,
        {
            "type": "function_call_output",
            "call_id": "call_prepare",
            "output": "ok",
        },
    )
    session = await simple_session(new_session, [function_call, function_call_output])

    prepared_input, session_items = await prepare_input_with_session(
        "hello",
        session,
        None,
        SessionSettings(limit=2),
    )

    assert prepared_input == [
        function_call,
        function_call_output,
        {"role": "user", "content": "hello"},
    ]
    assert session_items == [{"role": "user", "content": "hello"}]


async def test_prepare_input_with_session_prefers_latest_function_call_output(new_session):
    """A new output for a call replaces the history's output of that call."""
    history_output = cast(
        TResponseInputItem,
        {
            "type": "function_call_output",
            "call_id": "call_latest",
            "output": "history-output",
        },
    )
    session = await simple_session(new_session, [history_output])
    latest_output = cast(
        TResponseInputItem,
        {
            "type": "function_call_output",
            "call_id": "call_latest",
            "output": "new-output",
        },
    )

    prepared_input, session_items = await prepare_input_with_session([latest_output], session, None)

    assert isinstance(prepared_input, list)
    prepared_outputs = [
        cast(dict[str, Any], item)
        for item in prepared_input
        if isinstance(item, dict)
        and item.get("type") == "function_call_output"
        and item.get("call_id") == "call_latest"
    ]
    assert len(prepared_outputs) == 1
    assert prepared_outputs[0]["output"] == "new-output"
    assert len(session_items) == 1
    assert cast(dict[str, Any], session_items[0])["output"] == "new-output"


async def test_prepare_input_with_session_drops_orphan_function_calls(new_session):
    """A history call with no output is dropped from the input."""
    orphan_call = cast(
        TResponseInputItem,
        {
            "type": "function_call",
            "call_id": "orphan_call",
            "name": "tool_orphan",
            "arguments": "{}",
        },
    )
    session = await simple_session(new_session, [orphan_call])

    prepared_input, session_items = await prepare_input_with_session("hello", session, None)

    assert isinstance(prepared_input, list)
    assert len(session_items) == 1
    assert not any(
        isinstance(item, dict)
        and item.get("type") == "function_call"
        and item.get("call_id") == "orphan_call"
        for item in prepared_input
    )
    assert any(
        isinstance(item, dict) and item.get("role") == "user" and item.get("content") == "hello"
        for item in prepared_input
    )


async def test_prepare_input_with_session_preserves_pending_new_shell_calls(new_session) -> None:
    """A new pending shell call is kept in the input and the items to store."""
    orphan_call = cast(
        TResponseInputItem,
        {
            "type": "function_call",
            "call_id": "orphan_call",
            "name": "tool_orphan",
            "arguments": "{}",
        },
    )
    pending_shell_call = cast(
        TResponseInputItem,
        make_shell_call("manual_shell", id_value="shell_1", commands=["echo hi"]),
    )
    session = await simple_session(new_session, [orphan_call])

    prepared_input, session_items = await prepare_input_with_session(
        [pending_shell_call],
        session,
        None,
    )

    assert isinstance(prepared_input, list)
    assert session_items == [pending_shell_call]
    assert not any(
        isinstance(item, dict)
        and item.get("type") == "function_call"
        and item.get("call_id") == "orphan_call"
        for item in prepared_input
    )
    assert any(
        isinstance(item, dict)
        and item.get("type") == "shell_call"
        and item.get("call_id") == "manual_shell"
        for item in prepared_input
    )


async def test_prepare_input_with_session_uses_sync_callback(new_session):
    """A sync session_input_callback gets the history and the new input."""
    history_item = cast(TResponseInputItem, {"role": "user", "content": "hi"})
    session = await simple_session(new_session, [history_item])

    def callback(
        history: list[TResponseInputItem], new_input: list[TResponseInputItem]
    ) -> list[TResponseInputItem]:
        first = cast(dict[str, Any], history[0])
        assert first["role"] == "user"
        return history + new_input

    prepared, session_items = await prepare_input_with_session("second", session, callback)
    assert len(prepared) == 2
    last_item = cast(dict[str, Any], prepared[-1])
    assert last_item["role"] == "user"
    assert last_item.get("content") == "second"
    # session_items should contain only the new turn input
    assert len(session_items) == 1
    assert cast(dict[str, Any], session_items[0]).get("role") == "user"


async def test_prepare_input_with_session_awaits_async_callback(new_session):
    """An async session_input_callback is awaited."""
    history_item = cast(TResponseInputItem, {"role": "user", "content": "initial"})
    session = await simple_session(new_session, [history_item])

    async def callback(
        history: list[TResponseInputItem], new_input: list[TResponseInputItem]
    ) -> list[TResponseInputItem]:
        await asyncio.sleep(0)
        return history + new_input

    prepared, session_items = await prepare_input_with_session("later", session, callback)
    assert len(prepared) == 2
    first_item = cast(dict[str, Any], prepared[0])
    assert first_item["role"] == "user"
    assert first_item.get("content") == "initial"
    assert len(session_items) == 1
    assert cast(dict[str, Any], session_items[0]).get("role") == "user"


async def test_prepare_input_with_session_callback_drops_new_items(new_session):
    """New items a callback drops are not stored."""
    history_item = cast(TResponseInputItem, {"role": "user", "content": "history"})
    session = await simple_session(new_session, [history_item])

    def callback(
        history: list[TResponseInputItem], new_input: list[TResponseInputItem]
    ) -> list[TResponseInputItem]:
        _ = new_input
        return history

    prepared, session_items = await prepare_input_with_session("new", session, callback)
    assert prepared == [history_item]
    assert session_items == []


async def test_prepare_input_with_session_callback_reorders_new_items(new_session):
    """New items a callback reorders are stored in its order."""
    history_item = cast(TResponseInputItem, {"role": "user", "content": "history"})
    session = await simple_session(new_session, [history_item])

    def callback(
        history: list[TResponseInputItem], new_input: list[TResponseInputItem]
    ) -> list[TResponseInputItem]:
        return [new_input[1], history[0], new_input[0]]

    new_input = [get_text_input_item("first"), get_text_input_item("second")]
    prepared, session_items = await prepare_input_with_session(new_input, session, callback)

    assert cast(dict[str, Any], prepared[0]).get("content") == "second"
    assert cast(dict[str, Any], prepared[1]).get("content") == "history"
    assert cast(dict[str, Any], prepared[2]).get("content") == "first"
    assert [cast(dict[str, Any], item).get("content") for item in session_items] == [
        "second",
        "first",
    ]


async def test_prepare_input_with_session_callback_accepts_extra_items(new_session):
    """Extra items a callback adds are stored with the new input."""
    history_item = cast(TResponseInputItem, {"role": "user", "content": "history"})
    session = await simple_session(new_session, [history_item])
    extra_item = cast(TResponseInputItem, {"role": "assistant", "content": "extra"})

    def callback(
        history: list[TResponseInputItem], new_input: list[TResponseInputItem]
    ) -> list[TResponseInputItem]:
        return [extra_item, history[0], new_input[0]]

    prepared, session_items = await prepare_input_with_session("new", session, callback)

    assert [cast(dict[str, Any], item).get("content") for item in prepared] == [
        "extra",
        "history",
        "new",
    ]
    assert [cast(dict[str, Any], item).get("content") for item in session_items] == [
        "extra",
        "new",
    ]


async def test_prepare_input_with_session_ignores_callback_without_history(new_session):
    """New items a callback drops are still stored when asked to preserve them."""
    history_item = cast(TResponseInputItem, {"role": "user", "content": "history"})
    session = await simple_session(new_session, [history_item])

    def callback(
        history: list[TResponseInputItem], new_input: list[TResponseInputItem]
    ) -> list[TResponseInputItem]:
        _ = history
        _ = new_input
        return []

    prepared, session_items = await prepare_input_with_session(
        "new",
        session,
        callback,
        include_history_in_prepared_input=False,
        preserve_dropped_new_items=True,
    )

    assert [cast(dict[str, Any], item).get("content") for item in prepared] == ["new"]
    assert [cast(dict[str, Any], item).get("content") for item in session_items] == ["new"]


async def test_prepare_input_with_session_rejects_non_callable_callback(new_session):
    """A session_input_callback that is not callable is refused."""
    session = new_session("test")

    with pytest.raises(UserError, match="session_input_callback"):
        await prepare_input_with_session("hello", session, cast(Any, "bad_callback"))


async def test_prepare_input_with_session_rejects_non_list_callback_result(new_session):
    """A callback result that is not a list is refused."""
    session = new_session("test")

    def callback(history: list[TResponseInputItem], new_input: list[TResponseInputItem]) -> str:
        _ = history
        _ = new_input
        return "not-a-list"

    with pytest.raises(UserError, match="Session input callback must return a list"):
        await prepare_input_with_session("hello", session, cast(Any, callback))


async def test_prepare_input_with_session_matches_copied_items_by_content(new_session) -> None:
    """A history item a callback copies is matched by content: only the new one is stored."""
    history_item = cast(TResponseInputItem, {"role": "user", "content": "history"})
    session = await simple_session(new_session, [history_item])

    def callback(
        history: list[TResponseInputItem], new_input: list[TResponseInputItem]
    ) -> list[TResponseInputItem]:
        return [
            cast(TResponseInputItem, dict(cast(dict[str, Any], history[0]))),
            cast(TResponseInputItem, dict(cast(dict[str, Any], new_input[0]))),
        ]

    prepared, session_items = await prepare_input_with_session("new", session, callback)

    assert [cast(dict[str, Any], item).get("content") for item in prepared] == [
        "history",
        "new",
    ]
    assert [cast(dict[str, Any], item).get("content") for item in session_items] == ["new"]


async def test_prepare_input_with_session_repeated_history_keeps_equal_new_item(
    new_session,
) -> None:
    """A new item equal to a history item is still stored."""
    history_item = cast(TResponseInputItem, {"role": "user", "content": "same"})
    session = await simple_session(new_session, [history_item])

    def callback(
        history: list[TResponseInputItem], new_input: list[TResponseInputItem]
    ) -> list[TResponseInputItem]:
        return [history[0], history[0], new_input[0]]

    prepared, session_items = await prepare_input_with_session("same", session, callback)

    assert [cast(dict[str, Any], item).get("content") for item in prepared] == [
        "same",
        "same",
        "same",
    ]
    assert [cast(dict[str, Any], item).get("content") for item in session_items] == ["same"]


async def test_prepare_input_with_session_async_callback_moves_repeated_history_item(
    new_session,
) -> None:
    """A history item an async callback moves into the input is not stored again."""
    history_item = cast(TResponseInputItem, {"role": "user", "content": "history"})
    session = await simple_session(new_session, [history_item])

    async def callback(
        history: list[TResponseInputItem], new_input: list[TResponseInputItem]
    ) -> list[TResponseInputItem]:
        await asyncio.sleep(0)
        moved = history.pop(0)
        return [moved, new_input[0], moved]

    prepared, session_items = await prepare_input_with_session("new", session, callback)

    assert [cast(dict[str, Any], item).get("content") for item in prepared] == [
        "history",
        "new",
        "history",
    ]
    assert [cast(dict[str, Any], item).get("content") for item in session_items] == ["new"]


async def test_prepare_input_with_session_history_moved_to_new_input_stays_history(
    new_session,
) -> None:
    """A history item a callback moves into the new input stays history."""
    history_item = cast(TResponseInputItem, {"role": "user", "content": "history"})
    session = await simple_session(new_session, [history_item])

    def callback(
        history: list[TResponseInputItem], new_input: list[TResponseInputItem]
    ) -> list[TResponseInputItem]:
        moved = history.pop(0)
        new_input.insert(0, moved)
        return [*new_input, moved]

    prepared, session_items = await prepare_input_with_session("new", session, callback)

    assert [cast(dict[str, Any], item).get("content") for item in prepared] == [
        "history",
        "new",
        "history",
    ]
    assert [cast(dict[str, Any], item).get("content") for item in session_items] == ["new"]


async def test_prepare_input_with_session_callback_replaces_history_item(new_session) -> None:
    """A history item a callback replaces is not stored as new."""
    history_item = cast(TResponseInputItem, {"role": "user", "content": "history"})
    replacement = cast(TResponseInputItem, {"role": "user", "content": "summary"})
    session = await simple_session(new_session, [history_item])

    def callback(
        history: list[TResponseInputItem], new_input: list[TResponseInputItem]
    ) -> list[TResponseInputItem]:
        history[0] = replacement
        return history + new_input

    prepared, session_items = await prepare_input_with_session("new", session, callback)

    assert [cast(dict[str, Any], item).get("content") for item in prepared] == [
        "summary",
        "new",
    ]
    assert [cast(dict[str, Any], item).get("content") for item in session_items] == ["new"]


async def test_prepare_input_with_session_extra_reconstructed_history_item_stays_new(
    new_session,
) -> None:
    """An extra copy of a history item a callback adds is stored as new."""
    history_item = cast(TResponseInputItem, {"role": "user", "content": "history"})
    session = await simple_session(new_session, [history_item])

    def callback(
        history: list[TResponseInputItem], new_input: list[TResponseInputItem]
    ) -> list[TResponseInputItem]:
        rebuilt = cast(TResponseInputItem, dict(cast(dict[str, Any], history[0])))
        return [history[0], rebuilt, new_input[0]]

    _, session_items = await prepare_input_with_session("new", session, callback)

    assert [cast(dict[str, Any], item).get("content") for item in session_items] == [
        "history",
        "new",
    ]


async def test_prepare_input_with_regular_session_preserves_history_ids(new_session) -> None:
    """A regular session's history keeps its item ids in the input."""
    history_item = cast(
        TResponseInputItem,
        {
            "id": "message_id",
            "type": "message",
            "role": "assistant",
            "content": "history",
        },
    )
    session = await simple_session(new_session, [history_item])

    prepared, _ = await prepare_input_with_session("new", session, None)

    assert isinstance(prepared, list)
    history_payload = cast(dict[str, Any], prepared[0])
    assert history_payload["id"] == "message_id"


async def test_prepare_input_with_session_strips_internal_tool_call_metadata(new_session) -> None:
    """The SDK's internal tool call metadata is stripped from the history it sends."""
    tool_call = cast(
        TResponseInputItem,
        {
            "type": "function_call",
            "call_id": "call_history",
            "name": "lookup_account",
            "arguments": "{}",
            TOOL_CALL_SESSION_DESCRIPTION_KEY: "Lookup customer records.",
            TOOL_CALL_SESSION_TITLE_KEY: "Lookup Account",
        },
    )
    tool_output = cast(
        TResponseInputItem,
        {
            "type": "function_call_output",
            "call_id": "call_history",
            "output": "ok",
        },
    )
    session = await simple_session(new_session, [tool_call, tool_output])

    prepared_input, session_items = await prepare_input_with_session("hello", session, None)

    assert isinstance(prepared_input, list)
    prepared_tool_calls = [
        cast(dict[str, Any], item)
        for item in prepared_input
        if isinstance(item, dict)
        and item.get("type") == "function_call"
        and item.get("call_id") == "call_history"
    ]
    assert len(prepared_tool_calls) == 1
    assert TOOL_CALL_SESSION_DESCRIPTION_KEY not in prepared_tool_calls[0]
    assert TOOL_CALL_SESSION_TITLE_KEY not in prepared_tool_calls[0]
    assert len(session_items) == 1
    assert cast(dict[str, Any], session_items[0])["role"] == "user"


async def test_prepare_input_with_session_sanitizes_new_tool_call_session_items(
    new_session,
) -> None:
    """New tool call items are stored without the SDK's internal metadata."""
    prepared_input, session_items = await prepare_input_with_session(
        [
            cast(
                TResponseInputItem,
                {
                    "type": "function_call",
                    "call_id": "call_new",
                    "name": "lookup_account",
                    "arguments": "{}",
                    TOOL_CALL_SESSION_DESCRIPTION_KEY: "Lookup customer records.",
                    TOOL_CALL_SESSION_TITLE_KEY: "Lookup Account",
                },
            )
        ],
        new_session("test"),
        None,
    )

    assert isinstance(prepared_input, list)
    assert len(prepared_input) == 1
    prepared_tool_call = cast(dict[str, Any], prepared_input[0])
    assert prepared_tool_call["type"] == "function_call"
    assert TOOL_CALL_SESSION_DESCRIPTION_KEY not in prepared_tool_call
    assert TOOL_CALL_SESSION_TITLE_KEY not in prepared_tool_call

    assert len(session_items) == 1
    session_tool_call = cast(dict[str, Any], session_items[0])
    assert session_tool_call["type"] == "function_call"
    assert TOOL_CALL_SESSION_DESCRIPTION_KEY not in session_tool_call
    assert TOOL_CALL_SESSION_TITLE_KEY not in session_tool_call


async def test_persist_session_items_for_guardrail_trip_uses_original_input_when_missing(
    new_session,
) -> None:
    """A guardrail trip with no prepared items stores the guardrail's input."""
    session = new_session("test")
    agent = Agent(name="agent", model=ScriptedModel())
    run_state: RunState[Any] = RunState(
        context=RunContextWrapper(context={}),
        original_input="input",
        starting_agent=agent,
        max_turns=1,
    )

    persisted = await persist_session_items_for_guardrail_trip(
        session,
        None,
        None,
        "guardrail input",
        run_state,
    )

    assert persisted == [{"role": "user", "content": "guardrail input"}]
    assert await session.get_items() == persisted


async def test_wait_for_session_cleanup_logs_when_targets_linger(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, new_session
) -> None:
    """A role-less message item that stays in the session is reported after the retries."""
    target = cast(TResponseInputItem, {"id": "msg-1", "type": "message", "content": "hello"})
    session = await simple_session(new_session, [target])
    serialized_target = fingerprint_input_item(target)
    sleeps: list[float] = []

    async def fake_sleep(delay: float) -> None:
        sleeps.append(delay)

    monkeypatch.setattr(asyncio, "sleep", fake_sleep)

    assert serialized_target is not None
    with caplog.at_level("DEBUG", logger="openai.agents"):
        await wait_for_session_cleanup(session, [serialized_target], max_attempts=2)

    assert sleeps == [0.1, 0.2]
    assert "Session cleanup verification exhausted attempts" in caplog.text


@pytest.mark.parametrize("session_backend", ["sqlite"])
async def test_non_streamed_model_retry_does_not_rewind_committed_session_input(
    session_backend: str, new_session
) -> None:
    """A retried model call neither rewinds nor doubles the input the session holds."""
    model = ScriptedModel()
    model.extend(
        [
            APIConnectionError(
                message="connection error",
                request=httpx.Request("POST", "https://example.com"),
            ),
            [get_text_message("done")],
        ]
    )
    agent = Agent(
        name="test",
        model=model,
        model_settings=ModelSettings(
            retry=ModelRetrySettings(
                max_retries=1,
                policy=retry_policies.network_error(),
            )
        ),
    )
    session = new_session("retry-session")
    await session.add_items([get_text_input_item("previous")])

    result = await Runner.run(agent, input="test", session=session)
    saved_items = await session.get_items()

    assert result.final_output == "done"
    assert [item.get("role") for item in saved_items] == ["user", "user", "assistant"]
    assert [item.get("content") for item in saved_items[:2]] == ["previous", "test"]


@pytest.mark.skip(
    reason="patches agents.run.get_all_tools, which the installed SDK (0.24) no longer has"
)
async def test_session_persists_only_new_step_items(
    monkeypatch: pytest.MonkeyPatch, new_session
) -> None:
    """Ensure only per-turn new_step_items are persisted to the session."""
    session = new_session("test")
    agent = Agent(name="agent", model=ScriptedModel())

    pre_item = _DummyRunItem(
        {"type": "message", "role": "assistant", "content": "old"}, "message_output_item"
    )
    new_item = _DummyRunItem(
        {"type": "message", "role": "assistant", "content": "new"}, "message_output_item"
    )
    new_response = ModelResponse(output=[], usage=Usage(), response_id="resp-1")
    turn_result = SingleStepResult(
        original_input="hello",
        model_response=new_response,
        pre_step_items=[cast(RunItem, pre_item)],
        new_step_items=[cast(RunItem, new_item)],
        next_step=NextStepFinalOutput(output="done"),
        tool_input_guardrail_results=[],
        tool_output_guardrail_results=[],
    )

    calls: list[list[RunItem]] = []

    from agents.run_internal import session_persistence as sp

    real_save_result = sp.save_result_to_session

    async def save_wrapper(
        sess: Any,
        original_input: Any,
        new_items: list[RunItem],
        run_state: RunState | None = None,
        **kwargs: Any,
    ) -> None:
        calls.append(list(new_items))
        await real_save_result(sess, original_input, new_items, run_state, **kwargs)

    async def fake_run_single_turn(**_: Any) -> SingleStepResult:
        return turn_result

    async def fake_run_output_guardrails(*_: Any, **__: Any) -> list[Any]:
        return []

    async def noop_initialize_computer_tools(
        *args: Any, tools: list[Any], **kwargs: Any
    ) -> list[Any]:
        return tools

    monkeypatch.setattr("agents.run.save_result_to_session", save_wrapper)
    monkeypatch.setattr(
        "agents.run_internal.session_persistence.save_result_to_session", save_wrapper
    )
    monkeypatch.setattr(
        "agents.run_internal.agent_runner_helpers.save_result_to_session", save_wrapper
    )
    monkeypatch.setattr("agents.run.run_single_turn", fake_run_single_turn)
    monkeypatch.setattr("agents.run_internal.run_loop.run_single_turn", fake_run_single_turn)
    monkeypatch.setattr("agents.run.run_output_guardrails", fake_run_output_guardrails)
    monkeypatch.setattr(
        "agents.run_internal.run_loop.run_output_guardrails", fake_run_output_guardrails
    )

    async def fake_get_all_tools(*_: Any, **__: Any) -> list[Any]:
        return []

    monkeypatch.setattr("agents.run.get_all_tools", fake_get_all_tools)
    monkeypatch.setattr("agents.run_internal.run_loop.get_all_tools", fake_get_all_tools)
    monkeypatch.setattr("agents.run.initialize_computer_tools", noop_initialize_computer_tools)
    monkeypatch.setattr(
        "agents.run_internal.run_loop.initialize_computer_tools", noop_initialize_computer_tools
    )

    result = await Runner.run(agent, input="hello", session=session)

    assert result.final_output == "done"
    # First save writes the user input; second save should contain only the new_step_items.
    assert len(calls) >= 2
    assert calls[-1] == [cast(RunItem, new_item)]

    items = await session.get_items()
    assert len(items) == 2
    assert any("new" in cast(dict[str, Any], item).get("content", "") for item in items)
    assert not any("old" in cast(dict[str, Any], item).get("content", "") for item in items)


def test_output_guardrail_tripwire_does_not_save_assistant_message_to_session_sync(
    loops_closed_after, new_session
) -> None:
    """By run_sync (then asyncio.run), an output tripwire stores the input and no answer."""

    def guardrail_function(
        _context: RunContextWrapper[Any], _agent: Agent[Any], _agent_output: Any
    ) -> GuardrailFunctionOutput:
        return GuardrailFunctionOutput(output_info=None, tripwire_triggered=True)

    session = new_session("test")
    model = ScriptedModel()
    model.enqueue([get_text_message("should_not_be_saved")])
    agent = Agent(
        name="test",
        model=model,
        output_guardrails=[OutputGuardrail(guardrail_function=guardrail_function)],
    )

    with pytest.raises(OutputGuardrailTripwireTriggered):
        Runner.run_sync(agent, input="user_message", session=session)

    items = asyncio.run(session.get_items())
    assert [
        cast(dict[str, Any], item).get("type") or cast(dict[str, Any], item).get("role")
        for item in items
    ] == ["user"]


@pytest.mark.parametrize("streamed", [False, True])
async def test_output_guardrail_error_preserves_final_output_in_session(
    streamed: bool, new_session
) -> None:
    """An output guardrail that raises leaves the final output in the session."""

    def guardrail_function(
        _context: RunContextWrapper[Any], _agent: Agent[Any], _agent_output: Any
    ) -> GuardrailFunctionOutput:
        raise RuntimeError("guardrail failed")

    session = new_session("test")
    model = ScriptedModel()
    model.enqueue([get_text_message("preserved_on_guardrail_error")])
    agent = Agent(
        name="test",
        model=model,
        output_guardrails=[OutputGuardrail(guardrail_function=guardrail_function)],
    )

    with pytest.raises(RuntimeError, match="guardrail failed"):  # noqa: PT012 - the SDK's, as it is
        if streamed:
            result = Runner.run_streamed(agent, input="user_message", session=session)
            async for _ in result.stream_events():
                pass
        else:
            await Runner.run(agent, input="user_message", session=session)

    items = await session.get_items()
    assert [
        cast(dict[str, Any], item).get("type") or cast(dict[str, Any], item).get("role")
        for item in items
    ] == ["user", "message"]


async def test_output_guardrail_cancellation_preserves_final_output_in_session(new_session) -> None:
    """An output guardrail cancelled leaves the final output in the session."""
    guardrail_started = asyncio.Event()

    async def guardrail_function(
        _context: RunContextWrapper[Any], _agent: Agent[Any], _agent_output: Any
    ) -> GuardrailFunctionOutput:
        guardrail_started.set()
        await asyncio.Event().wait()
        raise AssertionError("unreachable")

    session = new_session("test")
    model = ScriptedModel()
    model.enqueue([get_text_message("preserved_on_guardrail_cancellation")])
    agent = Agent(
        name="test",
        model=model,
        output_guardrails=[OutputGuardrail(guardrail_function=guardrail_function)],
    )

    run_task = asyncio.create_task(Runner.run(agent, input="user_message", session=session))
    await guardrail_started.wait()
    run_task.cancel()

    with pytest.raises(asyncio.CancelledError):
        await run_task

    items = await session.get_items()
    assert [
        cast(dict[str, Any], item).get("type") or cast(dict[str, Any], item).get("role")
        for item in items
    ] == ["user", "message"]


async def test_resumed_final_output_persists_once_after_passing_output_guardrail(
    new_session,
) -> None:
    """A resumed run's final output is stored once after its guardrail passes."""

    def guardrail_function(
        _context: RunContextWrapper[Any], _agent: Agent[Any], _agent_output: Any
    ) -> GuardrailFunctionOutput:
        return GuardrailFunctionOutput(output_info=None, tripwire_triggered=False)

    @function_tool
    def foo(a: str) -> str:
        return f"result:{a}"

    session = new_session("test")
    model = ScriptedModel()
    model.enqueue([get_function_tool_call("foo", json.dumps({"a": "b"}))])
    agent = Agent(
        name="test",
        model=model,
        tools=[foo],
        output_guardrails=[OutputGuardrail(guardrail_function=guardrail_function)],
    )

    streamed = Runner.run_streamed(agent, input="user_message", session=session)
    async for event in streamed.stream_events():
        if event.type == "run_item_stream_event" and event.name == "tool_output":
            streamed.cancel(mode="after_turn")

    items_before_resume = await session.get_items()
    state = streamed.to_state()
    state._current_turn_persisted_item_count = 2

    model.enqueue([get_text_message("accepted_final")])
    resumed = await Runner.run(agent, state, session=session)
    assert resumed.final_output == "accepted_final"

    items_after_resume = await session.get_items()
    assert items_after_resume[: len(items_before_resume)] == items_before_resume
    assistant_messages = [
        item
        for item in items_after_resume
        if cast(dict[str, Any], item).get("role") == "assistant"
        and cast(dict[str, Any], item).get("type") == "message"
    ]
    assert len(assistant_messages) == 1
    content = cast(dict[str, Any], assistant_messages[0]).get("content")
    assert isinstance(content, list)
    assert any(isinstance(part, dict) and part.get("text") == "accepted_final" for part in content)


@pytest.mark.parametrize("tripwire_triggered", [False, True])
async def test_resumed_final_tool_persists_call_and_output_after_output_guardrail(
    tripwire_triggered: bool, new_session
) -> None:
    """A resumed run's final tool call and output are stored after its output guardrail."""

    def guardrail_function(
        _context: RunContextWrapper[Any], _agent: Agent[Any], _agent_output: Any
    ) -> GuardrailFunctionOutput:
        return GuardrailFunctionOutput(
            output_info=None,
            tripwire_triggered=tripwire_triggered,
        )

    @function_tool(name_override="commit_tool")
    def commit_tool() -> str:
        return "committed-result"

    session = new_session("test")
    model = ScriptedModel()
    model.enqueue([get_function_tool_call("commit_tool", "{}", call_id="call-first")])
    agent = Agent(
        name="test",
        model=model,
        tools=[commit_tool],
        output_guardrails=[OutputGuardrail(guardrail_function=guardrail_function)],
    )

    streamed = Runner.run_streamed(agent, input="user_message", session=session)
    async for event in streamed.stream_events():
        if event.type == "run_item_stream_event" and event.name == "tool_output":
            streamed.cancel(mode="after_turn")

    state = streamed.to_state()
    assert state._current_turn_persisted_item_count == 2

    agent.tool_use_behavior = "stop_on_first_tool"
    model.enqueue([get_function_tool_call("commit_tool", "{}", call_id="call-second")])

    if tripwire_triggered:
        with pytest.raises(OutputGuardrailTripwireTriggered):
            await Runner.run(agent, state, session=session)
    else:
        result = await Runner.run(agent, state, session=session)
        assert result.final_output == "committed-result"

    assert state._current_turn_persisted_item_count == 2
    items = await session.get_items()
    assert [
        (
            cast(dict[str, Any], item).get("type") or cast(dict[str, Any], item).get("role"),
            cast(dict[str, Any], item).get("call_id"),
        )
        for item in items
    ] == [
        ("user", None),
        ("function_call", "call-first"),
        ("function_call_output", "call-first"),
        ("function_call", "call-second"),
        ("function_call_output", "call-second"),
    ]
    assert cast(dict[str, Any], items[-1]).get("output") == (
        run_loop._OUTPUT_GUARDRAIL_BLOCKED_TOOL_OUTPUT if tripwire_triggered else "committed-result"
    )
    if tripwire_triggered:
        assert "committed-result" not in json.dumps(items[-2:])


@pytest.mark.parametrize(
    "run_kwargs",
    [
        {"conversation_id": "conv-test"},
        {"previous_response_id": "resp-test"},
        {"auto_previous_response_id": True},
    ],
)
async def test_run_rejects_session_with_server_managed_conversation(
    run_kwargs: dict[str, Any], new_session
):
    """A session with a server-managed conversation is refused by Runner.run."""
    model = ScriptedModel()
    model.enqueue([get_text_message("done")])
    agent = Agent(name="test", model=model)
    session = new_session("test")

    with pytest.raises(UserError, match="Session persistence"):
        await Runner.run(agent, input="test", session=session, **run_kwargs)


async def test_run_rejects_session_with_resumed_conversation_state(new_session):
    """A session with a resumed server-managed conversation state is refused by Runner.run."""
    model = ScriptedModel()
    agent = Agent(name="test", model=model)
    session = new_session("test")
    context_wrapper = RunContextWrapper(context=None)
    state = RunState(
        context=context_wrapper,
        original_input="hello",
        starting_agent=agent,
        conversation_id="conv-test",
    )

    with pytest.raises(UserError, match="Session persistence"):
        await Runner.run(agent, state, session=session)


@pytest.mark.parametrize(
    "run_kwargs",
    [
        {"conversation_id": "conv-test"},
        {"previous_response_id": "resp-test"},
        {"auto_previous_response_id": True},
    ],
)
async def test_run_streamed_rejects_session_with_server_managed_conversation(
    run_kwargs: dict[str, Any], new_session
):
    """A session with a server-managed conversation is refused by run_streamed."""
    model = ScriptedModel()
    model.enqueue([get_text_message("done")])
    agent = Agent(name="test", model=model)
    session = new_session("test")

    with pytest.raises(UserError, match="Session persistence"):
        Runner.run_streamed(agent, input="test", session=session, **run_kwargs)


async def test_run_streamed_rejects_session_with_resumed_conversation_state(new_session):
    """A session with a resumed server-managed conversation state is refused by run_streamed."""
    model = ScriptedModel()
    agent = Agent(name="test", model=model)
    session = new_session("test")
    context_wrapper = RunContextWrapper(context=None)
    state = RunState(
        context=context_wrapper,
        original_input="hello",
        starting_agent=agent,
        conversation_id="conv-test",
    )

    with pytest.raises(UserError, match="Session persistence"):
        Runner.run_streamed(agent, state, session=session)


async def test_manual_pending_shell_call_input_is_preserved_non_streamed_with_session(
    new_session,
) -> None:
    """A pending shell call given as input is stored and sent by Runner.run."""
    model = ScriptedModel()
    agent = Agent(
        name="manual-shell",
        model=model,
        tools=[get_function_tool("test_func", "tool_result")],
    )
    session = new_session("test")
    pending_shell_call = cast(
        TResponseInputItem,
        make_shell_call("manual_shell", id_value="shell_1", commands=["echo hi"]),
    )
    model.extend(
        [
            [get_function_tool_call("test_func", '{"arg": "foo"}')],
            [get_text_message("done")],
        ]
    )

    result = await Runner.run(agent, input=[pending_shell_call], session=session)

    assert result.final_output == "done"
    assert bool(model.calls)
    assert any(
        isinstance(item, dict)
        and item.get("type") == "shell_call"
        and item.get("call_id") == "manual_shell"
        for item in model.calls[0].input
    )

    last_input = model.calls[-1].input
    assert isinstance(last_input, list)
    assert any(
        isinstance(item, dict)
        and item.get("type") == "shell_call"
        and item.get("call_id") == "manual_shell"
        for item in last_input
    )


async def test_manual_pending_shell_call_input_is_preserved_streamed_with_session(
    new_session,
) -> None:
    """A pending shell call given as input is stored and sent by run_streamed."""
    model = ScriptedModel()
    agent = Agent(name="manual-shell", model=model)
    session = new_session("test")
    pending_shell_call = cast(
        TResponseInputItem,
        make_shell_call("manual_shell", id_value="shell_1", commands=["echo hi"]),
    )
    model.enqueue([get_text_message("done")])

    result = Runner.run_streamed(agent, input=[pending_shell_call], session=session)
    async for _ in result.stream_events():
        pass

    assert result.final_output == "done"
    last_input = model.calls[-1].input
    assert isinstance(last_input, list)
    assert any(
        isinstance(item, dict)
        and item.get("type") == "shell_call"
        and item.get("call_id") == "manual_shell"
        for item in last_input
    )


async def test_session_add_items_called_multiple_times_for_multi_turn_completion(new_session):
    """The runner adds a multi-turn completion's items in four batches, all kept in order."""
    session_id = "runner_session_multi_turn_calls"
    session = new_session(session_id)

    # Define a tool that will be called by the orchestrator agent
    @function_tool
    async def echo_tool(text: str) -> str:
        return f"Echo: {text}"

    # Orchestrator agent that calls the tool multiple times in one completion
    orchestrator_agent = Agent(
        name="orchestrator_agent",
        instructions=(
            "Call echo_tool twice with inputs of 'foo' and 'bar', then return a summary."
        ),
        tools=[echo_tool],
    )

    # Patch the model to simulate two tool calls and a final message
    model = ScriptedModel()
    orchestrator_agent.model = model
    model.extend(
        [
            # First turn: tool call
            [get_function_tool_call("echo_tool", json.dumps({"text": "foo"}), call_id="1")],
            # Second turn: tool call
            [get_function_tool_call("echo_tool", json.dumps({"text": "bar"}), call_id="2")],
            # Third turn: final output
            [get_final_output_message("Summary: Echoed foo and bar")],
        ]
    )

    # Patch add_items to count calls
    with patch.object(CtxstoreSession, "add_items", wraps=session.add_items) as mock_add_items:
        result = await Runner.run(orchestrator_agent, input="foo and bar", session=session)

        expected_items = [
            {"content": "foo and bar", "role": "user"},
            {
                "arguments": '{"text": "foo"}',
                "call_id": "1",
                "name": "echo_tool",
                "type": "function_call",
                "id": "1",
            },
            {"call_id": "1", "output": "Echo: foo", "type": "function_call_output"},
            {
                "arguments": '{"text": "bar"}',
                "call_id": "2",
                "name": "echo_tool",
                "type": "function_call",
                "id": "1",
            },
            {"call_id": "2", "output": "Echo: bar", "type": "function_call_output"},
            {
                "id": "1",
                "content": [
                    {
                        "annotations": [],
                        "logprobs": [],
                        "text": "Summary: Echoed foo and bar",
                        "type": "output_text",
                    }
                ],
                "role": "assistant",
                "status": "completed",
                "type": "message",
            },
        ]

        expected_calls = [
            # First call is the initial input
            (([expected_items[0]],),),
            # Second call is the first tool call and its result
            (([expected_items[1], expected_items[2]],),),
            # Third call is the second tool call and its result
            (([expected_items[3], expected_items[4]],),),
            # Fourth call is the final output
            (([expected_items[5]],),),
        ]
        assert mock_add_items.call_args_list == expected_calls
        assert result.final_output == "Summary: Echoed foo and bar"
        assert (await session.get_items()) == expected_items
