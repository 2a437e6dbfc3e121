"""LangChain's chat message history: exact round trips, atomic batches, sync and async, views.

Runs a real ``RunnableWithMessageHistory`` over LangChain's own fake chat
model, so no network is needed.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

pytest.importorskip("langchain_core")

from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import (
    AIMessage,
    AIMessageChunk,
    BaseMessage,
    ChatMessage,
    FunctionMessage,
    HumanMessage,
    RemoveMessage,
    SystemMessage,
    ToolMessage,
    convert_to_openai_messages,
)
from langchain_core.runnables import RunnableLambda
from langchain_core.runnables.history import RunnableWithMessageHistory
from support.helpers import oa_call, oa_result, paired, user

from ctxstore import (
    BudgetExceededError,
    ContextStore,
    CorruptEntryError,
    InvalidIdError,
    InvalidMessageError,
    Settings,
)
from ctxstore.integrations.langchain import LANGCHAIN_KEY, CtxstoreChatMessageHistory
from ctxstore.testing import FakeSummarizer, orphans

# RunnableWithMessageHistory warns that it is deprecated (langchain-core 1.3.3) on
# construction; it is still what LangChain's own chat histories are used through.
RUNNABLE_DEPRECATED = pytest.mark.filterwarnings(
    "ignore:RunnableWithMessageHistory is deprecated:DeprecationWarning"
)


@pytest.fixture
def history(store: ContextStore) -> CtxstoreChatMessageHistory:
    """A history over this test's store and tenant."""
    return CtxstoreChatMessageHistory("chat-1", store)


def every_kind() -> list[BaseMessage]:
    """One message of each kind LangChain has, with every field set somewhere."""
    return [
        SystemMessage("You are a careful agent.", id="sys-1"),
        HumanMessage(
            [
                {"type": "text", "text": "what is in this picture?"},
                "a bare string block",
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}},
            ],
            name="alice",
            id="h-1",
        ),
        AIMessage(
            "",
            tool_calls=[
                {"name": "read_file", "args": {"path": "a.py"}, "id": "call_1"},
                {"name": "search", "args": {"q": "ünïcode", "n": [1, 2]}, "id": "call_2"},
            ],
            invalid_tool_calls=[
                {"name": "read_file", "args": "{oops", "id": "call_3", "error": "bad JSON"}
            ],
            additional_kwargs={"refusal": None, "extra": {"nested": [True, 1.5]}},
            response_metadata={"model_name": "gpt-x", "finish_reason": "tool_calls"},
            usage_metadata={"input_tokens": 10, "output_tokens": 5, "total_tokens": 15},
            id="ai-1",
            name="planner",
        ),
        ToolMessage("def a(): ...", tool_call_id="call_1", status="success", artifact={"lines": 1}),
        ToolMessage(
            [{"type": "text", "text": "no results"}],
            tool_call_id="call_2",
            status="error",
            artifact=["raw", None],
            name="search",
        ),
        ToolMessage("could not parse the arguments", tool_call_id="call_3", status="error"),
        AIMessage(  # Anthropic's form: the call is a tool_use block and a tool call
            [
                {"type": "text", "text": "Let me look."},
                {"type": "tool_use", "id": "toolu_1", "name": "ls", "input": {"dir": "."}},
            ],
            tool_calls=[{"name": "ls", "args": {"dir": "."}, "id": "toolu_1"}],
        ),
        ToolMessage("a.py b.py", tool_call_id="toolu_1"),
        ChatMessage("Looks right to me.", role="critic"),
        ChatMessage("I agree.", role="assistant"),
        FunctionMessage("42", name="answer"),
        AIMessageChunk("streamed", id="chunk-1"),
        AIMessage("All done.", response_metadata={"stop": "end_turn"}),
    ]


def exchange(step: int, *, size: int = 30, blocks: bool = False) -> list[BaseMessage]:
    """A turn that calls two tools in parallel; each result is ``size`` lines long.

    ``blocks``: the results' content is a list of text blocks, not a string.
    """
    calls = [
        {"name": "read_file", "args": {"path": f"f{step}_{i}.py"}, "id": f"call_{step}_{i}"}
        for i in range(2)
    ]
    texts = {call["id"]: f"line of {call['id']}\n" * size for call in calls}
    return [
        HumanMessage(f"step {step}: read the files"),
        AIMessage("", tool_calls=calls),
        *[
            ToolMessage([{"type": "text", "text": text}] if blocks else text, tool_call_id=cid)
            for cid, text in texts.items()
        ],
        AIMessage(f"done with step {step}"),
    ]


