"""An agent loop shaped like Amplifier's reference orchestrator, and a plain-list context.

Amplifier's reference orchestrator (``amplifier-module-loop-basic``) is not
on the package index, so the tests ported from it, and the test that runs an
agent loop on ctxstore, drive :class:`AgentLoop` instead. It was written for
these tests from loop-basic's behaviour (1.0.0, at commit 937a53f); none of
its code is copied. What matters to a context is the same:

- the prompt is added as ``{"role": "user", "content": prompt}``;
- before each model call the loop asks ``get_messages_for_request(provider=...)``
  and builds amplifier-core's ``ChatRequest`` from the messages
  (``Message(**message)``), so what the context gives back must parse;
- an answer that calls tools is added first, as an assistant message whose
  ``content`` is the response's blocks (each ``block.model_dump()`` if it
  has one, else the block as it came: content-models blocks are
  dataclasses), whose ``tool_calls`` are ``{"id", "tool", "arguments"}``,
  and whose ``metadata`` is the response's, when it has some;
- the turn's calls then run in parallel, and their results are added in
  call order as ``{"role": "tool", "tool_call_id", "content"}``; a tool
  that raises, or is not there, gives an error text as its result;
- the final answer is added the same way, without ``tool_calls``;
- after ``max_iterations`` turns of calls, one more model call is made with a
  reminder appended to the request (not stored), and its answer is added.

It emits the events the ported tests read (``provider:request``,
``provider:error`` with an ``LLMError``'s ``retryable`` and ``status_code``,
``tool:pre``, ``tool:post``, ``tool:error``, ``orchestrator:complete``).

:class:`ListContext` is the context it is compared against: a plain list,
as context-simple keeps its history, every request given the whole of it.
"""

from __future__ import annotations

import asyncio
from typing import Any

from amplifier_core.events import (
    ORCHESTRATOR_COMPLETE,
    PROVIDER_ERROR,
    PROVIDER_REQUEST,
    TOOL_ERROR,
    TOOL_POST,
    TOOL_PRE,
)
from amplifier_core.llm_errors import LLMError
from amplifier_core.message_models import ChatRequest, Message, ToolSpec

REMINDER = (
    '<system-reminder source="orchestrator-loop-limit">\n'
    "You have reached the maximum number of iterations for this turn. "
    "Answer the user now.\n"
    "</system-reminder>"
)
"""What the loop appends to its last request when it runs out of iterations."""


class AgentLoop:
    """The loop (see the module): ``await AgentLoop(config).execute(...)`` runs one prompt.

    Args:
        config: ``max_iterations`` (-1, the default: no limit),
            ``reasoning_effort`` (put on every ``ChatRequest``) and
            ``extended_thinking`` (passed to ``complete`` as a keyword).
    """

    def __init__(self, config: dict[str, Any]) -> None:
        self.config = config
        self.max_iterations = int(config.get("max_iterations", -1))

    async def execute(
        self,
        prompt: str,
        context: Any,
        providers: dict[str, Any],
        tools: dict[str, Any],
        hooks: Any,
        coordinator: Any | None = None,
    ) -> str:
        """Run ``prompt`` to its final answer; return the answer's text."""
        await context.add_message({"role": "user", "content": prompt})
        name, provider = next(iter(providers.items()))
        final, iteration = "", 0
        while self.max_iterations == -1 or iteration < self.max_iterations:
            await hooks.emit(PROVIDER_REQUEST, {"provider": name, "iteration": iteration})
            messages = await context.get_messages_for_request(provider=provider)
            response = await self._complete(name, provider, messages, tools, hooks)
            calls = getattr(response, "tool_calls", None)
            if calls:
                await context.add_message(_answer(response, calls))
                results = await asyncio.gather(*(_run(call, tools, hooks) for call in calls))
                for call_id, output in results:
                    await context.add_message(
                        {"role": "tool", "tool_call_id": call_id, "content": output}
                    )
                iteration += 1
                continue
            if getattr(response, "content", None):
                final = _text(response.content)
                await context.add_message(_answer(response, None))
                break
            iteration += 1
        if self.max_iterations != -1 and iteration >= self.max_iterations and not final:
            final = await self._last_call(name, provider, context, tools, hooks, iteration)
        await hooks.emit(
            ORCHESTRATOR_COMPLETE,
            {"orchestrator": "loop-basic", "turn_count": iteration, "status": "success"},
        )
        return final

    async def _last_call(
        self, name: str, provider: Any, context: Any, tools: Any, hooks: Any, iteration: int
    ) -> str:
        """Out of iterations: one more call, the reminder appended; errors end it quietly."""
        await hooks.emit(
            PROVIDER_REQUEST, {"provider": name, "iteration": iteration, "max_reached": True}
        )
        messages = list(await context.get_messages_for_request(provider=provider))
        messages.append({"role": "user", "content": REMINDER})
        try:
            response = await self._complete(name, provider, messages, tools, hooks)
        except Exception:  # noqa: BLE001 - reported as provider:error; the loop ends there
            return ""
        if not getattr(response, "content", None):
            return ""
        await context.add_message(_answer(response, None))
        return _text(response.content)

    async def _complete(
        self, name: str, provider: Any, messages: list[dict[str, Any]], tools: Any, hooks: Any
    ) -> Any:
        """One model call; a failure is reported as ``provider:error`` and raised."""
        request = ChatRequest(
            messages=[Message(**message) for message in messages],
            tools=[
                ToolSpec(name=t.name, description=t.description, parameters=t.input_schema)
                for t in tools.values()
            ]
            or None,
            reasoning_effort=self.config.get("reasoning_effort"),
        )
        kwargs = {"extended_thinking": True} if self.config.get("extended_thinking") else {}
        try:
            return await provider.complete(request, **kwargs)
        except LLMError as exc:
            error = {"type": type(exc).__name__, "msg": str(exc)}
            await hooks.emit(
                PROVIDER_ERROR,
                {
                    "provider": name,
                    "error": error,
                    "retryable": exc.retryable,
                    "status_code": exc.status_code,
                },
            )
            raise
        except Exception as exc:
            error = {"type": type(exc).__name__, "msg": str(exc)}
            await hooks.emit(PROVIDER_ERROR, {"provider": name, "error": error})
            raise


