"""loop-basic's own tests, with ctxstore as the context its agent loop runs on.

Ported from microsoft/amplifier-module-loop-basic, version 1.0.0 at commit
937a53fadf8b1562a4383efbe56b9591f6e7b0e9: tests/test_behavioral.py,
tests/test_validation.py, tests/test_error_events.py,
tests/test_reasoning_effort.py and tests/test_thinking_block_leak.py, run
against amplifier-core 2.0.2.

Each assertion is kept as it is. Two constructions are swapped:

- the context under test, ``MockContextManager()`` (a list in memory), is a
  ctxstore ``StoreContextManager`` over the test Redis, under a key prefix
  of the test's own;
- loop-basic is not on the package index, so its orchestrator,
  ``BasicOrchestrator(config)``, is :class:`amplifier_loop.AgentLoop`,
  a loop written for these tests that adds and reads messages as loop-basic
  does (its docstring says how).

The structural test validates loop-basic's own package, which is not here.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

import pytest
from amplifier_core.events import PROVIDER_ERROR
from amplifier_core.llm_errors import (
    AuthenticationError,
    LLMError,
    ProviderUnavailableError,
    RateLimitError,
)
from amplifier_core.message_models import ChatRequest, ChatResponse, TextBlock
from amplifier_core.testing import EventRecorder
from amplifier_core.validation.behavioral import OrchestratorBehaviorTests
from amplifier_core.validation.structural import OrchestratorStructuralTests
from amplifier_loop import AgentLoop as BasicOrchestrator
from support.config import RUN_PREFIX

from ctxstore import ContextStore
from ctxstore.integrations.amplifier import StoreContextManager


@pytest.fixture
def store(pods: Callable[..., ContextStore]) -> ContextStore:
    """A store under a key prefix of this test's own, on the test Redis."""
    return pods(key_prefix=f"{RUN_PREFIX}-{uuid.uuid4().hex[:12]}")


@pytest.fixture
def new_context(store: ContextStore) -> Callable[[], StoreContextManager]:
    """Builds the context under test, where MockContextManager was: a session of its own."""
    return lambda: StoreContextManager(store, f"conv-{uuid.uuid4().hex[:12]}")


# --- tests/test_behavioral.py ----------------------------------------------------------------


class TestBasicOrchestratorBehavior(OrchestratorBehaviorTests):
    """amplifier-core's orchestrator contract, the loop running on a ctxstore context."""

    @pytest.fixture
    async def orchestrator_module(self) -> Any:
        """The orchestrator under test (loop-basic's mount gave its BasicOrchestrator)."""
        return BasicOrchestrator({})

    @pytest.fixture
    def mock_deps(
        self, mock_deps: tuple[Any, Any, Any, Any], new_context: Callable[[], StoreContextManager]
    ) -> tuple[Any, Any, Any, Any]:
        """The plugin's provider, tools and recorder; ctxstore's context for its mock one."""
        _, providers, tools, recorder = mock_deps
        return new_context(), providers, tools, recorder


# --- tests/test_validation.py ----------------------------------------------------------------


@pytest.mark.skip(
    reason="validates loop-basic's own package (its mount and module metadata), which is "
    "not installable here; ctxstore is the context, whose contract test_amplifier.py runs"
)
class TestLoopBasicOrchestratorStructural(OrchestratorStructuralTests):
    """amplifier-core's structural checks of an orchestrator package."""


# --- tests/test_error_events.py --------------------------------------------------------------


class ErrorProvider:
    """Provider that raises a configurable exception on complete()."""

    name = "error-provider"

    def __init__(self, error: Exception) -> None:
        self._error = error

    async def complete(self, request: Any, **kwargs: Any) -> Any:
        raise self._error