async def test_every_message_type_round_trips_exactly(
    history: CtxstoreChatMessageHistory,
) -> None:
    """Each kind of message, content lists and tool calls included, comes back equal."""
    messages = every_kind()
    await history.aadd_messages(messages)
    back = await history.aget_messages()
    assert back == messages
    assert [type(m) for m in back] == [type(m) for m in messages]


async def test_messages_are_stored_as_chat_messages_the_store_pairs(
    history: CtxstoreChatMessageHistory, store: ContextStore
) -> None:
    """Stored in OpenAI Chat form (calls paired by id), LangChain's own form beside it."""
    await history.aadd_messages(every_kind())
    stored = await store.get_messages("chat-1")
    roles = [m["role"] for m in stored]
    assert roles == [
        "system", "user", "assistant", "tool", "tool", "tool", "assistant", "tool",
        "user", "assistant", "user", "assistant", "assistant",
    ]  # fmt: skip
    assert stored[2]["tool_calls"][1] == {
        "id": "call_2",
        "type": "function",
        "function": {"name": "search", "arguments": '{"q": "ünïcode", "n": [1, 2]}'},
    }
    assert [c["id"] for c in stored[2]["tool_calls"]] == ["call_1", "call_2", "call_3"]
    assert stored[6]["content"] == [{"type": "text", "text": "Let me look."}]  # no tool_use twice
    assert stored[1]["content"][2] == {"type": "image", "source": {}}
    assert stored[3]["content"] == "def a(): ..."
    assert "content" not in stored[3][LANGCHAIN_KEY]["data"]  # a string is stored once
    assert stored[3][LANGCHAIN_KEY]["data"]["artifact"] == {"lines": 1}
    assert orphans(stored) == 0
    assert paired(stored) == 4


async def test_order_is_kept_across_batches(history: CtxstoreChatMessageHistory) -> None:
    """Batches land in the order they were added, each in its own order."""
    batches = [[HumanMessage(f"q{i}"), AIMessage(f"a{i}")] for i in range(5)]
    for batch in batches:
        await history.aadd_messages(batch)
    await history.aadd_messages([])
    assert [m.content for m in await history.aget_messages()] == [
        f"{kind}{i}" for i in range(5) for kind in "qa"
    ]


async def test_replace_leaves_exactly_the_messages_given(
    history: CtxstoreChatMessageHistory, store: ContextStore
) -> None:
    """areplace_messages: the session holds those messages only; a bad batch writes nothing."""
    await history.aadd_messages([HumanMessage("old"), AIMessage("older answer")])
    epoch = (await store.info("chat-1")).epoch
    kept = every_kind()[:4]
    await history.areplace_messages(kept)
    assert await history.aget_messages() == kept
    assert (await store.info("chat-1")).epoch == epoch + 1
    with pytest.raises(InvalidMessageError):
        await history.areplace_messages([HumanMessage("new"), RemoveMessage(id="m-1")])
    assert await history.aget_messages() == kept


@pytest.mark.parametrize(
    "bad",
    [
        pytest.param(ToolMessage("r", tool_call_id="c", artifact=object()), id="not-json"),
        pytest.param(HumanMessage("hi", additional_kwargs={"pair": (1, 2)}), id="tuple"),
        pytest.param(ToolMessage("r", tool_call_id=""), id="no-call-id"),
        pytest.param(RemoveMessage(id="m-1"), id="remove-message"),
        pytest.param("just a string", id="not-a-message"),
    ],
)
async def test_a_bad_message_fails_the_whole_batch(
    history: CtxstoreChatMessageHistory, bad: Any
) -> None:
    """One bad message in a batch: InvalidMessageError naming it, and nothing written."""
    await history.aadd_messages([HumanMessage("before")])
    with pytest.raises(InvalidMessageError) as caught:
        await history.aadd_messages([HumanMessage("good"), bad, AIMessage("after")])
    assert caught.value.index == 1
    assert await history.aget_messages() == [HumanMessage("before")]


async def test_sessions_are_isolated(store: ContextStore) -> None:
    """Two sessions of one store see only their own messages; clearing one keeps the other."""
    one = CtxstoreChatMessageHistory("one", store)
    two = CtxstoreChatMessageHistory("two", store)
    await one.aadd_messages([HumanMessage("to one")])
    await two.aadd_messages([HumanMessage("to two"), AIMessage("from two")])
    assert await one.aget_messages() == [HumanMessage("to one")]
    await two.aclear()
    assert await two.aget_messages() == []
    assert await one.aget_messages() == [HumanMessage("to one")]


