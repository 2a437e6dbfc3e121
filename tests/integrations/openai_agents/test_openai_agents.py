"""The OpenAI Agents SDK session: the SDK's session checks, Responses items, real runs.

The basic checks are adapted from the SDK's own session tests (SQLiteSession,
RedisSession): add, get, pop and clear, limits, isolation, odd characters,
concurrent writers, session settings. Runs drive a real ``agents.Agent``
with the SDK's scripted model, so no network is needed.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Callable
from typing import Any

import pytest

pytest.importorskip("agents")

from agents import Agent, RunConfig, Runner, function_tool
from agents.memory import Session, SessionSettings
from agents.testing import ScriptedModel, assistant_message, function_call
from support.helpers import paired

from ctxstore import (
    BudgetExceededError,
    ContextStore,
    InvalidIdError,
    InvalidInputError,
    InvalidMessageError,
    Settings,
)
from ctxstore.integrations import openai_agents
from ctxstore.integrations.openai_agents import CtxstoreSession

NO_TRACING = RunConfig(tracing_disabled=True)


@pytest.fixture
def session(store: ContextStore) -> CtxstoreSession:
    """A session over this test's store and tenant."""
    return CtxstoreSession("conv-1", store)


def texts(items: list[Any]) -> list[Any]:
    """The ``content`` of each item (plain messages)."""
    return [item.get("content") for item in items]


def numbered(count: int, start: int = 0) -> list[dict[str, Any]]:
    """``count`` user messages "Message i", from ``start``."""
    return [{"role": "user", "content": f"Message {i}"} for i in range(start, start + count)]


def output_message(text: str, item_id: str = "msg_1") -> dict[str, Any]:
    """An assistant message item as the SDK stores a model's answer."""
    return {
        "id": item_id,
        "type": "message",
        "role": "assistant",
        "status": "completed",
        "content": [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}],
    }


def call_item(call_id: str, name: str = "read_file", arguments: str = "{}") -> dict[str, Any]:
    """A Responses function_call item."""
    return {
        "id": f"fc_{call_id}",
        "type": "function_call",
        "call_id": call_id,
        "name": name,
        "arguments": arguments,
        "status": "completed",
    }


def output_item(call_id: str, output: str = "42") -> dict[str, Any]:
    """The function_call_output item answering ``call_id``."""
    return {"type": "function_call_output", "call_id": call_id, "output": output}


def reasoning_item(item_id: str) -> dict[str, Any]:
    """A Responses reasoning item (its encrypted content stands for the real thing)."""
    return {
        "id": item_id,
        "type": "reasoning",
        "summary": [{"type": "summary_text", "text": "Look the files up first."}],
        "encrypted_content": "gAAAA-opaque",
    }


# -- the protocol -------------------------------------------------------------


def test_is_an_sdk_session(session: CtxstoreSession) -> None:
    """It satisfies the SDK's runtime-checkable Session protocol, every method async."""
    assert isinstance(session, Session)
    for name in ("get_items", "add_items", "pop_item", "clear_session", "get_view"):
        assert inspect.iscoroutinefunction(getattr(session, name)), name
    assert session.session_id == "conv-1"


def test_session_settings_default_and_forms(store: ContextStore) -> None:
    """Settings default to an empty SessionSettings; a dict is coerced; a typo is refused."""
    assert isinstance(CtxstoreSession("s", store).session_settings, SessionSettings)
    assert CtxstoreSession("s", store).session_settings.limit is None
    from_dict = CtxstoreSession("s", store, session_settings={"limit": 0}).session_settings
    assert isinstance(from_dict, SessionSettings)
    assert from_dict.limit == 0
    with pytest.raises(InvalidInputError, match="Unknown session settings: limitt"):
        CtxstoreSession("s", store, session_settings={"limitt": 1})


def test_an_empty_session_id_is_refused_at_construction(store: ContextStore) -> None:
    """An empty session id (almost always a missing one) is refused before any call."""
    with pytest.raises(InvalidIdError):
        CtxstoreSession("", store)


async def test_any_session_id_is_a_session_of_its_own(store: ContextStore) -> None:
    """Ids the store would refuse (slashes, colons, non-ASCII) hold their own items."""
    ids = ["user:../other", "会話 7", "user/other", "_.euser"]
    for n, session_id in enumerate(ids):
        await CtxstoreSession(session_id, store).add_items([{"role": "user", "content": str(n)}])
    for n, session_id in enumerate(ids):
        items = await CtxstoreSession(session_id, store).get_items()
        assert items == [{"role": "user", "content": str(n)}], session_id


