"""Recall tools: definitions in three schemas, an executor that never raises for model input."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from support.helpers import user

from ctxstore import ContextStore, RecallTools, Settings
from ctxstore.errors import InvalidIdError, InvalidInputError
from ctxstore.recall import READ_CHARS, TOOL_NAMES
from ctxstore.summarizers import LocalSummarizer

FACT = "The escrow account for the Lisbon office is PT50-0002-0123-1234-5678-9015-4."


async def test_definitions_in_the_three_schemas(store: ContextStore) -> None:
    """Chat, Responses and Anthropic definitions name the same tools with the same schema."""
    tools = RecallTools(store, "s")
    chat, responses, anthropic = tools.openai_chat(), tools.openai_responses(), tools.anthropic()
    assert [t["function"]["name"] for t in chat] == list(TOOL_NAMES)
    assert [t["name"] for t in responses] == [t["name"] for t in anthropic] == list(TOOL_NAMES)
    for c, r, a in zip(chat, responses, anthropic, strict=True):
        assert c["type"] == r["type"] == "function"
        assert c["function"]["parameters"] == r["parameters"] == a["input_schema"]
        assert a["input_schema"]["type"] == "object" and a["input_schema"]["required"]
        assert c["function"]["description"] == r["description"] == a["description"]
    only = RecallTools(store, "s", names=("search_history", "read_entry"))
    assert [t["name"] for t in only.anthropic()] == ["search_history", "read_entry"]
    with pytest.raises(InvalidInputError):
        RecallTools(store, "s", names=("drop_table",))
    with pytest.raises(InvalidIdError):
        RecallTools(store, "bad}id")


async def test_search_then_read_then_pin(store: ContextStore) -> None:
    """The happy path: a match names its entry, read_entry gives it whole, pin keeps it."""
    ids = [r.entry_id for r in await store.append_many("s", [user("hello"), user(FACT)])]
    tools = RecallTools(store, "s")
    found = await tools.execute("search_history", json.dumps({"query": "Lisbon escrow account"}))
    assert not found.is_error and ids[1] in found.text and "1 match," in found.text
    read = await tools.execute("read_entry", {"entry_id": ids[1]})
    assert read.text == f"entry {ids[1]} (user):\n{FACT}"
    pinned = await tools.execute("pin_message", json.dumps({"entry_id": ids[1]}))
    assert not pinned.is_error and (await store.info("s")).pinned == (ids[1],)
    await tools.execute("unpin_message", {"entry_id": ids[1]})
    assert (await store.info("s")).pinned == ()
    none = await tools.execute("search_history", {"query": "kangaroo"})
    assert not none.is_error and none.text.startswith("No entry")


async def test_long_entries_are_read_a_page_at_a_time(store: ContextStore) -> None:
    """An offloaded tool result comes back whole, in pages that say where the next starts."""
    body = "".join(f"row {i}: value {i * 7}\n" for i in range(2_000))
    await store.append(
        "s",
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "dump", "arguments": "{}"}}
            ],
        },
    )
    result = await store.append("s", {"role": "tool", "tool_call_id": "c1", "content": body})
    view = await store.view("s", token_budget=2_000)
    preview = next(m for m in view.messages if m.get("role") == "tool")["content"]
    assert "read_entry" in preview and result.entry_id in preview  # the note names the tool
    tools = RecallTools(store, "s")
    pages, offset = [], 0
    while True:
        page = await tools.execute("read_entry", {"entry_id": result.entry_id, "offset": offset})
        assert not page.is_error
        text = page.text.split(":\n", 1)[1]
        more = re.search(r"\n\[\d+ more characters: read_entry offset=(\d+)\]$", text)
        pages.append(text[: more.start()] if more else text)
        if not more:
            break
        offset = int(more.group(1))
        assert len(pages[-1]) == READ_CHARS
    assert "".join(pages) == body


@pytest.mark.parametrize(
    ("name", "arguments", "says"),
    [
        ("read_entry", '{"entry_id": "x"}', "is not an entry id"),
        ("read_entry", '{"entry_id": "1-0"}', "no entry 1-0"),
        ("read_entry", "{not json", "are not JSON"),
        ("read_entry", "[1, 2]", "must be a JSON object"),
        ("read_entry", "{}", "'entry_id' is missing"),
        ("read_entry", '{"entry_id": 5}', "must be a string"),
        ("read_entry", '{"entry_id": "1-0", "offset": -4}', "offset must be 0 or more"),
        ("read_entry", '{"entry_id": "1-0", "sql": "drop"}', "takes no argument 'sql'"),
        ("search_history", json.dumps({"query": "q" * 5_000}), "at most 2000 characters"),
        ("search_history", '{"query": "   "}', "the query is empty"),
        ("search_history", '{"query": "a", "limit": 500}', "limit must be 1 to 20"),
        ("search_history", '{"query": "a", "limit": true}', "must be a number"),
        ("search_history", '"' + "a" * 20_000 + '"', "over 16384 bytes"),
        ("pin_message", '{"entry_id": "99-0"}', "no entry 99-0"),
        ("delete_everything", "{}", "unknown tool 'delete_everything'"),
        (None, "{}", "unknown tool"),
    ],
)
async def test_bad_calls_get_a_tool_error_not_an_exception(
    store: ContextStore, name: Any, arguments: str, says: str
) -> None:
    """Whatever the model sends, the executor answers with an error the model can read."""
    await store.append("s", user("something"))
    outcome = await RecallTools(store, "s").execute(name, arguments)
    assert outcome.is_error and outcome.text.startswith("error: ") and says in outcome.text
    assert "tenant=" not in outcome.text and "key=" not in outcome.text


async def test_a_foreign_id_never_reaches_another_session_or_tenant(store: ContextStore) -> None:
    """Ids from another session or tenant find nothing here: the executor is bound to one."""
    await store.append("mine", user("my own note"))
    theirs = await store.append("theirs", user("the other session's secret: heliotrope"))
    other_tenant = store.for_tenant(store.tenant + "-x")
    foreign = await other_tenant.append("mine", user("another tenant's secret: obsidian"))
    tools = RecallTools(store, "mine")
    for entry_id in (theirs.entry_id, foreign.entry_id):
        outcome = await tools.execute("read_entry", {"entry_id": entry_id})
        # Stream ids are per stream: the same id may name one of this session's own
        # entries (appended in the same millisecond), never theirs.
        assert "heliotrope" not in outcome.text and "obsidian" not in outcome.text
        assert ("no entry" in outcome.text) if outcome.is_error else ("my own note" in outcome.text)
        await tools.execute("pin_message", {"entry_id": entry_id})
    for query in ("heliotrope secret", "obsidian secret"):
        outcome = await tools.execute("search_history", {"query": query})
        assert outcome.text == f"No entry of this conversation matches {query!r}."
    assert (await store.info("theirs")).pinned == ()
    assert (await other_tenant.info("mine")).pinned == ()


async def test_a_store_failure_is_a_tool_error(settings: Settings, tenant: str) -> None:
    """Redis down: the tool says so; the agent loop goes on."""
    down = settings.model_copy(
        update={"redis_url": "redis://127.0.0.1:1/0", "redis_cluster": False, "retry_attempts": 0}
    )
    async with ContextStore.from_settings(down, tenant=tenant) as store:
        outcome = await RecallTools(store, "s").execute("search_history", {"query": "anything"})
    assert outcome.is_error and "could not be reached" in outcome.text


async def test_run_answers_each_format_in_its_own(store: ContextStore) -> None:
    """A Chat tool call, a Responses item and an Anthropic block get results in their format."""
    entry = await store.append("s", user(FACT))
    tools = RecallTools(store, "s")
    chat = await tools.run(
        {
            "id": "call_1",
            "type": "function",
            "function": {
                "name": "read_entry",
                "arguments": json.dumps({"entry_id": entry.entry_id}),
            },
        }
    )
    assert chat == {
        "role": "tool",
        "tool_call_id": "call_1",
        "content": f"entry {entry.entry_id} (user):\n{FACT}",
    }
    item = await tools.run(
        {
            "type": "function_call",
            "call_id": "fc_1",
            "name": "search_history",
            "arguments": '{"query": "escrow"}',
        }
    )
    assert item is not None and item["type"] == "function_call_output"
    assert item["call_id"] == "fc_1" and entry.entry_id in item["output"]
    block = await tools.run(
        {"type": "tool_use", "id": "tu_1", "name": "read_entry", "input": {"entry_id": "7-0"}}
    )
    assert block is not None and block["is_error"] is True and block["tool_use_id"] == "tu_1"
    assert await tools.run({"type": "tool_use", "id": "x", "name": "weather", "input": {}}) is None
    assert await tools.run("not a call") is None
    # The results are messages the store accepts as they are.
    await store.append_many("s", [chat, item])


async def test_a_scripted_model_recovers_a_fact_the_view_compacted_away(
    summary_settings: Settings, tenant: str
) -> None:
    """End to end: the view lost the fact; the model searches, reads, and has it back."""
    async with ContextStore.from_settings(summary_settings, tenant=tenant) as store:
        await store.append("s", {"role": "system", "content": "You are a finance assistant."})
        await store.append("s", user("List our accounts, please."))
        call = {"id": "c0", "type": "function", "function": {"name": "accounts", "arguments": "{}"}}
        await store.append("s", {"role": "assistant", "content": None, "tool_calls": [call]})
        rows = [f"office-{i},GB{i:02d}-4000-{i:04d}" for i in range(60)]
        rows.insert(37, "lisbon-escrow,PT50-0002-0123-1234-5678-9015-4")
        table = "office,account\n" + "\n".join(rows)
        fact = await store.append("s", {"role": "tool", "tool_call_id": "c0", "content": table})
        for i in range(400):
            await store.append("s", user(f"turn {i}: reconcile ledger batch {i} for the audit"))
        await store.summarize("s", LocalSummarizer())
        view = await store.view("s", token_budget=1_500)
        sent = json.dumps(view.messages)
        assert "PT50-0002" not in sent  # compacted away
        assert "search_history" in sent  # the summary names the tool that reaches it

        tools = RecallTools(store, "s")
        transcript = [*view.messages, user("What is the Lisbon escrow account number?")]

        def model(messages: list[dict[str, Any]]) -> dict[str, Any]:
            """A scripted model: search, then read the best match, then answer from it."""
            last = messages[-1]
            if last["role"] == "user":
                arguments = json.dumps({"query": "Lisbon escrow account"})
                name = "search_history"
            elif "matches, best first" in last["content"] or "match, best" in last["content"]:
                entry_id = re.search(r"- entry (\S+) ", last["content"]).group(1)  # type: ignore[union-attr]
                arguments, name = json.dumps({"entry_id": entry_id}), "read_entry"
            else:
                line = next(r for r in last["content"].splitlines() if "escrow" in r)
                return {"role": "assistant", "content": line}
            call = {"id": f"call_{len(messages)}", "type": "function"}
            call["function"] = {"name": name, "arguments": arguments}  # type: ignore[assignment]
            return {"role": "assistant", "content": None, "tool_calls": [call]}

        for _ in range(3):
            reply = model(transcript)
            transcript.append(reply)
            if not reply.get("tool_calls"):
                break
            result = await tools.run(reply["tool_calls"][0])
            assert result is not None
            transcript.append(result)
        assert transcript[-1] == {
            "role": "assistant",
            "content": "lisbon-escrow,PT50-0002-0123-1234-5678-9015-4",
        }
        assert fact.entry_id in transcript[-4]["content"]  # search_history named the entry