@pytest.mark.parametrize(
    "session_id", ["Ada Lovelace/1", "会話 #7", "a b/../c", "{tenant:x}*", "_.eabc", "x" * 300]
)
async def test_any_session_id_names_a_session_of_its_own(
    store: ContextStore, session_id: str
) -> None:
    """Ids the store would refuse work, each in its own store session apart from the others."""
    history = CtxstoreChatMessageHistory(session_id, store)
    await history.aadd_messages([HumanMessage(session_id)])
    assert await history.aget_messages() == [HumanMessage(session_id)]
    assert history.session_id == session_id != history.store_session_id
    assert [row.session for row in await store.list_sessions()] == [history.store_session_id]
    assert await CtxstoreChatMessageHistory("abc", store).aget_messages() == []


async def test_a_store_session_id_is_its_own_name(store: ContextStore) -> None:
    """An id the store takes as it is names that very session (existing sessions stay put)."""
    await store.append("user-123", user("stored before"))
    history = CtxstoreChatMessageHistory("user-123", store)
    assert history.store_session_id == "user-123"
    assert [m.content for m in await history.aget_messages()] == ["stored before"]


@pytest.mark.parametrize("session_id", ["", None, 3])
async def test_an_empty_or_non_string_session_id_is_refused_at_once(
    store: ContextStore, session_id: object
) -> None:
    """An empty id (a missing one) or a non-string is refused when the history is built."""
    with pytest.raises(InvalidIdError):
        CtxstoreChatMessageHistory(session_id, store)  # type: ignore[arg-type]


async def test_chat_messages_another_client_stored_are_read(
    history: CtxstoreChatMessageHistory, store: ContextStore
) -> None:
    """Plain chat dicts (no LangChain form) come back through LangChain's converter."""
    await store.append_many("chat-1", [user("hi"), oa_call("c1"), oa_result("c1", "42")])
    back = await history.aget_messages()
    assert [type(m) for m in back] == [HumanMessage, AIMessage, ToolMessage]
    assert back[1].tool_calls[0]["id"] == "c1"
    assert back[2].tool_call_id == "c1"


async def test_a_message_langchain_cannot_read_is_a_corrupt_entry(
    history: CtxstoreChatMessageHistory, store: ContextStore
) -> None:
    """A stored item LangChain has no message for raises CorruptEntryError, naming the session."""
    await store.append("chat-1", {"type": "reasoning", "summary": []})
    with pytest.raises(CorruptEntryError) as caught:
        await history.aget_messages()
    assert caught.value.session == "chat-1"


def test_the_sync_api_works_outside_an_event_loop(settings: Settings, tenant: str) -> None:
    """With no loop running, messages, add_messages and clear run on a private loop."""
    history = CtxstoreChatMessageHistory(
        "sync", ContextStore.from_settings(settings, tenant=tenant)
    )
    messages = every_kind()
    history.add_messages(messages[:4])
    history.add_message(messages[4])
    assert history.messages == messages[:5]
    with pytest.raises(InvalidMessageError):
        history.add_messages([HumanMessage("good"), RemoveMessage(id="m-1")])
    assert history.messages == messages[:5]
    history.clear()
    assert history.messages == []


async def test_the_sync_api_inside_a_running_loop_runs_on_a_worker_thread(
    history: CtxstoreChatMessageHistory,
) -> None:
    """Called from a coroutine, the sync API neither deadlocks nor breaks the async one."""
    await history.aadd_messages([HumanMessage("async first")])
    history.add_messages([AIMessage("sync second")])
    assert history.messages == [HumanMessage("async first"), AIMessage("sync second")]
    await history.aadd_messages([HumanMessage("async third")])
    assert len(await history.aget_messages()) == 3
    history.clear()
    assert await history.aget_messages() == []


def recording_chain(seen: list[list[BaseMessage]]) -> Any:
    """A fake chat model answering twice, behind a step recording each input."""
    model = GenericFakeChatModel(messages=iter([AIMessage("first answer"), AIMessage("second")]))

    def record(messages: list[BaseMessage]) -> list[BaseMessage]:
        seen.append(list(messages))
        return messages

    return RunnableLambda(record) | model


