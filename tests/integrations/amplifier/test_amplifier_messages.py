"""The Amplifier adapter takes every message Amplifier's modules write, and gives it back.

The shapes are those of amplifier-core 2.0.2's message and content models and
of its orchestrators (loop-basic, loop-streaming, loop-events) and
context-simple: Amplifier's tool-call form, content blocks dumped or given as
objects, thinking as each writes it. Also the two context-simple options the
adapter offers, ``protected_recent`` and ``add_timestamps``.
"""

from __future__ import annotations

import math
import re
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import pytest
from amplifier_core.content_models import TextContent, ThinkingContent, ToolCallContent
from amplifier_core.message_models import (
    ImageBlock,
    Message,
    ReasoningBlock,
    RedactedThinkingBlock,
    TextBlock,
    ThinkingBlock,
    ToolCallBlock,
    ToolResultBlock,
)
from amplifier_core.testing import MockCoordinator
from support.config import RUN_PREFIX
from support.helpers import paired, turn

from ctxstore import (
    ConfigurationError,
    ContextStore,
    InvalidInputError,
    InvalidMessageError,
    RecallTools,
    count_message,
)
from ctxstore.integrations.amplifier import StoreContextManager, mount
from ctxstore.testing import ManualClock


@pytest.fixture(autouse=True)
def _store_env(monkeypatch: pytest.MonkeyPatch, redis_url: str) -> None:
    """mount() reads settings from the environment: point it at the test Redis."""
    monkeypatch.setenv("CTXSTORE_REDIS_URL", redis_url)
    monkeypatch.setenv("CTXSTORE_KEY_PREFIX", RUN_PREFIX)


@pytest.fixture
def new_context(store: ContextStore) -> Callable[..., StoreContextManager]:
    """Builds an adapter over a session of its own."""
    return lambda **options: StoreContextManager(store, f"s-{uuid.uuid4().hex[:12]}", **options)


def _thinking() -> ThinkingBlock:
    return ThinkingBlock(thinking="Read it first.", signature="EqQBCkYIBRgC", visibility="internal")


CONTENT_MODELS: dict[str, Any] = {
    "role": "assistant",
    "content": [
        ThinkingContent(text="Check the image.").to_dict(),
        TextContent(text="Here is the plot.").to_dict(),
    ],
    "thinking_block": None,
}
"""An answer of amplifier-core's content-models blocks, as their to_dict() gives them."""

WRITTEN = [
    # amplifier-core: a whole Message dumped (what hooks inject), context-simple's hook message
    Message(role="system", content="You are a careful agent.").model_dump(mode="json"),
    {"role": "system", "content": "Project notes.", "metadata": {"source": "hook"}},
    {"role": "user", "content": "Why does test_io fail?"},
    # loop-basic, an Anthropic answer: blocks model_dump()-ed, the calls in Amplifier's form
    {
        "role": "assistant",
        "content": [
            _thinking().model_dump(),
            TextBlock(text="Reading both.").model_dump(),
            ToolCallBlock(id="toolu_1", name="read", input={"path": "io.py"}).model_dump(),
            ToolCallBlock(id="toolu_2", name="grep", input={"q": "read_chunk"}).model_dump(),
        ],
        "tool_calls": [
            {"id": "toolu_1", "tool": "read", "arguments": {"path": "io.py"}},
            {"id": "toolu_2", "tool": "grep", "arguments": {"q": "read_chunk"}},
        ],
        "metadata": {"stop_reason": "tool_use"},
    },
    {"role": "tool", "tool_call_id": "toolu_1", "content": "def read_chunk(i): ..."},
    # loop-basic's result of a cancelled call
    {
        "role": "tool",
        "tool_call_id": "toolu_2",
        "content": '{"error": "Tool execution was cancelled by user", "cancelled": true}',
    },
    # loop-streaming: the thinking block kept beside the content; results named
    {
        "role": "assistant",
        "content": "Running the tests.",
        "tool_calls": [{"id": "toolu_3", "tool": "run_tests", "arguments": {}}],
        "thinking_block": _thinking().model_dump(),
    },
    {"role": "tool", "name": "run_tests", "tool_call_id": "toolu_3", "content": "1 failed"},
    # loop-events: the content empty, the calls written tool, arguments, id
    {
        "role": "assistant",
        "content": "",
        "tool_calls": [{"tool": "edit", "arguments": {"line": 12}, "id": "call_4"}],
    },
    # amplifier-core: a tool Message with a ToolResultBlock of its call, dumped whole
    Message(
        role="tool",
        tool_call_id="call_4",
        content=[ToolResultBlock(tool_call_id="call_4", output={"applied": True})],
    ).model_dump(mode="json"),
    CONTENT_MODELS,
    Message(
        role="user",
        content=[
            ImageBlock(source={"type": "base64", "media_type": "image/png", "data": "iVBORw0K"}),
            TextBlock(text="and this?"),
        ],
    ).model_dump(mode="json"),
    # OpenAI reasoning state and redacted thinking, as amplifier-core's models dump them
    {
        "role": "assistant",
        "content": [
            ReasoningBlock(content=["gAAAAB", "rs_1"], summary=[]).model_dump(mode="json"),
            RedactedThinkingBlock(data="EmwKAhgB").model_dump(mode="json"),
            TextBlock(text="Fixed.", visibility="user").model_dump(mode="json"),
        ],
    },
]