def _field(call: Any, name: str, key: str) -> Any:
    """A tool call's field, from a ``ToolCall`` object or a dict a provider gave."""
    found = getattr(call, name, None)
    return call.get(key) if found is None and isinstance(call, dict) else found


def _answer(response: Any, calls: list[Any] | None) -> dict[str, Any]:
    """The assistant message the loop adds for ``response`` (see the module)."""
    content = response.content
    message: dict[str, Any] = {
        "role": "assistant",
        "content": (
            [b.model_dump() if hasattr(b, "model_dump") else b for b in content]
            if isinstance(content, list)
            else content or ""
        ),
    }
    if calls:
        message["tool_calls"] = [
            {
                "id": _field(call, "id", "id"),
                "tool": _field(call, "name", "tool"),
                "arguments": _field(call, "arguments", "arguments") or {},
            }
            for call in calls
        ]
    metadata = getattr(response, "metadata", None)
    if metadata:
        message["metadata"] = metadata
    return message


def _text(content: Any) -> str:
    """The answer's text: its text blocks only (thinking is the model's own)."""
    if not isinstance(content, list):
        return str(content)
    texts = []
    for block in content:
        kind = block.get("type") if isinstance(block, dict) else getattr(block, "type", None)
        kind = getattr(kind, "value", kind)  # a content-models block's type is an enum
        text = block.get("text") if isinstance(block, dict) else getattr(block, "text", None)
        if kind == "text" and text is not None:
            texts.append(text)
    return "\n\n".join(texts)


async def _run(call: Any, tools: dict[str, Any], hooks: Any) -> tuple[str, str]:
    """Run one call: ``(call id, result text)``; a failure is its result, never raised."""
    name = _field(call, "name", "tool")
    call_id = _field(call, "id", "id")
    arguments = _field(call, "arguments", "arguments") or {}
    await hooks.emit(TOOL_PRE, {"tool_name": name, "tool_input": arguments})
    tool = tools.get(name)
    if tool is None:
        message = f"Error: Tool '{name}' not found"
        await hooks.emit(TOOL_ERROR, {"tool_name": name, "error": {"msg": message}})
        return call_id, message
    try:
        result = await tool.execute(arguments)
    except Exception as exc:  # noqa: BLE001 - any failure of a tool is its call's result
        await hooks.emit(TOOL_ERROR, {"tool_name": name, "error": {"msg": str(exc)}})
        return call_id, f"Error executing tool: {exc}"
    await hooks.emit(TOOL_POST, {"tool_name": name, "tool_input": arguments})
    return call_id, result.get_serialized_output()


class ListContext:
    """Amplifier's context protocol over a plain list, every request given all of it."""

    def __init__(self) -> None:
        self.messages: list[Any] = []

    async def add_message(self, message: dict[str, Any]) -> None:
        """Append ``message`` as given."""
        self.messages.append(message)

    async def get_messages_for_request(
        self, token_budget: int | None = None, provider: Any | None = None
    ) -> list[Any]:
        """The whole history."""
        return list(self.messages)

    async def get_messages(self) -> list[Any]:
        """The whole history."""
        return list(self.messages)

    async def set_messages(self, messages: list[dict[str, Any]]) -> None:
        """Replace the history."""
        self.messages = list(messages)

    async def clear(self) -> None:
        """Drop every message."""
        self.messages = []
