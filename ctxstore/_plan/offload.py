"""Previews of large tool results, made once at append.

A tool result over ``Settings.offload_threshold_tokens`` is stored whole, plus
a preview: its head and tail and a note saying how much was left out and
which history entry holds the full text (``ContextStore.get_entry``). Views
send the preview when the budget is short, and the full result when it fits.
The preview is counted here, so the read path never tokenizes.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from ctxstore._layout.codec import ENTRY_PLACEHOLDER
from ctxstore._layout.formats import RESULT_ITEMS, item_type, result_ids
from ctxstore.tokens import TokenCounter, count_message

__all__ = ["make_preview"]

_TEXT_PARTS = frozenset({"text", "input_text", "output_text"})
"""Content parts that hold text, in the three formats."""
_OMITTED = "@@ctxstore-omitted@@"
_MIN_KEEP = 16
"""Characters a shortened text keeps at each end, however many texts share the budget."""
_NOTE = (
    "\n\n[ctxstore: " + _OMITTED + " of {total} tokens of this tool result are not shown. "
    "The full result is entry " + ENTRY_PLACEHOLDER + " of this session's history "
    "(the read_entry tool returns it).]\n\n"
)


def make_preview(
    message: dict[str, Any],
    tokens: int,
    counter: TokenCounter,
    *,
    threshold: int,
    preview_tokens: int,
) -> tuple[bytes, int] | None:
    """Return a preview of a large tool result (JSON, tokens), or ``None``.

    ``None`` also when the preview would not be smaller than the message:
    then there is no preview, and the message is always sent whole.

    Args:
        message: The message as appended.
        tokens: Its token count.
        counter: The counter it was counted with.
        threshold: Messages up to this many tokens are not previewed.
        preview_tokens: About how many tokens of its results the preview
            keeps, in all (shared among the results of the message).
    """
    if threshold <= 0 or tokens <= threshold or not result_ids(message):
        return None
    texts = _result_texts(message)
    chars = sum(len(t) for t in texts)
    if not chars:
        return None
    # The preview's budget is the message's, shared among its result texts:
    # a text under its share is kept whole, and what it leaves over goes to
    # the longer ones. Each shortened text keeps its head and tail.
    allowance = _shares([len(t) for t in texts], int(preview_tokens * chars / tokens))
    note = _NOTE.format(total=tokens)
    position = iter(range(len(texts)))

    def shorten(text: str) -> str:
        keep = max(_MIN_KEEP, allowance[next(position)] // 2)
        if len(text) <= 2 * keep + len(note):
            return text  # within its share, or the note would cost what it saves
        return text[:keep] + note + text[-keep:]

    preview = _map_result_texts(message, shorten)
    counted = count_message(counter, preview)
    if counted >= tokens:
        return None  # nothing to gain: the message is sent whole, never "offloaded"
    omitted = tokens - counted
    data = json.dumps(preview, ensure_ascii=False, separators=(",", ":"))
    return data.replace(_OMITTED, str(omitted)).encode(), counted


def _shares(lengths: list[int], budget: int) -> list[int]:
    """Split ``budget`` characters among texts of these lengths (max-min fair)."""
    shares = [0] * len(lengths)
    left, count = budget, len(lengths)
    for index in sorted(range(len(lengths)), key=lengths.__getitem__):
        share = min(lengths[index], left // count)
        shares[index] = share
        left -= share
        count -= 1
    return shares


def _result_texts(message: dict[str, Any]) -> list[str]:
    found: list[str] = []

    def collect(text: str) -> str:
        found.append(text)
        return text

    _map_result_texts(message, collect)
    return found


def _map_result_texts(message: dict[str, Any], fn: Callable[[str], str]) -> dict[str, Any]:
    """Copy ``message`` with ``fn`` applied to the texts of its tool results."""

    def texts(value: Any) -> Any:
        if isinstance(value, str):
            return fn(value)
        if isinstance(value, list):
            return [
                {**b, "text": fn(b["text"])}
                if isinstance(b, dict)
                and b.get("type") in _TEXT_PARTS
                and isinstance(b.get("text"), str)
                else b
                for b in value
            ]
        return value

    if item_type(message) in RESULT_ITEMS and "output" in message:
        return {**message, "output": texts(message["output"])}  # an OpenAI Responses item
    content = message.get("content")
    if message.get("role") == "tool":
        return {**message, "content": texts(content)}
    if isinstance(content, list):
        return {
            **message,
            "content": [
                {**b, "content": texts(b.get("content"))}
                if isinstance(b, dict) and b.get("type") == "tool_result"
                else b
                for b in content
            ],
        }
    return message