async def test_llm_error_enriches_provider_error_event(
    new_context: Callable[[], StoreContextManager],
) -> None:
    """LLMError populates retryable and status_code on PROVIDER_ERROR event."""
    error = RateLimitError(
        "Rate limit exceeded",
        provider="openai",
        status_code=429,
        retryable=True,
    )
    orchestrator = BasicOrchestrator({})
    provider = ErrorProvider(error)
    context = new_context()
    hooks = EventRecorder()

    with pytest.raises(RateLimitError):
        await orchestrator.execute(
            prompt="Test",
            context=context,
            providers={"default": provider},
            tools={},
            hooks=hooks,
        )

    # Find the PROVIDER_ERROR event
    error_events = hooks.get_events(PROVIDER_ERROR)
    assert len(error_events) == 1
    _, data = error_events[0]

    assert data["provider"] == "default"
    assert data["error"]["type"] == "RateLimitError"
    assert "Rate limit exceeded" in data["error"]["msg"]
    assert data["retryable"] is True
    assert data["status_code"] == 429


async def test_auth_error_not_retryable(new_context: Callable[[], StoreContextManager]) -> None:
    """AuthenticationError has retryable=False in event data."""
    error = AuthenticationError(
        "Invalid API key",
        provider="anthropic",
        status_code=401,
        retryable=False,
    )
    orchestrator = BasicOrchestrator({})
    provider = ErrorProvider(error)
    context = new_context()
    hooks = EventRecorder()

    with pytest.raises(AuthenticationError):
        await orchestrator.execute(
            prompt="Test",
            context=context,
            providers={"default": provider},
            tools={},
            hooks=hooks,
        )

    error_events = hooks.get_events(PROVIDER_ERROR)
    assert len(error_events) == 1
    _, data = error_events[0]

    assert data["retryable"] is False
    assert data["status_code"] == 401
    assert data["error"]["type"] == "AuthenticationError"


async def test_provider_unavailable_retryable(
    new_context: Callable[[], StoreContextManager],
) -> None:
    """ProviderUnavailableError has retryable=True (default) in event data."""
    error = ProviderUnavailableError(
        "Service unavailable",
        provider="gemini",
        status_code=503,
    )
    orchestrator = BasicOrchestrator({})
    provider = ErrorProvider(error)
    context = new_context()
    hooks = EventRecorder()

    with pytest.raises(ProviderUnavailableError):
        await orchestrator.execute(
            prompt="Test",
            context=context,
            providers={"default": provider},
            tools={},
            hooks=hooks,
        )

    error_events = hooks.get_events(PROVIDER_ERROR)
    assert len(error_events) == 1
    _, data = error_events[0]

    assert data["retryable"] is True
    assert data["status_code"] == 503


async def test_llm_error_with_none_status_code(
    new_context: Callable[[], StoreContextManager],
) -> None:
    """LLMError with no status_code still includes the field (as None)."""
    error = LLMError("Unknown error", provider="vllm", retryable=True)
    orchestrator = BasicOrchestrator({})
    provider = ErrorProvider(error)
    context = new_context()
    hooks = EventRecorder()

    with pytest.raises(LLMError):
        await orchestrator.execute(
            prompt="Test",
            context=context,
            providers={"default": provider},
            tools={},
            hooks=hooks,
        )

    error_events = hooks.get_events(PROVIDER_ERROR)
    assert len(error_events) == 1
    _, data = error_events[0]

    assert data["retryable"] is True
    assert data["status_code"] is None
    assert data["error"]["type"] == "LLMError"


async def test_generic_exception_no_retryable_field(
    new_context: Callable[[], StoreContextManager],
) -> None:
    """Generic Exception produces PROVIDER_ERROR without retryable/status_code."""
    error = RuntimeError("Something broke")
    orchestrator = BasicOrchestrator({})
    provider = ErrorProvider(error)
    context = new_context()
    hooks = EventRecorder()

    with pytest.raises(RuntimeError):
        await orchestrator.execute(
            prompt="Test",
            context=context,
            providers={"default": provider},
            tools={},
            hooks=hooks,
        )

    error_events = hooks.get_events(PROVIDER_ERROR)
    assert len(error_events) == 1
    _, data = error_events[0]

    assert data["provider"] == "default"
    assert data["error"]["type"] == "RuntimeError"
    assert "Something broke" in data["error"]["msg"]
    # Generic exceptions should NOT have retryable or status_code
    assert "retryable" not in data
    assert "status_code" not in data


