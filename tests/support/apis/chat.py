"""Answers of a scripted OpenAI-compatible Chat Completions API, as the servers send them."""

from __future__ import annotations

from typing import Any

import httpx2

SUMMARY_TEXT = (
    "<ledger>\nTask: migrate the ctx service to PostgreSQL 16 (Priya Raman)\n"
    "Numbers: port: 8443\n</ledger>\n"
    "<narrative>\n- read /etc/ctx/app.yaml: port 8443\n</narrative>"
)


def completion_json(
    message: dict[str, Any] | None = None, finish_reason: str = "stop"
) -> dict[str, Any]:
    """A chat completion as OpenAI sends it, with one choice holding ``message``."""
    return {
        "id": "chatcmpl-B9MHDbslfkBeAs8l4bebGdFOJ6PeG",
        "object": "chat.completion",
        "created": 1_741_570_283,
        "model": "gpt-5-mini-2025-08-07",
        "choices": [
            {
                "index": 0,
                "message": message or {"role": "assistant", "content": SUMMARY_TEXT},
                "logprobs": None,
                "finish_reason": finish_reason,
            }
        ],
        "usage": {
            "prompt_tokens": 2095,
            "completion_tokens": 503,
            "total_tokens": 2598,
            "prompt_tokens_details": {"cached_tokens": 1792, "audio_tokens": 0},
        },
        "service_tier": "default",
    }


def ok(text: str = SUMMARY_TEXT) -> httpx2.Response:
    """A 200 whose one choice is an assistant message with ``text``."""
    return httpx2.Response(
        200,
        json=completion_json({"role": "assistant", "content": text, "refusal": None}),
        headers={"x-request-id": "req_7f3e"},
    )


def api_error(
    status: int,
    message: str,
    kind: str = "invalid_request_error",
    headers: dict[str, str] | None = None,
) -> httpx2.Response:
    """An error answer with OpenAI's error body (vLLM and LiteLLM send the same shape)."""
    return httpx2.Response(
        status,
        json={"error": {"message": message, "type": kind, "param": None, "code": None}},
        headers={"x-request-id": "req_1", **(headers or {})},
    )
