"""Token counting: once per message, cl100k offline, opaque payloads skipped."""

from __future__ import annotations

from ctxstore import TiktokenCounter, count_message
from ctxstore.testing import WordCounter
from ctxstore.tokens import IMAGE_TOKENS, MESSAGE_OVERHEAD, PART_OVERHEAD, safety_factor


def test_tiktoken_counts_cl100k_offline() -> None:
    """The bundled cl100k encoding counts without the network."""
    counter = TiktokenCounter()
    assert counter.count("hello world") == 2
    assert counter.count("") == 0


def test_message_count_includes_text_tools_and_overhead() -> None:
    """Text, tool names and arguments are counted, plus framing."""
    counter = WordCounter()
    message = {
        "role": "assistant",
        "content": "two words",
        "tool_calls": [
            {"id": "c", "type": "function", "function": {"name": "grep", "arguments": "a b"}}
        ],
    }
    # words: role 1, content 2, call id 1, name 1, arguments 2
    assert count_message(counter, message) == MESSAGE_OVERHEAD + PART_OVERHEAD + 7


def test_images_and_signatures_are_not_tokenized() -> None:
    """Base64 images are estimated and thinking signatures skipped."""
    counter = WordCounter()
    huge = "A " * 100_000
    message = {
        "role": "user",
        "content": [
            {
                "type": "image",
                "source": {"type": "base64", "media_type": "image/png", "data": huge},
            },
            {"type": "thinking", "thinking": "one", "signature": huge},
        ],
    }
    assert count_message(counter, message) < IMAGE_TOKENS + 50


def test_safety_factor_by_family() -> None:
    """A model name picks the first family it contains; otherwise 1.0."""
    factors = {"claude": 1.4, "gemini": 1.2}
    assert safety_factor(factors, "claude-opus-4") == 1.4
    assert safety_factor(factors, "models/GEMINI-2.5") == 1.2
    assert safety_factor(factors, "gpt-4o") == 1.0
    assert safety_factor(factors, None) == 1.0


def test_images_inside_a_tool_result_are_estimated_like_top_level_ones() -> None:
    """An image in a tool_result's content list costs the per-image estimate, not ~0."""
    counter = WordCounter()
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "x"}}
    text = {"type": "text", "text": "two words"}

    def result(*blocks: dict[str, object]) -> dict[str, object]:
        return {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": "c", "content": list(blocks)}],
        }

    without = count_message(counter, result(text))
    assert count_message(counter, result(text, image)) == without + IMAGE_TOKENS
    assert count_message(counter, result(image, text, image)) == without + 2 * IMAGE_TOKENS
    top = {"role": "user", "content": [image]}
    assert count_message(counter, result(image)) >= count_message(counter, top) - PART_OVERHEAD