async def test_llm_error_still_reraises(new_context: Callable[[], StoreContextManager]) -> None:
    """LLMError is re-raised after event emission (not swallowed)."""
    error = RateLimitError("Rate limit", provider="openai", status_code=429)
    orchestrator = BasicOrchestrator({})
    provider = ErrorProvider(error)
    context = new_context()
    hooks = EventRecorder()

    with pytest.raises(RateLimitError, match="Rate limit"):
        await orchestrator.execute(
            prompt="Test",
            context=context,
            providers={"default": provider},
            tools={},
            hooks=hooks,
        )


async def test_generic_exception_still_reraises(
    new_context: Callable[[], StoreContextManager],
) -> None:
    """Generic Exception is re-raised after event emission (not swallowed)."""
    error = ValueError("Bad value")
    orchestrator = BasicOrchestrator({})
    provider = ErrorProvider(error)
    context = new_context()
    hooks = EventRecorder()

    with pytest.raises(ValueError, match="Bad value"):
        await orchestrator.execute(
            prompt="Test",
            context=context,
            providers={"default": provider},
            tools={},
            hooks=hooks,
        )


class SimpleTool:
    name = "test_tool"
    description = "test"
    input_schema = {"type": "object", "properties": {}}

    async def execute(self, args: Any) -> Any:
        from amplifier_core import ToolResult

        return ToolResult(success=True, output="done")


async def test_max_iterations_fallback_llm_error_event(
    new_context: Callable[[], StoreContextManager],
) -> None:
    """LLMError in max-iterations fallback path emits enriched PROVIDER_ERROR."""
    orchestrator = BasicOrchestrator({"max_iterations": 1})
    context = new_context()
    hooks = EventRecorder()

    call_count = 0

    class ToolThenErrorProvider:
        """First call returns tool_calls, second call (fallback) raises LLMError."""

        name = "fallback-error"

        async def complete(self, request: Any, **kwargs: Any) -> Any:
            nonlocal call_count
            call_count += 1
            if call_count == 1:
                from amplifier_core.message_models import ToolCall

                return ChatResponse(
                    content=[TextBlock(text="Calling tool")],
                    tool_calls=[ToolCall(id="tc1", name="test_tool", arguments={"x": 1})],
                )
            # Fallback path raises LLMError
            raise ProviderUnavailableError(
                "Server down",
                provider="gemini",
                status_code=503,
            )

    # The fallback path catches exceptions without re-raising, so no pytest.raises
    await orchestrator.execute(
        prompt="Test",
        context=context,
        providers={"default": ToolThenErrorProvider()},
        tools={"test_tool": SimpleTool()},
        hooks=hooks,
    )

    # The fallback path should have emitted a PROVIDER_ERROR with LLMError fields
    error_events = hooks.get_events(PROVIDER_ERROR)
    assert len(error_events) >= 1

    # Find the enriched event (with retryable field)
    enriched = [e for e in error_events if "retryable" in e[1]]
    assert len(enriched) == 1
    _, data = enriched[0]

    assert data["retryable"] is True
    assert data["status_code"] == 503
    assert data["error"]["type"] == "ProviderUnavailableError"