# -- add, get, pop, clear --------------------------------------------------------


async def test_add_get_pop_clear(session: CtxstoreSession) -> None:
    """Items come back in order; pop takes the newest; clear leaves nothing."""
    await session.add_items([{"role": "user", "content": "Hello"}])
    await session.add_items([{"role": "assistant", "content": "Hi there!"}])
    assert texts(await session.get_items()) == ["Hello", "Hi there!"]

    popped = await session.pop_item()
    assert popped == {"role": "assistant", "content": "Hi there!"}
    assert texts(await session.get_items()) == ["Hello"]

    await session.clear_session()
    assert await session.get_items() == []
    assert await session.pop_item() is None


async def test_pop_takes_newest_first_then_none(session: CtxstoreSession) -> None:
    """Pops return the items newest first, then None, and leave the session empty."""
    assert await session.pop_item() is None  # never written
    await session.add_items(numbered(3))
    assert [await session.pop_item() for _ in range(4)] == [*reversed(numbered(3)), None]
    assert await session.get_items() == []


async def test_add_empty_list_is_a_no_op(session: CtxstoreSession) -> None:
    """Adding no items writes nothing."""
    await session.add_items([])
    assert await session.get_items() == []
    assert not (await session.store.info(session.session_id)).exists


async def test_a_non_dict_item_is_refused_and_nothing_is_written(
    session: CtxstoreSession,
) -> None:
    """A batch with a non-dict item raises InvalidMessageError naming it; none is stored."""
    await session.add_items(numbered(1))
    with pytest.raises(InvalidMessageError, match="message 1: a message must be a dict") as info:
        await session.add_items([{"role": "user", "content": "fine"}, "not an item"])
    assert info.value.index == 1
    assert info.value.session == session.session_id
    with pytest.raises(InvalidMessageError, match="call_id"):
        await session.add_items([{"type": "function_call", "name": "f", "arguments": "{}"}])
    assert await session.get_items() == numbered(1)


# -- limits -----------------------------------------------------------------------


async def test_get_items_limit(session: CtxstoreSession) -> None:
    """A limit returns the newest items, oldest first; more than stored returns all; 0 none."""
    await session.add_items(numbered(6))
    assert texts(await session.get_items(limit=2)) == ["Message 4", "Message 5"]
    assert texts(await session.get_items(limit=4)) == [f"Message {i}" for i in range(2, 6)]
    assert await session.get_items(limit=10) == numbered(6)
    assert await session.get_items(limit=0) == []
    assert await session.get_items(limit=50_000) == numbered(6)  # over what one read returns


@pytest.mark.parametrize("limit", [-1, 2.5, True, "3"])
async def test_a_limit_that_is_not_a_count_is_refused(
    session: CtxstoreSession, limit: object
) -> None:
    """A negative, fractional, boolean or string limit raises InvalidInputError."""
    await session.add_items(numbered(2))
    with pytest.raises(InvalidInputError, match="limit must be None or an integer"):
        await session.get_items(limit=limit)


async def test_session_settings_limit_applies_without_a_limit(store: ContextStore) -> None:
    """get_items() uses session_settings.limit; an explicit limit overrides it."""
    session = CtxstoreSession("settings", store, session_settings=SessionSettings(limit=3))
    await session.add_items(numbered(10))
    assert texts(await session.get_items()) == ["Message 7", "Message 8", "Message 9"]
    assert texts(await session.get_items(limit=2)) == ["Message 8", "Message 9"]
    session.session_settings = None  # the protocol allows it: then everything
    assert await session.get_items() == numbered(10)


