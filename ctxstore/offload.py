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

from ctxstore.policies import ENTRY_PLACEHOLDER
from ctxstore.tokens import TokenCounter, count_message

__all__ = ["make_preview"]

_OMITTED = "@@ctxstore-omitted@@"
_NOTE = (
    "\n\n[ctxstore: " + _OMITTED + " of {total} tokens of this tool result are not shown. "
    "The full result is entry " + ENTRY_PLACEHOLDER + " of this session's history.]\n\n"
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

    Args:
        message: The message as appended.
        tokens: Its token count.
        counter: The counter it was counted with.
        threshold: Messages up to this many tokens are not previewed.
        preview_tokens: About how many tokens the preview keeps.
    """
    if threshold <= 0 or tokens <= threshold or not _is_result(message):
        return None
    texts = _result_texts(message)
    chars = sum(len(t) for t in texts)
    if not chars:
        return None
    chars_per_token = chars / tokens
    keep = max(16, int(preview_tokens * chars_per_token / 2))
    note = _NOTE.format(total=tokens)

    def shorten(text: str) -> str:
        if len(text) <= 2 * keep:
            return text
        return text[:keep] + note + text[-keep:]

    preview = _map_result_texts(message, shorten)
    counted = count_message(counter, preview)
    omitted = max(0, tokens - counted)
    data = json.dumps(preview, ensure_ascii=False, separators=(",", ":"))
    return data.replace(_OMITTED, str(omitted)).encode(), counted


def _is_result(message: dict[str, Any]) -> bool:
    if message.get("role") == "tool":
        return True
    content = message.get("content")
    return isinstance(content, list) and any(
        isinstance(b, dict) and b.get("type") == "tool_result" for b in content
    )


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
                and b.get("type") == "text"
                and isinstance(b.get("text"), str)
                else b
                for b in value
            ]
        return value

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