async def test_max_iterations_fallback_generic_error_event(
    new_context: Callable[[], StoreContextManager],
) -> None:
    """Generic Exception in max-iterations fallback emits basic PROVIDER_ERROR."""
    orchestrator = BasicOrchestrator({"max_iterations": 1})
    context = new_context()
    hooks = EventRecorder()

    call_count = 0

    class ToolThenGenericErrorProvider:
        """First call returns tool_calls, second call raises generic error."""

        name = "fallback-generic"

        async def complete(self, request: Any, **kwargs: Any) -> Any:
            nonlocal call_count
            call_count += 1
            if call_count == 1:
                from amplifier_core.message_models import ToolCall

                return ChatResponse(
                    content=[TextBlock(text="Calling tool")],
                    tool_calls=[ToolCall(id="tc1", name="test_tool", arguments={"x": 1})],
                )
            raise RuntimeError("Unexpected failure")

    await orchestrator.execute(
        prompt="Test",
        context=context,
        providers={"default": ToolThenGenericErrorProvider()},
        tools={"test_tool": SimpleTool()},
        hooks=hooks,
    )

    error_events = hooks.get_events(PROVIDER_ERROR)
    assert len(error_events) >= 1

    # Find the generic error event (without retryable field)
    generic = [e for e in error_events if "retryable" not in e[1]]
    assert len(generic) == 1
    _, data = generic[0]

    assert data["error"]["type"] == "RuntimeError"
    assert "retryable" not in data
    assert "status_code" not in data


# --- tests/test_reasoning_effort.py ----------------------------------------------------------


def _make_text_response(text: str = "Mock response") -> ChatResponse:
    """Create a simple text ChatResponse."""
    return ChatResponse(content=[TextBlock(text=text)])


class MockProvider:
    """Mock provider that captures the ChatRequest it receives."""

    name = "mock"

    def __init__(self) -> None:
        self.last_request: Any = None
        self.last_kwargs: Any = None

    async def complete(self, request: Any, **kwargs: Any) -> Any:
        self.last_request = request
        self.last_kwargs = kwargs
        return _make_text_response()


async def test_reasoning_effort_high_on_chat_request(
    new_context: Callable[[], StoreContextManager],
) -> None:
    """Config reasoning_effort='high' flows to ChatRequest."""
    orchestrator = BasicOrchestrator({"reasoning_effort": "high"})
    provider = MockProvider()
    context = new_context()
    hooks = EventRecorder()

    await orchestrator.execute(
        prompt="Test",
        context=context,
        providers={"default": provider},
        tools={},
        hooks=hooks,
    )

    assert provider.last_request is not None
    assert isinstance(provider.last_request, ChatRequest)
    assert provider.last_request.reasoning_effort == "high"


async def test_reasoning_effort_low_on_chat_request(
    new_context: Callable[[], StoreContextManager],
) -> None:
    """Config reasoning_effort='low' flows to ChatRequest."""
    orchestrator = BasicOrchestrator({"reasoning_effort": "low"})
    provider = MockProvider()
    context = new_context()
    hooks = EventRecorder()

    await orchestrator.execute(
        prompt="Test",
        context=context,
        providers={"default": provider},
        tools={},
        hooks=hooks,
    )

    assert provider.last_request.reasoning_effort == "low"


async def test_reasoning_effort_medium_on_chat_request(
    new_context: Callable[[], StoreContextManager],
) -> None:
    """Config reasoning_effort='medium' flows to ChatRequest."""
    orchestrator = BasicOrchestrator({"reasoning_effort": "medium"})
    provider = MockProvider()
    context = new_context()
    hooks = EventRecorder()

    await orchestrator.execute(
        prompt="Test",
        context=context,
        providers={"default": provider},
        tools={},
        hooks=hooks,
    )

    assert provider.last_request.reasoning_effort == "medium"


async def test_no_reasoning_effort_defaults_to_none(
    new_context: Callable[[], StoreContextManager],
) -> None:
    """Without reasoning_effort in config, ChatRequest has None."""
    orchestrator = BasicOrchestrator({})
    provider = MockProvider()
    context = new_context()
    hooks = EventRecorder()

    await orchestrator.execute(
        prompt="Test",
        context=context,
        providers={"default": provider},
        tools={},
        hooks=hooks,
    )

    assert provider.last_request.reasoning_effort is None