async def test_every_written_shape_comes_back_equal_and_paired(
    new_context: Callable[..., StoreContextManager],
) -> None:
    """Each shape is stored as written, returned equal, and sent whole with its pairs."""
    context = new_context()
    for message in WRITTEN:
        await context.add_message(message)
    assert await context.get_messages() == WRITTEN
    sent = await context.get_messages_for_request(token_budget=100_000)
    assert sent == WRITTEN
    assert paired(sent) == 4
    # loop-basic parses each into amplifier-core's Message; its models refuse only the
    # thinking of its content models (text, not thinking), from whatever context.
    parsed = [Message(**m).model_dump(mode="json") for m in sent if m != CONTENT_MODELS]
    assert len(parsed) == len(WRITTEN) - 1


async def test_blocks_given_as_objects_are_stored_as_their_dump(
    new_context: Callable[..., StoreContextManager],
) -> None:
    """Pydantic blocks are stored as model_dump(mode="json"), content-models ones as to_dict()."""
    context = new_context()
    models = [
        _thinking(),
        TextBlock(text="Reading."),
        ToolCallBlock(id="t1", name="read", input={}),
    ]
    events = [ThinkingContent(text="hm"), TextContent(text="Done."), ToolCallContent(id="t2")]
    called = {
        "role": "assistant",
        "content": models,
        "tool_calls": [{"id": "t1", "tool": "read", "arguments": {}}],
    }
    await context.add_message(called)
    await context.add_message({"role": "tool", "tool_call_id": "t1", "content": "text"})
    await context.add_message({"role": "assistant", "content": events[:2]})
    assert called["content"] == models  # the caller's message is not changed
    stored = await context.get_messages()
    assert stored[0]["content"] == [b.model_dump(mode="json") for b in models]
    assert stored[2]["content"] == [b.to_dict() for b in events[:2]]
    await context.set_messages([{"role": "user", "content": [TextContent(text="resumed")]}])
    assert await context.get_messages() == [
        {"role": "user", "content": [{"type": "text", "text": "resumed"}]}
    ]


@pytest.mark.parametrize(
    ("message", "says"),
    [
        ({"role": "assistant", "content": [object()]}, "JSON-serializable"),
        (
            {"role": "assistant", "content": "", "tool_calls": [{"id": "c", "tool": "read"}]},
            "needs its arguments (a dict)",
        ),
        (
            {"role": "assistant", "content": [ToolCallContent(id="", name="read")]},
            "content.0.tool_call.id",
        ),
        ({"role": "user", "content": "hi", "metadata": "not a dict"}, "metadata"),
    ],
)
async def test_what_is_not_json_or_not_a_message_is_refused_and_nothing_written(
    new_context: Callable[..., StoreContextManager], message: dict[str, Any], says: str
) -> None:
    """An object without a dump, a call without its arguments: InvalidMessageError, no entry."""
    context = new_context(add_timestamps=True)
    with pytest.raises(InvalidMessageError, match=re.escape(says)):
        await context.add_message(message)
    assert await context.get_messages() == []


async def test_the_recall_tools_run_an_amplifier_call(store: ContextStore) -> None:
    """RecallTools.run answers Amplifier's {"id", "tool", "arguments"} with a tool message."""
    await store.append("s", {"role": "user", "content": "The gate code is 4417."})
    tools = RecallTools(store, "s")
    call = {"id": "c1", "tool": "search_history", "arguments": {"query": "gate code"}}
    answer = await tools.run(call)
    assert answer is not None and (answer["role"], answer["tool_call_id"]) == ("tool", "c1")
    assert "4417" in answer["content"]
    assert await tools.run({"id": "c2", "tool": "bash", "arguments": {}}) is None


# -- add_timestamps ---------------------------------------------------------------------------