@RUNNABLE_DEPRECATED
async def test_runnable_with_message_history_remembers_the_first_turn(store: ContextStore) -> None:
    """Over two async turns, the second model call's input holds the first turn."""
    seen: list[list[BaseMessage]] = []
    chain = RunnableWithMessageHistory(
        recording_chain(seen), lambda session_id: CtxstoreChatMessageHistory(session_id, store)
    )
    config: Any = {"configurable": {"session_id": "conv"}}
    first = await chain.ainvoke([HumanMessage("hi, I am Ada")], config=config)
    await chain.ainvoke([HumanMessage("what is my name?")], config=config)
    assert seen[1] == [HumanMessage("hi, I am Ada"), first, HumanMessage("what is my name?")]
    stored = await CtxstoreChatMessageHistory("conv", store).aget_messages()
    assert [m.content for m in stored] == [
        "hi, I am Ada",
        "first answer",
        "what is my name?",
        "second",
    ]
    assert stored[1] == first  # the model's answer, id and metadata included


@RUNNABLE_DEPRECATED
async def test_runnable_with_message_history_takes_any_session_id(store: ContextStore) -> None:
    """A non-ASCII session id with spaces and a slash, as the caller gave it, keeps its turns."""
    seen: list[list[BaseMessage]] = []
    chain = RunnableWithMessageHistory(
        recording_chain(seen), lambda session_id: CtxstoreChatMessageHistory(session_id, store)
    )
    config: Any = {"configurable": {"session_id": "Łukasz / 会話 1"}}
    first = await chain.ainvoke([HumanMessage("hi, I am Łukasz")], config=config)
    await chain.ainvoke([HumanMessage("what is my name?")], config=config)
    assert seen[1] == [HumanMessage("hi, I am Łukasz"), first, HumanMessage("what is my name?")]
    stored = await CtxstoreChatMessageHistory("Łukasz / 会話 1", store).aget_messages()
    assert len(stored) == 4


@RUNNABLE_DEPRECATED
def test_runnable_with_message_history_in_sync_code(settings: Settings, tenant: str) -> None:
    """Over two sync turns (the sync API), the second model call's input holds the first turn."""
    store = ContextStore.from_settings(settings, tenant=tenant)
    seen: list[list[BaseMessage]] = []
    chain = RunnableWithMessageHistory(
        recording_chain(seen), lambda session_id: CtxstoreChatMessageHistory(session_id, store)
    )
    config: Any = {"configurable": {"session_id": "conv"}}
    first = chain.invoke([HumanMessage("hi, I am Ada")], config=config)
    chain.invoke([HumanMessage("what is my name?")], config=config)
    assert seen[1] == [HumanMessage("hi, I am Ada"), first, HumanMessage("what is my name?")]
    assert len(CtxstoreChatMessageHistory("conv", store).messages) == 4


async def test_the_view_sends_no_orphan_tool_call_and_fits_the_budget(
    history: CtxstoreChatMessageHistory, store: ContextStore
) -> None:
    """On a long history, the view is the store's: tool pairs whole, previews, within budget."""
    messages: list[BaseMessage] = [SystemMessage("You are a careful agent.")]
    for step in range(11):
        messages += exchange(step)
    messages += exchange(11, size=400)  # results over 1,000 tokens: previewed
    messages += exchange(12, size=400, blocks=True)
    messages += [
        ToolMessage("a result whose call is not in the history", tool_call_id="ghost"),
        HumanMessage("now read x and y"),
        AIMessage(
            "",
            tool_calls=[
                {"name": "read_file", "args": {"path": "x"}, "id": "call_x"},
                {"name": "read_file", "args": {"path": "y"}, "id": "call_y"},  # never answered
            ],
        ),
        ToolMessage("x's text", tool_call_id="call_x"),
    ]
    await history.aadd_messages(messages)
    budget = 3_000

    view = await history.aget_view(budget)

    sent = await store.view("chat-1", token_budget=budget)
    assert sent.stats.tokens <= budget
    assert "dropped unanswered call call_y" in sent.stats.repairs
    assert len(sent.stats.offloaded) == 4  # steps 11 and 12's results go as previews
    assert len(view) == len(sent.messages) < len(messages)
    assert [m.content for m in view] == [m["content"] for m in sent.messages]
    as_openai = convert_to_openai_messages(view)
    assert orphans(as_openai) == 0
    assert paired(as_openai) >= 3
    assert view[-2].tool_calls == [messages[-2].tool_calls[0]]  # call_y dropped
    previews = [m for m in view if "tool result are not shown" in str(m.content)]
    assert [type(m.content) for m in previews] == [str, str, list, list]