async def test_extended_thinking_kwarg_still_passed(
    new_context: Callable[[], StoreContextManager],
) -> None:
    """extended_thinking kwarg is still passed for backward compat."""
    orchestrator = BasicOrchestrator({"extended_thinking": True})
    provider = MockProvider()
    context = new_context()
    hooks = EventRecorder()

    await orchestrator.execute(
        prompt="Test",
        context=context,
        providers={"default": provider},
        tools={},
        hooks=hooks,
    )

    assert provider.last_kwargs.get("extended_thinking") is True


async def test_reasoning_effort_and_extended_thinking_coexist(
    new_context: Callable[[], StoreContextManager],
) -> None:
    """Both reasoning_effort and extended_thinking can be set together."""
    orchestrator = BasicOrchestrator(
        {
            "reasoning_effort": "high",
            "extended_thinking": True,
        }
    )
    provider = MockProvider()
    context = new_context()
    hooks = EventRecorder()

    await orchestrator.execute(
        prompt="Test",
        context=context,
        providers={"default": provider},
        tools={},
        hooks=hooks,
    )

    assert provider.last_request.reasoning_effort == "high"
    assert provider.last_kwargs.get("extended_thinking") is True


async def test_reasoning_effort_on_max_iterations_fallback(
    new_context: Callable[[], StoreContextManager],
) -> None:
    """reasoning_effort is also set on the max-iterations fallback ChatRequest."""
    orchestrator = BasicOrchestrator(
        {
            "reasoning_effort": "high",
            "max_iterations": 1,
        }
    )
    context = new_context()
    hooks = EventRecorder()

    call_count = 0

    class ToolCallThenTextProvider:
        """First call returns tool_calls (consumes the iteration), fallback call returns text."""

        name = "mock"

        async def complete(self, request: Any, **kwargs: Any) -> Any:
            nonlocal call_count
            call_count += 1
            if call_count == 1:
                # Return tool calls to consume the single iteration
                from amplifier_core.message_models import ToolCall

                return ChatResponse(
                    content=[TextBlock(text="Calling tool")],
                    tool_calls=[ToolCall(id="tc1", name="test_tool", arguments={"x": 1})],
                )
            # Second call is the max-iterations fallback - capture the request
            self.last_request = request
            self.last_kwargs = kwargs
            return _make_text_response("Final response")

    provider = ToolCallThenTextProvider()

    await orchestrator.execute(
        prompt="Test",
        context=context,
        providers={"default": provider},
        tools={"test_tool": SimpleTool()},
        hooks=hooks,
    )

    # The fallback path should have been triggered (call_count > 1)
    assert call_count == 2
    assert hasattr(provider, "last_request")
    assert provider.last_request.reasoning_effort == "high"


# --- tests/test_thinking_block_leak.py -------------------------------------------------------


def _orch() -> BasicOrchestrator:
    return BasicOrchestrator({})


def _make_fake_response(blocks: list[Any]) -> Any:
    """Create a fake provider response with the given content blocks."""

    class FakeResponse:
        content = blocks
        tool_calls = None
        usage = None
        content_blocks = None
        metadata = None

    return FakeResponse()


class FakeProvider:
    """Mock provider that returns a pre-configured response."""

    name = "mock-thinking"

    def __init__(self, response: Any) -> None:
        self._response = response

    async def complete(self, request: Any, **kwargs: Any) -> Any:
        return self._response


async def test_thinking_content_does_not_leak_into_final_content(
    new_context: Callable[[], StoreContextManager],
) -> None:
    """content_models.ThinkingContent has .text — must be filtered by type check."""
    from amplifier_core.content_models import TextContent, ThinkingContent

    orchestrator = _orch()
    context = new_context()
    hooks = EventRecorder()

    response = _make_fake_response(
        [
            ThinkingContent(text="internal reasoning"),
            TextContent(text="real response"),
        ]
    )
    provider = FakeProvider(response)

    result = await orchestrator.execute(
        prompt="Test",
        context=context,
        providers={"default": provider},
        tools={},
        hooks=hooks,
    )

    # Thinking text must NOT appear in the final content
    assert "internal reasoning" not in result, (
        f"Thinking text leaked into final_content: {result!r}"
    )
    # Only the TextContent payload should be present
    assert "real response" in result, f"Expected 'real response' in result but got: {result!r}"


