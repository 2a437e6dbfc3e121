"""Answers of a scripted Anthropic Messages API, as the service sends them."""

from __future__ import annotations

from typing import Any

import httpx2

SUMMARY_TEXT = (
    "## Goal\n- Migrate the ctx service to PostgreSQL 16 (Priya Raman).\n"
    "## Tools\n- read_file(/etc/ctx/app.yaml): port 8443"
)


def message_json(content: list[dict[str, Any]], stop_reason: str = "end_turn") -> dict[str, Any]:
    """A Messages API answer as the service sends it."""
    return {
        "id": "msg_01XFDUDYJgAACzvnptvVoYEL",
        "type": "message",
        "role": "assistant",
        "model": "claude-haiku-4-5-20251001",
        "content": content,
        "stop_reason": stop_reason,
        "stop_sequence": None,
        "usage": {
            "input_tokens": 2095,
            "output_tokens": 503,
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": 1843,
        },
    }


def ok(text: str = SUMMARY_TEXT) -> httpx2.Response:
    """A 200 whose content is one text block."""
    return httpx2.Response(
        200,
        json=message_json([{"type": "text", "text": text}]),
        headers={"request-id": "req_011CQ"},
    )


def api_error(
    status: int, kind: str, message: str, headers: dict[str, str] | None = None
) -> httpx2.Response:
    """An error answer with the service's error body."""
    return httpx2.Response(
        status,
        json={"type": "error", "error": {"type": kind, "message": message}, "request_id": "req_1"},
        headers={"request-id": "req_1", **(headers or {})},
    )