async def test_a_view_whose_system_messages_exceed_the_budget_raises(
    history: CtxstoreChatMessageHistory,
) -> None:
    """System messages alone over the budget: BudgetExceededError, not a silent overflow."""
    await history.aadd_messages([SystemMessage("be careful " * 200), HumanMessage("hi")])
    with pytest.raises(BudgetExceededError):
        await history.aget_view(50)


@pytest.mark.parametrize(("role", "kind"), [("user", HumanMessage), ("system", SystemMessage)])
async def test_the_summary_comes_back_as_a_message_of_its_role(
    summary_settings: Settings, tenant: str, role: str, kind: type[BaseMessage]
) -> None:
    """The view's summary is a HumanMessage (summary_role user) or a SystemMessage."""
    settings = summary_settings.model_copy(update={"summary_role": role})
    async with ContextStore.from_settings(settings, tenant=tenant) as store:
        history = CtxstoreChatMessageHistory("long", store)
        for step in range(12):
            await history.aadd_messages(exchange(step))
        assert (await store.summarize("long", FakeSummarizer())).status == "committed"
        view = await history.aget_view(1_500)
    summaries = [m for m in view if str(m.content).startswith("<summary>")]
    assert len(summaries) == 1
    assert type(summaries[0]) is kind
    assert paired(convert_to_openai_messages(view)) >= 1


async def test_from_url_opens_and_closes_a_store_of_its_own(
    settings: Settings, tenant: str
) -> None:
    """A history from a URL works on its own store, closed with it."""
    assert settings.redis_url is not None
    async with CtxstoreChatMessageHistory.from_url(
        "own", url=settings.redis_url, tenant=tenant, settings=settings
    ) as history:
        await history.aadd_messages([HumanMessage("hi")])
        assert await history.aget_messages() == [HumanMessage("hi")]


@pytest.mark.parametrize("mutation", ["add", "clear"])
async def test_a_cancelled_write_is_settled_before_the_cancellation(
    history: CtxstoreChatMessageHistory, monkeypatch: pytest.MonkeyPatch, mutation: str
) -> None:
    """Cancelling aadd_messages or aclear waits for the write's outcome, then raises."""
    first = [HumanMessage("one", id="m1"), AIMessage("two", id="m2")]
    await history.aadd_messages(first)
    started, release = asyncio.Event(), asyncio.Event()
    name = {"add": "append_many", "clear": "clear"}[mutation]
    original = getattr(history.store, name)

    async def held(*args: Any, **kwargs: Any) -> Any:
        started.set()
        await release.wait()
        return await original(*args, **kwargs)

    monkeypatch.setattr(history.store, name, held)
    later = HumanMessage("three", id="m3")
    call = (lambda: history.aadd_messages([later])) if mutation == "add" else history.aclear
    task = asyncio.create_task(call())
    await started.wait()
    task.cancel()
    await asyncio.sleep(0)  # the cancellation is delivered while the write is held
    assert not task.done()
    release.set()
    with pytest.raises(asyncio.CancelledError):
        await task
    expected = [*first, later] if mutation == "add" else []
    assert await history.aget_messages() == expected


# -- recall tools ----------------------------------------------------------------------


async def test_recall_tools_run_as_langchain_tools(history: CtxstoreChatMessageHistory) -> None:
    """The tools' schemas reach LangChain; ainvoke runs them; bad input is a tool error."""
    planted = await history.store.append(
        history.store_session_id, {"role": "user", "content": "Our Zurich office opens at 07:45."}
    )
    tools = {tool.name: tool for tool in history.recall_tools()}
    assert list(tools) == ["search_history", "read_entry", "pin_message", "unpin_message"]
    assert tools["search_history"].args["query"]["type"] == "string"
    found = await tools["search_history"].ainvoke({"query": "Zurich office opens"})
    assert planted.entry_id in found and "07:45" in found
    read = await tools["read_entry"].ainvoke({"entry_id": planted.entry_id})
    assert read == f"entry {planted.entry_id} (user):\nOur Zurich office opens at 07:45."
    refused = await tools["read_entry"].ainvoke({"entry_id": "../../etc"})
    assert refused.startswith("error: ")
    await tools["pin_message"].ainvoke({"entry_id": planted.entry_id})
    assert (await history.store.info(history.store_session_id)).pinned == (planted.entry_id,)
