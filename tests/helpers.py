"""Conversations for tests: realistic shapes, built deterministically."""

from __future__ import annotations

from typing import Any


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
