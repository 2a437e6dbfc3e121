"""Conversations for tests: realistic shapes, built deterministically."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ctxstore import ContextStore


def conversation(turns: int, *, tool_every: int = 3, parallel: int = 2) -> list[dict[str, Any]]:
    """A tool-using conversation: a system prompt, then user/assistant turns.

    Every ``tool_every``-th turn goes through ``parallel`` tool calls.
    """
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You are a careful agent."}]
    for turn in range(turns):
        messages.append({"role": "user", "content": f"step {turn}: inspect the repository"})
        if turn % tool_every == 0:
            calls = [
                {
                    "id": f"call_{turn}_{i}",
                    "type": "function",
                    "function": {"name": "read_file", "arguments": f'{{"path": "f{turn}_{i}.py"}}'},
                }
                for i in range(parallel)
            ]
            messages.append({"role": "assistant", "content": None, "tool_calls": calls})
            messages.extend(
                {"role": "tool", "tool_call_id": c["id"], "content": f"contents of {c['id']} " * 20}
                for c in calls
            )
        messages.append({"role": "assistant", "content": f"done with step {turn}"})
    return messages


def turn(i: int) -> dict[str, Any]:
    """Turn ``i`` of a plain conversation (38 cl100k tokens, no tool calls)."""
    role = "user" if i % 2 == 0 else "assistant"
    return {
        "role": role,
        "content": f"turn {i}: " + "the quick brown fox jumps over the lazy dog " * 3,
    }


async def append_until_due(store: ContextStore, session: str, start: int = 0) -> int:
    """Append turns from ``start`` until one raises the summary flag; return the next turn."""
    for i in range(start, start + 100):
        if (await store.append(session, turn(i))).summary_due:
            return i + 1
    raise AssertionError("no append raised the summary flag")
