"""LangChain 1.x agents over ctxstore: a real create_agent loop stores its state, sends the view.

The model is a scripted fake that answers from a list and records, at each
call, what it was sent and the session's view at that moment; the tools are
real LangChain tools, run by the agent's own tool node.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest

pytest.importorskip("langchain.agents")

from langchain.agents import create_agent
from langchain_core.callbacks import AsyncCallbackManagerForLLMRun, CallbackManagerForLLMRun
from langchain_core.language_models.chat_models import BaseChatModel
from langchain_core.messages import (
    AIMessage,
    BaseMessage,
    HumanMessage,
    RemoveMessage,
    SystemMessage,
    ToolMessage,
    convert_to_openai_messages,
)
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.tools import BaseTool, StructuredTool, ToolException
from langgraph.checkpoint.memory import InMemorySaver
from pydantic import Field
from support.helpers import paired

from ctxstore import ConfigurationError, ContextStore, InvalidIdError, InvalidInputError
from ctxstore.integrations.langchain import CtxstoreChatMessageHistory
from ctxstore.integrations.langchain_middleware import (
    LAST_STORED_FIELD,
    STORED_FIELD,
    CtxstoreMiddleware,
)
from ctxstore.testing import orphans

SYSTEM = "You are a careful agent."
THREAD = "Łukasz / 会話 #1"  # not a store id: the middleware stores it under its encoding
BUDGET = 340  # turns 2 and 3 fit, with the dump's preview; turn 1 no longer does
BIG_ROWS = 600  # a dump of some 4,000 tokens: over the offload threshold, sent as a preview


class ScriptedModel(BaseChatModel):
    """Answers from ``script`` in order; records what each call was sent, and the view then."""

    script: list[AIMessage]
    history: Any = None  # the CtxstoreChatMessageHistory whose view each call records
    budget: int | None = None
    calls: list[tuple[list[BaseMessage], list[BaseMessage] | None]] = Field(default_factory=list)

    @property
    def _llm_type(self) -> str:
        return "scripted"

    def bind_tools(self, tools: Any, **kwargs: Any) -> ScriptedModel:
        """The tools are the agent's business: the script already knows which it calls."""
        return self

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        raise NotImplementedError("the middleware is async: the agent runs with ainvoke")

    async def _agenerate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        view = None if self.history is None else await self.history.aget_view(self.budget)
        self.calls.append((list(messages), view))
        return ChatResult(generations=[ChatGeneration(message=self.script.pop(0))])


def call(name: str, call_id: str, **args: Any) -> dict[str, Any]:
    """A tool call as a model makes one."""
    return {"name": name, "args": args, "id": call_id, "type": "tool_call"}


def tools() -> list[BaseTool]:
    """A file reader, a large dump, and a tool that always fails (its error goes to the model)."""

    def read_file(path: str) -> str:
        """Read a file."""
        return f"the text of {path}"

    def dump_table() -> str:
        """Dump the whole table."""
        return "".join(f"row {i}: alpha beta gamma delta epsilon\n" for i in range(BIG_ROWS))

    def deploy() -> str:
        """Deploy the service."""
        raise ToolException("deploy failed: the cluster is read-only")

    return [
        StructuredTool.from_function(read_file),
        StructuredTool.from_function(dump_table),
        StructuredTool.from_function(deploy, handle_tool_error=True),
    ]


def script() -> list[AIMessage]:
    """Three turns: two parallel reads; a large dump in parallel with a failing deploy; a reply."""
    reads = [call("read_file", "r1", path="a.py"), call("read_file", "r2", path="b.py")]
    return [
        AIMessage("", tool_calls=reads),
        AIMessage("a.py and b.py are read."),
        AIMessage("", tool_calls=[call("dump_table", "d1"), call("deploy", "x1")]),
        AIMessage("The table is dumped; the deploy failed."),
        AIMessage("Nothing else to do."),
    ]


async def test_a_create_agent_loop_sends_the_view_and_stores_its_state(
    store: ContextStore,
) -> None:
    """Over three turns, each model call is sent the view, and the session equals the state."""
    history = CtxstoreChatMessageHistory(THREAD, store)
    model = ScriptedModel(script=script(), history=history, budget=BUDGET)
    agent = create_agent(
        model,
        tools(),
        system_prompt=SYSTEM,
        middleware=[CtxstoreMiddleware(store, token_budget=BUDGET)],
        checkpointer=InMemorySaver(),
    )
    config: Any = {"configurable": {"thread_id": THREAD}}
    states = []
    for text in ["read a.py and b.py", "dump the table and deploy", "anything else?"]:
        state = await agent.ainvoke({"messages": [HumanMessage(text)]}, config)
        states.append(state["messages"])
        assert await history.aget_messages() == state["messages"]

    assert len(model.calls) == 5 and not model.script
    for sent, view in model.calls:
        assert sent == [SystemMessage(SYSTEM), *(view or [])]
        assert orphans(convert_to_openai_messages(sent)) == 0
    final = states[-1]
    assert [type(m) for m in final].count(ToolMessage) == 4
    assert (await store.info(history.store_session_id)).count == len(final) == 12
    # The second call of turn 1 got both parallel results, each after its call.
    second, _ = model.calls[1]
    assert [m.tool_call_id for m in second if isinstance(m, ToolMessage)] == ["r1", "r2"]
    # Turn 2's answer saw the failed deploy as an error result, and the dump as a preview.
    fourth, _ = model.calls[3]
    results = {m.tool_call_id: m for m in fourth if isinstance(m, ToolMessage)}
    assert results["x1"].status == "error" and "read-only" in results["x1"].content
    assert "tool result are not shown" in str(results["d1"].content)
    full = next(m for m in final if isinstance(m, ToolMessage) and m.tool_call_id == "d1")
    assert str(full.content).count("\n") == BIG_ROWS  # the state and the session keep it whole
    # The last call fits the budget, so turn 1 no longer goes: the view, not the state.
    last, _ = model.calls[4]
    assert len(last) - 1 < len(final) - 1  # the state then held all but the final answer
    assert not any(isinstance(m, ToolMessage) and m.tool_call_id == "r1" for m in last)
    assert paired(convert_to_openai_messages(last)) >= 1