async def test_a_limit_over_one_read_reads_the_history(
    session: CtxstoreSession, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Past the most one tail read returns, the newest items still come back, all of them."""
    monkeypatch.setattr(openai_agents, "_TAIL_LIMIT", 4)
    await session.add_items(numbered(10))
    assert await session.get_items(limit=6) == numbered(6, start=4)
    assert await session.get_items(limit=3) == numbered(3, start=7)
    assert await session.get_items(limit=11) == numbered(10)


async def test_a_limited_read_is_bounded(
    session: CtxstoreSession, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With 5,000 items stored, get_items(limit=5) reads a handful of stream entries."""
    for start in range(0, 5_000, 500):
        await session.add_items(numbered(500, start=start))
    connection = session.store._connection
    original = connection.transaction
    rows_read = 0

    async def counting(commands: Any, **kwargs: Any) -> list[Any]:
        nonlocal rows_read
        replies = await original(commands, **kwargs)
        for command, reply in zip(commands, replies, strict=True):
            if command[0] in ("XRANGE", "XREVRANGE"):
                rows_read += len(reply)
        return replies

    monkeypatch.setattr(connection, "transaction", counting)
    assert await session.get_items(limit=5) == numbered(5, start=4_995)
    assert 0 < rows_read < 50
    rows_read = 0
    assert len(await session.get_items()) == 5_000  # the count sees a full read
    assert rows_read >= 5_000


# -- what is stored -----------------------------------------------------------------


async def test_responses_items_round_trip_exactly(session: CtxstoreSession) -> None:
    """Function calls, their outputs, reasoning and output_text messages come back equal."""
    items = [
        {"role": "user", "content": "What is in main.py?"},
        reasoning_item("rs_1"),
        call_item("call_1", arguments='{"path": "main.py"}'),
        output_item("call_1", "print('hi')"),
        {
            "type": "message",
            "role": "user",
            "content": [{"type": "input_text", "text": "and tests?"}],
        },
        call_item("call_2"),
        output_item("call_2", ""),
        output_message("It prints hi; there are no tests."),
    ]
    await session.add_items(items)
    assert await session.get_items() == items
    assert await session.get_items(limit=3) == items[-3:]
    assert await session.pop_item() == items[-1]
    assert await session.get_items() == items[:-1]


async def test_unicode_and_special_characters_round_trip(session: CtxstoreSession) -> None:
    """Non-ASCII text, quotes, JSON-looking and escape-laden strings are stored as given."""
    items = [
        {"role": "user", "content": "こんにちは"},
        {"role": "assistant", "content": "😊👍"},
        {"role": "user", "content": "Привет"},
        {"role": "user", "content": "O'Reilly"},
        {"role": "assistant", "content": '{"nested": "json"}'},
        {"role": "user", "content": 'Quote: "Hello world"'},
        {"role": "assistant", "content": "Line1\nLine2\tTabbed"},
        {"role": "user", "content": "Robert'); DROP TABLE students;--"},
        {"role": "assistant", "content": "\\n\\t\\r Special escapes \x1e\x00"},
    ]
    await session.add_items(items)
    assert await session.get_items() == items
    assert await session.pop_item() == items[-1]


async def test_sessions_are_isolated(store: ContextStore) -> None:
    """Two sessions, and one session id under two tenants, never see each other's items."""
    first, second = CtxstoreSession("one", store), CtxstoreSession("two", store)
    other_tenant = CtxstoreSession("one", store.for_tenant(f"{store.tenant}-b"))
    await first.add_items(numbered(1))
    await second.add_items(numbered(2, start=10))
    await other_tenant.add_items(numbered(1, start=20))
    assert await second.pop_item() == numbered(1, start=11)[0]
    assert await first.get_items() == numbered(1)
    assert await second.get_items() == numbered(1, start=10)
    await first.clear_session()
    assert await other_tenant.get_items() == numbered(1, start=20)
    assert await second.get_items() == numbered(1, start=10)


async def test_concurrent_add_items_keep_every_item(store: ContextStore) -> None:
    """Batches added from many tasks (and sessions) at once are all kept, each one whole."""
    batches = [numbered(20, start=100 * task) for task in range(10)]
    sessions = [CtxstoreSession("shared", store) for _ in batches]
    await asyncio.gather(*(s.add_items(b) for s, b in zip(sessions, batches, strict=True)))
    stored = await sessions[0].get_items()
    assert len(stored) == 200
    starts = [stored.index(batch[0]) for batch in batches]
    for start, batch in zip(starts, batches, strict=True):
        assert stored[start : start + 20] == batch  # contiguous and in order


# -- cancellation ---------------------------------------------------------------------


@pytest.mark.parametrize("mutation", ["add", "pop", "clear"])
async def test_a_cancelled_write_is_settled_before_the_cancellation(
    session: CtxstoreSession, monkeypatch: pytest.MonkeyPatch, mutation: str
) -> None:
    """Cancelling a write waits for its outcome, then raises CancelledError: it was applied."""
    await session.add_items(numbered(2))
    started, release = asyncio.Event(), asyncio.Event()
    name = {"add": "append_many", "pop": "pop", "clear": "clear"}[mutation]
    original = getattr(session.store, name)

    async def held(*args: Any, **kwargs: Any) -> Any:
        started.set()
        await release.wait()
        return await original(*args, **kwargs)

    monkeypatch.setattr(session.store, name, held)
    calls: dict[str, Callable[[], Any]] = {
        "add": lambda: session.add_items(numbered(1, start=2)),
        "pop": session.pop_item,
        "clear": session.clear_session,
    }
    task = asyncio.create_task(calls[mutation]())
    await started.wait()
    task.cancel()
    await asyncio.sleep(0)
    task.cancel()
    await asyncio.sleep(0)
    assert not task.done()
    release.set()
    with pytest.raises(asyncio.CancelledError):
        await task
    expected = {"add": numbered(3), "pop": numbered(1), "clear": []}[mutation]
    assert await session.get_items() == expected


# -- real runs -------------------------------------------------------------------------


@function_tool
def add(a: int, b: int) -> str:
    """Add two integers."""
    return str(a + b)


async def run(agent: Agent[Any], text: str, session: CtxstoreSession, method: str) -> Any:
    """Run ``agent`` on ``text`` with ``session``, by ``Runner.run`` or to a drained stream."""
    if method == "run":
        return await Runner.run(agent, text, session=session, run_config=NO_TRACING)
    streamed = Runner.run_streamed(agent, text, session=session, run_config=NO_TRACING)
    async for _ in streamed.stream_events():
        pass
    return streamed


@pytest.mark.parametrize("method", ["run", "run_streamed"])
async def test_runner_keeps_two_turns_with_a_tool_call(
    session: CtxstoreSession, method: str
) -> None:
    """A real Agent run stores input, tool call, output and answer; turn 2 sees turn 1."""
    model = ScriptedModel(
        [
            [function_call("add", {"a": 2, "b": 3}, call_id="call_add")],
            [assistant_message("2 + 3 = 5", item_id="msg_turn1")],
            [assistant_message("It was 5.", item_id="msg_turn2")],
        ]
    )
    agent = Agent(name="calculator", model=model, tools=[add])

    assert (await run(agent, "What is 2 + 3?", session, method)).final_output == "2 + 3 = 5"
    assert (await run(agent, "What was it?", session, method)).final_output == "It was 5."
    model.assert_complete()

    stored = await session.get_items()
    assert [item.get("type") or item.get("role") for item in stored] == [
        "user",
        "function_call",
        "function_call_output",
        "message",
        "user",
        "message",
    ]
    assert stored[0]["content"] == "What is 2 + 3?"
    assert stored[1]["call_id"] == stored[2]["call_id"] == "call_add"
    assert stored[1]["name"] == "add"
    assert stored[2]["output"] == "5"
    assert stored[3]["content"][0]["text"] == "2 + 3 = 5"
    assert stored[4]["content"] == "What was it?"
    assert stored[5]["content"][0]["text"] == "It was 5."

    assert model.calls[2].input == stored[:5]  # the first turn's items, then the question


async def test_runner_honors_session_and_run_settings_limits(store: ContextStore) -> None:
    """The session's limit bounds the history a run sends; RunConfig's overrides it."""
    session = CtxstoreSession("limited", store, session_settings=SessionSettings(limit=2))
    await session.add_items(numbered(6))
    model = ScriptedModel([[assistant_message("one")], [assistant_message("two")]])
    agent = Agent(name="limited", model=model)

    await Runner.run(agent, "Next", session=session, run_config=NO_TRACING)
    assert texts(model.calls[0].input) == ["Message 4", "Message 5", "Next"]

    override = RunConfig(tracing_disabled=True, session_settings=SessionSettings(limit=0))
    await Runner.run(agent, "Alone", session=session, run_config=override)
    assert texts(model.calls[1].input) == ["Alone"]
    assert len(await session.get_items(limit=100)) == 10


# -- the budgeted view --------------------------------------------------------------------


def tool_session(turns: int) -> list[dict[str, Any]]:
    """A long agent session in Responses items: reasoning, parallel calls, long outputs."""
    items: list[dict[str, Any]] = []
    for turn in range(turns):
        items.append({"role": "user", "content": f"step {turn}: inspect the repository"})
        if turn % 2 == 0:
            ids = [f"call_{turn}_{i}" for i in range(2)]
            items.append(reasoning_item(f"rs_{turn}"))
            items += [call_item(cid, arguments=f'{{"path": "f{cid}.py"}}') for cid in ids]
            items += [output_item(cid, f"contents of {cid} " * 25) for cid in ids]
        items.append(output_message(f"done with step {turn}", item_id=f"msg_{turn}"))
    return items


def has_orphans(items: list[dict[str, Any]]) -> bool:
    """True when ``items`` hold a call without its output, or an output without its call."""
    try:
        paired(items)
    except AssertionError:
        return True
    return False


async def test_a_view_of_a_long_tool_session_has_no_orphan_calls(
    session: CtxstoreSession,
) -> None:
    """At every budget the view keeps calls and outputs together, where a plain cut would not."""
    history = tool_session(40)
    for turn in range(0, len(history), 7):  # a batch per add, cutting across exchanges
        await session.add_items(history[turn : turn + 7])
    assert await session.get_items() == history
    tokens = [stored.tokens for stored in await session.store.tail("conv-1", len(history))]

    def plain_cut(budget: int) -> list[dict[str, Any]]:
        """The newest items whose stored tokens fit ``budget``, cut anywhere."""
        kept, total = 0, 0
        for count in reversed(tokens):
            if total + count > budget:
                break
            kept, total = kept + 1, total + count
        return history[len(history) - kept :]

    budgets = range(120, 3_000, 53)
    plain_orphans = 0
    for budget in budgets:
        view = await session.get_view(budget)
        assert 0 < len(view) < len(history)
        paired(view)  # raises on an orphan call or output
        assert all(item in history for item in view)  # no summary yet: items as stored
        stats = (await session.store.view("conv-1", token_budget=budget)).stats
        plain_orphans += has_orphans(plain_cut(stats.budget_cl100k))
    assert plain_orphans > len(budgets) // 4  # the budgets do fall inside tool exchanges
    assert paired(await session.get_view(3_000)) > 0


async def test_a_view_over_budget_raises(session: CtxstoreSession) -> None:
    """When system items alone exceed the budget, get_view raises BudgetExceededError."""
    await session.add_items(
        [{"role": "system", "content": "rule " * 400}, *numbered(3)],
    )
    with pytest.raises(BudgetExceededError) as info:
        await session.get_view(100)
    assert info.value.budget == 100
    assert info.value.required > 100
    assert numbered(3)[-1] in await session.get_view(5_000)


# -- lifecycle ------------------------------------------------------------------------------


async def test_from_url_owns_its_store(
    redis_url: str, settings: Settings, tenant: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """from_url builds a working session whose store is closed with it; a given one is not."""
    closed: list[str] = []
    async with CtxstoreSession.from_url(
        "own", url=redis_url, tenant=tenant, settings=settings
    ) as owned:
        await owned.add_items(numbered(1))
        assert owned.store.tenant == tenant
        original = owned.store.aclose

        async def recording() -> None:
            closed.append("owned")
            await original()

        monkeypatch.setattr(owned.store, "aclose", recording)
    assert closed == ["owned"]

    async with ContextStore.from_settings(settings, tenant=tenant) as store:
        given_close = store.aclose

        async def refused() -> None:
            closed.append("given")
            await given_close()

        monkeypatch.setattr(store, "aclose", refused)
        async with CtxstoreSession("own", store) as given:
            assert await given.get_items() == numbered(1)  # the same tenant and session
        assert closed == ["owned"]
    assert closed == ["owned", "given"]  # closed by its owner, on leaving its block


# -- recall tools ----------------------------------------------------------------------


async def test_an_agent_searches_and_reads_its_history_through_the_recall_tools(
    session: CtxstoreSession,
) -> None:
    """A real run: the scripted model calls search_history and read_entry, gets the fact."""
    planted = await session.store.append(
        session.session_id, {"role": "user", "content": "The vault combination is 31-07-1966."}
    )
    await session.add_items([{"role": "user", "content": f"filler {i}"} for i in range(50)])
    tools = session.recall_tools()
    assert [t.name for t in tools] == [
        "search_history",
        "read_entry",
        "pin_message",
        "unpin_message",
    ]
    model = ScriptedModel(
        [
            [function_call("search_history", {"query": "vault combination"}, call_id="c1")],
            [function_call("read_entry", {"entry_id": planted.entry_id}, call_id="c2")],
            [function_call("read_entry", {"entry_id": "not-an-id"}, call_id="c3")],
            [assistant_message("It is 31-07-1966.", item_id="msg_done")],
        ]
    )
    agent = Agent(name="recaller", model=model, tools=tools)
    result = await Runner.run(
        agent, "What is the vault combination?", session=session, run_config=NO_TRACING
    )
    assert result.final_output == "It is 31-07-1966."
    outputs = {
        item["call_id"]: item["output"]
        for item in await session.get_items()
        if item.get("type") == "function_call_output"
    }
    assert planted.entry_id in outputs["c1"] and "31-07-1966" in outputs["c1"]
    assert (
        outputs["c2"] == f"entry {planted.entry_id} (user):\nThe vault combination is 31-07-1966."
    )
    assert outputs["c3"].startswith("error: ") and "not an entry id" in outputs["c3"]