async def test_messages_are_stored_as_given_unless_timestamps_are_asked_for(
    store: ContextStore, clock: ManualClock
) -> None:
    """Off by default; on, metadata.timestamp is the store clock's time, one given is kept."""
    plain = StoreContextManager(store, "plain")
    await plain.add_message({"role": "user", "content": "hi"})
    assert await plain.get_messages() == [{"role": "user", "content": "hi"}]
    async with ContextStore.from_settings(store.settings, tenant=store.tenant, clock=clock) as own:
        stamped = StoreContextManager(own, "stamped", add_timestamps=True)
        given = {"role": "user", "content": "old", "metadata": {"timestamp": "then", "n": 1}}
        await stamped.add_message({"role": "user", "content": "hi", "metadata": None})
        await stamped.add_message(given)
        await stamped.set_messages(
            [*await stamped.get_messages(), {"role": "user", "content": "x"}]
        )
        at = datetime.fromtimestamp(clock.now_ms() / 1000, UTC).isoformat(timespec="milliseconds")
        assert await stamped.get_messages() == [
            {"role": "user", "content": "hi", "metadata": {"timestamp": at}},
            given,
            {"role": "user", "content": "x"},  # set_messages restores, and stamps nothing
        ]


# -- protected_recent -------------------------------------------------------------------------


async def _history(context: StoreContextManager) -> list[dict[str, Any]]:
    """Ten old turns, then a call with a long result and a question: the newest exchange."""
    newest = [
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"id": "c1", "tool": "read", "arguments": {"path": "io.py"}}],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "the file says " * 40},
        {"role": "user", "content": "so?"},
    ]
    for message in [*map(turn, range(10)), *newest]:
        await context.add_message(message)
    return newest


async def test_protected_recent_keeps_the_newest_exchange_the_budget_can_hold(
    new_context: Callable[..., StoreContextManager],
) -> None:
    """Compacting to the threshold would cut the newest exchange: the whole budget keeps it."""
    plain = new_context(max_tokens=300, compaction_threshold=0.5)
    newest = await _history(plain)
    counted = sum(count_message(plain.store.counter, m) for m in newest)
    assert 150 < counted <= 300  # over the threshold's share, within the budget
    assert (await plain.get_messages_for_request())[-3:] != newest

    kept = new_context(max_tokens=300, compaction_threshold=0.5, protected_recent=0.2)
    await _history(kept)
    sent = await kept.get_messages_for_request()
    assert sent[-3:] == newest
    assert kept.last_view is not None and kept.last_view.stats.tokens <= 300


async def test_protected_recent_never_takes_a_view_past_its_budget(
    new_context: Callable[..., StoreContextManager],
) -> None:
    """What the whole budget cannot hold is still left out: the budget always holds."""
    context = new_context(max_tokens=120, compaction_threshold=0.5, protected_recent=0.5)
    newest = await _history(context)
    sent = await context.get_messages_for_request()
    assert sent[-3:] != newest and paired(sent) == 0
    assert context.last_view is not None and context.last_view.stats.tokens <= 120


async def test_the_orchestrators_compaction_calls_leave_the_history_as_it_is(
    new_context: Callable[..., StoreContextManager],
) -> None:
    """should_compact() is False and compact() changes nothing, as context-simple answers them."""
    context = new_context(max_tokens=100)
    for message in map(turn, range(6)):
        await context.add_message(message)
    assert await context.should_compact() is False
    await context.compact()
    assert await context.get_messages() == list(map(turn, range(6)))


# -- config -----------------------------------------------------------------------------------


async def test_mount_passes_the_context_simple_options() -> None:
    """protected_recent and add_timestamps reach the mounted manager."""
    coordinator = MockCoordinator()
    cleanup = await mount(coordinator, {"protected_recent": 0.3, "add_timestamps": True})
    try:
        context = coordinator.mount_points["context"]
        assert (context.protected_recent, context.add_timestamps) == (0.3, True)
        await context.add_message({"role": "user", "content": "hi"})
        assert "timestamp" in (await context.get_messages())[0]["metadata"]
    finally:
        await cleanup()


BAD_OPTIONS = [
    {"protected_recent": "0.3"},
    {"protected_recent": True},
    {"protected_recent": -0.1},
    {"protected_recent": 1.5},
    {"protected_recent": math.nan},
    {"add_timestamps": "yes"},
    {"add_timestamps": 1},
]


@pytest.mark.parametrize("config", BAD_OPTIONS)
async def test_a_bad_option_is_a_configuration_error(config: dict[str, Any]) -> None:
    """A wrong type or range is refused by mount() with ConfigurationError."""
    with pytest.raises(ConfigurationError, match="invalid context-ctxstore config"):
        await mount(MockCoordinator(), config)


@pytest.mark.parametrize("options", BAD_OPTIONS)
def test_the_manager_refuses_a_bad_option(store: ContextStore, options: dict[str, Any]) -> None:
    """The manager itself refuses the same values with InvalidInputError."""
    with pytest.raises(InvalidInputError):
        StoreContextManager(store, "conv", **options)
