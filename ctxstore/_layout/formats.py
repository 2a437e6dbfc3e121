"""Message formats: what a message calls, what it answers, and stream-id order.

One notion of a *tool exchange* serves every format the store keeps: a
message that makes tool calls, and the messages that answer those calls, are
paired by call id. These functions read the ids out of a message dict; the
append stores them beside the message, so the view never parses a message
to plan. The formats, mixed freely in one session:

- OpenAI Chat: ``tool_calls`` on an assistant message, ``role: tool``
  messages carrying ``tool_call_id``;
- Amplifier: the same, its calls written ``{"id", "tool", "arguments"}``
  and repeated as ``tool_call`` content blocks (an id written in both is
  one call); a ``tool_result`` block may name its call ``tool_call_id``;
- Anthropic Messages: ``tool_use`` and ``tool_result`` content blocks;
- OpenAI Responses items (the OpenAI Agents SDK's): items with a ``type`` and
  no ``role``. A call item (``function_call``, ``custom_tool_call``,
  ``computer_call``, ``shell_call``...) is answered by the item of the same
  type plus ``_output`` with its ``call_id`` (a ``local_shell_call_output``
  names it as ``id``); an ``mcp_approval_request`` by the
  ``mcp_approval_response`` naming its ``id``. Items the server runs itself
  (web and file search, code interpreter, MCP calls) are self-contained.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

__all__ = [
    "CALL_ITEMS",
    "REASONING",
    "REASONING_TIE",
    "RESULT_ITEMS",
    "Exchange",
    "call_ids",
    "earliest_callers",
    "entry_order",
    "item_type",
    "result_id",
    "result_ids",
]


class Exchange(Protocol):
    """Anything that makes and answers tool calls by id (a stored entry, say)."""

    @property
    def calls(self) -> tuple[str, ...]: ...

    @property
    def results(self) -> tuple[str, ...]: ...


CALL_ITEMS = frozenset(
    {
        "function_call",
        "custom_tool_call",
        "computer_call",
        "local_shell_call",
        "shell_call",
        "apply_patch_call",
        "program",
        "tool_search_call",
    }
)
"""Responses item types the client answers, each by ``<type>_output`` with its ``call_id``."""
RESULT_ITEMS = frozenset(f"{kind}_output" for kind in CALL_ITEMS)
APPROVAL_REQUEST, APPROVAL_RESPONSE = "mcp_approval_request", "mcp_approval_response"
REASONING = "reasoning"
"""A Responses reasoning item: it must be sent with the item that follows it."""
REASONING_TIE = "~reasoning:"
"""The prefix of the id a reasoning item "calls" and the item after it "answers" (an
exchange of their own, so that nothing cuts between them: ``ctxstore._plan.pairs.bind_ties``)."""


def item_type(message: dict[str, Any]) -> str | None:
    """A Responses item's ``type`` when the message is one (it has no ``role``), else None."""
    kind = message.get("type")
    return kind if "role" not in message and isinstance(kind, str) else None


def _client_side(message: dict[str, Any]) -> bool:
    """False for a tool search the server ran itself (its items are a record, not a call)."""
    return message.get("execution") != "server"


def call_ids(message: dict[str, Any]) -> list[str]:
    """The tool call ids a message makes, in any of the formats (a call written twice, once)."""
    kind = item_type(message)
    if kind is not None:
        if kind in CALL_ITEMS and _client_side(message):
            found = message.get("call_id")
        elif kind == APPROVAL_REQUEST:
            found = message.get("id")
        else:
            return []
        return [found] if isinstance(found, str) and found else []
    ids = [c["id"] for c in message.get("tool_calls") or () if isinstance(c, dict) and "id" in c]
    content = message.get("content")
    if isinstance(content, list):
        for b in content:
            if not isinstance(b, dict) or "id" not in b:
                continue
            block_type = b.get("type")
            # An Amplifier tool_call block repeats a call of tool_calls, or makes one.
            if block_type == "tool_use" or (block_type == "tool_call" and b["id"] not in ids):
                ids.append(b["id"])
    return ids


def result_id(block: Any) -> Any:
    """The call id a ``tool_result`` block answers (Anthropic's or Amplifier's), else None."""
    if not isinstance(block, dict) or block.get("type") != "tool_result":
        return None
    found = block.get("tool_use_id")
    return block.get("tool_call_id") if found is None else found


def result_ids(message: dict[str, Any]) -> list[str]:
    """The tool call ids a message answers, in any of the formats."""
    kind = item_type(message)
    if kind is not None:
        if kind in RESULT_ITEMS and _client_side(message):
            found = message.get("call_id")
            if found is None and kind == "local_shell_call_output":
                found = message.get("id")  # this one names the call it answers as its id
        elif kind == APPROVAL_RESPONSE:
            found = message.get("approval_request_id")
        else:
            return []
        return [found] if isinstance(found, str) and found else []
    ids = []
    if message.get("role") == "tool" and isinstance(message.get("tool_call_id"), str):
        ids.append(message["tool_call_id"])
    own = ids[:]  # a block answering the tool message's own call is that one answer
    content = message.get("content")
    if isinstance(content, list):
        ids.extend(rid for rid in map(result_id, content) if rid is not None and rid not in own)
    return ids


def entry_order(entry_id: str) -> tuple[int, int]:
    """Sort key of a stream entry id: (milliseconds, sequence)."""
    ms, _, seq = entry_id.partition("-")
    return int(ms), int(seq or 0)


def earliest_callers(entries: Sequence[Exchange]) -> list[int]:
    """For each index i, the earliest calling entry of any result at or after i.

    ``len(entries)`` where there is none; the list has one extra slot at the end.
    """
    owner: dict[str, int] = {}
    for index, entry in enumerate(entries):
        for cid in entry.calls:
            owner.setdefault(cid, index)
    earliest = [len(entries)] * (len(entries) + 1)
    for index in range(len(entries) - 1, -1, -1):
        low = earliest[index + 1]
        for rid in entries[index].results:
            caller = owner.get(rid)
            if caller is not None and caller < low:
                low = caller
        earliest[index] = low
    return earliest