async def test_thinking_block_does_not_leak_into_final_content(
    new_context: Callable[[], StoreContextManager],
) -> None:
    """message_models.ThinkingBlock has .thinking (not .text) — already safe."""
    from amplifier_core.message_models import TextBlock, ThinkingBlock

    orchestrator = _orch()
    context = new_context()
    hooks = EventRecorder()

    response = _make_fake_response(
        [
            ThinkingBlock(thinking="internal reasoning", signature="sig"),
            TextBlock(text="real response"),
        ]
    )
    provider = FakeProvider(response)

    result = await orchestrator.execute(
        prompt="Test",
        context=context,
        providers={"default": provider},
        tools={},
        hooks=hooks,
    )

    assert "internal reasoning" not in result, (
        f"ThinkingBlock content leaked into final_content: {result!r}"
    )
    assert "real response" in result, f"Expected 'real response' in result but got: {result!r}"


async def test_text_content_passes_through(
    new_context: Callable[[], StoreContextManager],
) -> None:
    """content_models.TextContent is included in final_content as expected."""
    from amplifier_core.content_models import TextContent

    orchestrator = _orch()
    context = new_context()
    hooks = EventRecorder()

    response = _make_fake_response([TextContent(text="hello from TextContent")])
    provider = FakeProvider(response)

    result = await orchestrator.execute(
        prompt="Test",
        context=context,
        providers={"default": provider},
        tools={},
        hooks=hooks,
    )

    assert result == "hello from TextContent", f"Unexpected result: {result!r}"


async def test_text_block_passes_through(new_context: Callable[[], StoreContextManager]) -> None:
    """message_models.TextBlock is included in final_content as expected."""
    from amplifier_core.message_models import TextBlock

    orchestrator = _orch()
    context = new_context()
    hooks = EventRecorder()

    response = _make_fake_response([TextBlock(text="hello from TextBlock")])
    provider = FakeProvider(response)

    result = await orchestrator.execute(
        prompt="Test",
        context=context,
        providers={"default": provider},
        tools={},
        hooks=hooks,
    )

    assert result == "hello from TextBlock", f"Unexpected result: {result!r}"


async def test_dict_text_block_passes_through(
    new_context: Callable[[], StoreContextManager],
) -> None:
    """Dict blocks with type='text' pass through correctly."""
    orchestrator = _orch()
    context = new_context()
    hooks = EventRecorder()

    response = _make_fake_response([{"type": "text", "text": "dict text block"}])
    provider = FakeProvider(response)

    result = await orchestrator.execute(
        prompt="Test",
        context=context,
        providers={"default": provider},
        tools={},
        hooks=hooks,
    )

    assert result == "dict text block", f"Unexpected result: {result!r}"


async def test_dict_thinking_block_is_filtered(
    new_context: Callable[[], StoreContextManager],
) -> None:
    """Dict blocks with type='thinking' are filtered out (consistency fix)."""
    orchestrator = _orch()
    context = new_context()
    hooks = EventRecorder()

    response = _make_fake_response(
        [
            {"type": "thinking", "text": "dict thinking block"},
            {"type": "text", "text": "dict real response"},
        ]
    )
    provider = FakeProvider(response)

    result = await orchestrator.execute(
        prompt="Test",
        context=context,
        providers={"default": provider},
        tools={},
        hooks=hooks,
    )

    assert "dict thinking block" not in result, (
        f"Dict thinking block leaked into final_content: {result!r}"
    )
    assert "dict real response" in result, (
        f"Expected 'dict real response' in result but got: {result!r}"
    )