async def test_without_a_checkpointer_the_session_is_the_memory(store: ContextStore) -> None:
    """Each run's state holds its own turn; the model is sent the earlier runs' from the session."""
    model = ScriptedModel(script=[AIMessage("Hello Ada."), AIMessage("You are Ada.")])
    agent = create_agent(model, [], middleware=[CtxstoreMiddleware(store, session_id="ada")])
    first = await agent.ainvoke({"messages": [HumanMessage("I am Ada")]})
    second = await agent.ainvoke({"messages": [HumanMessage("who am I?")]})
    assert len(second["messages"]) == 2
    sent, _ = model.calls[1]
    assert sent == [*first["messages"], *second["messages"][:1]]
    stored = await CtxstoreChatMessageHistory("ada", store).aget_messages()
    assert stored == [*first["messages"], *second["messages"]]


async def test_messages_taken_out_of_the_state_leave_the_session(store: ContextStore) -> None:
    """A RemoveMessage through update_state: the next run rewrites the session to the state."""
    model = ScriptedModel(script=[AIMessage("one"), AIMessage("two"), AIMessage("three")])
    agent = create_agent(
        model, [], middleware=[CtxstoreMiddleware(store)], checkpointer=InMemorySaver()
    )
    config: Any = {"configurable": {"thread_id": "t-remove"}}
    for text in ["first", "second"]:
        await agent.ainvoke({"messages": [HumanMessage(text)]}, config)
    state = (await agent.aget_state(config)).values
    assert state[STORED_FIELD] == 4 and state[LAST_STORED_FIELD] == state["messages"][-1].id
    await agent.aupdate_state(
        config, {"messages": [RemoveMessage(id=m.id) for m in state["messages"][:2]]}
    )
    final = await agent.ainvoke({"messages": [HumanMessage("third")]}, config)
    assert [m.content for m in final["messages"]] == ["second", "two", "third", "three"]
    history = CtxstoreChatMessageHistory("t-remove", store)
    assert await history.aget_messages() == final["messages"]
    sent, _ = model.calls[2]
    assert [m.content for m in sent] == ["second", "two", "third"]


@dataclass
class Caller:
    """The run's context: who is calling."""

    user: str


async def test_the_session_can_come_from_the_runs_context(store: ContextStore) -> None:
    """session_id as a function of the Runtime: each user's runs land in their own session."""
    model = ScriptedModel(script=[AIMessage("hi Bo"), AIMessage("hi Cy")])
    agent = create_agent(
        model,
        [],
        context_schema=Caller,
        middleware=[CtxstoreMiddleware(store, session_id=lambda run: f"user:{run.context.user}")],
    )
    await agent.ainvoke({"messages": [HumanMessage("hello")]}, context=Caller("bo"))
    await agent.ainvoke({"messages": [HumanMessage("hello")]}, context=Caller("cy"))
    bo = await CtxstoreChatMessageHistory("user:bo", store).aget_messages()
    assert [m.content for m in bo] == ["hello", "hi Bo"]
    assert (await CtxstoreChatMessageHistory("user:cy", store).aget_messages())[
        1
    ].content == "hi Cy"


async def test_a_run_with_no_session_is_refused(store: ContextStore) -> None:
    """No session_id and no thread_id: ConfigurationError, and the model is never called."""
    model = ScriptedModel(script=[AIMessage("never")])
    agent = create_agent(model, [], middleware=[CtxstoreMiddleware(store)])
    with pytest.raises(ConfigurationError, match="thread_id"):
        await agent.ainvoke({"messages": [HumanMessage("hi")]})
    assert model.calls == []


@pytest.mark.parametrize(
    ("arguments", "error"),
    [
        ({"token_budget": 0}, InvalidInputError),
        ({"token_budget": True}, InvalidInputError),
        ({"model": ""}, InvalidInputError),
        ({"session_id": ""}, InvalidIdError),
    ],
)
async def test_bad_settings_are_refused_when_built(
    store: ContextStore, arguments: dict[str, Any], error: type[Exception]
) -> None:
    """A budget that is not a positive integer, an empty model or session: refused at once."""
    with pytest.raises(error):
        CtxstoreMiddleware(store, **arguments)


async def test_the_sync_invoke_is_refused_before_the_model_is_called(store: ContextStore) -> None:
    """The hooks are async: a sync invoke raises LangGraph's TypeError, and nothing is stored."""
    model = ScriptedModel(script=[AIMessage("never")])
    agent = create_agent(model, [], middleware=[CtxstoreMiddleware(store, session_id="sync")])
    with pytest.raises(TypeError, match="No synchronous function"):
        agent.invoke({"messages": [HumanMessage("hi")]})
    assert model.calls == []
    assert await CtxstoreChatMessageHistory("sync", store).aget_messages() == []
