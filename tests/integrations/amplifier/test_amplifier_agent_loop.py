"""An Amplifier agent loop on ctxstore: what the model is sent, and what is stored.

The loop is :class:`amplifier_loop.AgentLoop`, shaped like
Amplifier's reference orchestrator loop-basic (not on the package index).
A scripted model answers two prompts over several turns: parallel tool calls,
a tool that fails and one that is not there, extended thinking with its
signature, a large tool result, and Anthropic-style answers as Amplifier's
Anthropic provider gives them (content blocks with ``tool_call`` blocks, and
``tool_calls``). Run on ctxstore and on a plain list (as context-simple keeps
its history), the model gets the same requests and the same history is
stored; on a budget too small for the history, ctxstore's views still never
send a call without its result.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

import pytest
from amplifier_core import ToolResult
from amplifier_core.message_models import (
    ChatResponse,
    TextBlock,
    ThinkingBlock,
    ToolCall,
    ToolCallBlock,
    Usage,
)
from amplifier_core.models import ProviderInfo
from amplifier_core.testing import EventRecorder
from amplifier_loop import AgentLoop, ListContext
from support.config import RUN_PREFIX
from support.helpers import paired

from ctxstore import ContextStore
from ctxstore.integrations.amplifier import StoreContextManager

PROMPTS = ["Why does test_io fail?", "Fix it, then check the other tests."]
BIG_FILE = "\n".join(f"line {i}: assert read_chunk({i}) == expected[{i}]" for i in range(900))


def _calls(*calls: tuple[str, str, dict[str, Any]]) -> dict[str, Any]:
    """An answer's calls as Amplifier's Anthropic provider gives them: blocks, and tool_calls."""
    return {
        "blocks": [ToolCallBlock(id=i, name=n, input=a) for i, n, a in calls],
        "tool_calls": [ToolCall(id=i, name=n, arguments=a) for i, n, a in calls],
    }


def _answer(*blocks: Any, calls: dict[str, Any] | None = None, **extra: Any) -> ChatResponse:
    usage = Usage(input_tokens=1_000, output_tokens=50, total_tokens=1_050)
    if calls is None:
        return ChatResponse(content=list(blocks), usage=usage, **extra)
    return ChatResponse(
        content=[*blocks, *calls["blocks"]], tool_calls=calls["tool_calls"], usage=usage, **extra
    )


def _thinking(text: str, n: int) -> ThinkingBlock:
    return ThinkingBlock(thinking=text, signature=f"sig-{n}-" + "Ab3" * 40, visibility="internal")


SCRIPT = [
    _answer(  # two calls in parallel
        _thinking("The failure is in test_io; find the test and read it.", 1),
        TextBlock(text="Looking for the test."),
        calls=_calls(
            ("toolu_01", "grep", {"pattern": "def test_read", "path": "tests"}),
            ("toolu_02", "read", {"path": "tests/test_io.py"}),
        ),
        metadata={"stop_reason": "tool_use"},
    ),
    _answer(  # a tool that raises
        _thinking("Run it to see the error.", 2),
        calls=_calls(("toolu_03", "run_tests", {"select": "test_io"})),
    ),
    _answer(
        _thinking("read_chunk is off by one.", 3),
        TextBlock(text="test_io fails because read_chunk skips the last byte."),
    ),
    _answer(  # a tool that is not there, beside one that is
        TextBlock(text="Editing, and looking for other callers."),
        calls=_calls(
            ("toolu_04", "edit", {"path": "io.py", "line": 12, "text": "end = size"}),
            ("toolu_05", "grep", {"pattern": "read_chunk(", "path": "."}),
        ),
    ),
    _answer(TextBlock(text="I could not edit io.py: no edit tool. The fix is end = size.")),
]


class ScriptedModel:
    """A provider whose answers are :data:`SCRIPT`, in order; it records each request."""

    name = "scripted"

    def __init__(self, window: int | None) -> None:
        self.requests: list[Any] = []
        self._window = window

    def get_info(self) -> ProviderInfo:
        defaults: dict[str, Any] = {"model": "claude-sonnet-4-5"}
        if self._window:
            defaults |= {"context_window": self._window, "max_output_tokens": 8_192}
        return ProviderInfo(id="scripted", display_name="Scripted", defaults=defaults)

    async def complete(self, request: Any, **kwargs: Any) -> ChatResponse:
        self.requests.append(request)
        return SCRIPT[len(self.requests) - 1]


class Tool:
    """A tool answering from ``answers`` by its first argument's value; ``None`` raises."""

    def __init__(self, name: str, answers: dict[str, str | None]) -> None:
        self.name, self.description = name, f"the {name} tool"
        self.input_schema = {"type": "object", "properties": {}}
        self._answers = answers

    async def execute(self, arguments: dict[str, Any]) -> ToolResult:
        answer = self._answers[next(iter(arguments.values()))]
        if answer is None:
            raise RuntimeError("collection failed: ImportError in conftest.py")
        return ToolResult(success=True, output=answer)


TOOLS = {
    "grep": Tool(
        "grep",
        {
            "def test_read": "tests/test_io.py:14:def test_read_chunk():",
            "read_chunk(": "io.py:30\ntests/test_io.py:15",
        },
    ),
    "read": Tool("read", {"tests/test_io.py": BIG_FILE}),
    "run_tests": Tool("run_tests", {"test_io": None}),
}


async def _run(context: Any, window: int | None = 200_000) -> tuple[list[Any], list[str]]:
    """Both prompts on ``context``: the requests the model got (as JSON) and the answers."""
    model = ScriptedModel(window)
    loop = AgentLoop({})
    answers = [
        await loop.execute(prompt, context, {"scripted": model}, TOOLS, EventRecorder())
        for prompt in PROMPTS
    ]
    assert len(model.requests) == len(SCRIPT)
    return [[m.model_dump(mode="json") for m in r.messages] for r in model.requests], answers


@pytest.fixture
def store(pods: Callable[..., ContextStore]) -> ContextStore:
    """A store under a key prefix of this test's own, on the test Redis."""
    return pods(key_prefix=f"{RUN_PREFIX}-{uuid.uuid4().hex[:12]}")


async def test_the_model_is_sent_and_the_store_keeps_what_a_plain_list_gives(
    store: ContextStore,
) -> None:
    """Within the budget, every request and the stored history equal a plain list's."""
    reference = ListContext()
    expected_requests, expected_answers = await _run(reference)
    context = StoreContextManager(store, "agent")
    requests, answers = await _run(context)
    assert answers == expected_answers
    assert requests == expected_requests
    assert await context.get_messages() == reference.messages
    assert context.last_view is not None and not context.last_view.stats.compacted


@pytest.mark.parametrize("max_tokens", [1_500, 600])
async def test_a_tight_budget_sends_every_call_with_its_result(
    store: ContextStore, max_tokens: int
) -> None:
    """Past the budget (the large result previewed, old turns dropped), calls keep their results."""
    reference = ListContext()
    whole, _ = await _run(reference, window=None)
    context = StoreContextManager(store, f"tight-{max_tokens}", max_tokens=max_tokens)
    requests, _ = await _run(context, window=None)
    for request in requests:
        paired(request)  # raises on a call without its result, or a result without its call
    assert paired(requests[-1][-3:]) == 2  # the newest exchange is sent whole
    assert requests != whole
    assert context.last_view is not None and context.last_view.stats.compacted
    assert await context.get_messages() == reference.messages
